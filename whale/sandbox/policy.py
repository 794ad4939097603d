"""What a sandboxed run may do, and how its end is named. Pure: dataclasses and functions, no I/O.

Untrusted Python (model-written code for the math tool, proposer-written harness files) runs in a
separate process under :class:`Limits` (rlimits, a wall clock, a bounded in-memory scratch directory,
bounded output) and :class:`Isolation` (what the program may see: an allow-list of read-only paths and
third-party packages, and of environment variable names). :func:`classify` turns the way a process
ended into one :class:`Outcome`, so callers branch on a typed value instead of parsing stderr.
"""

from __future__ import annotations

import dataclasses
import enum
import re
import signal
from collections.abc import Mapping, Sequence
from typing import Literal, get_args

MiB = 1 << 20
GiB = 1 << 30

#: Environment names that look like credentials; never forwarded from the parent by name.
SECRET_NAME_RE = re.compile(r"(KEY|TOKEN|SECRET|PASSW|CREDENTIAL|AUTH|SESSION|COOKIE)", re.IGNORECASE)

#: Where the scratch directory (HOME, TMPDIR, cwd) is inside the sandbox.
SANDBOX_SCRATCH = "/scratch"
#: Where the egress proxy's Unix socket (:attr:`Isolation.egress_socket`) is inside the sandbox, and the port on
#: 127.0.0.1 where the sandbox's relay listens (its own network namespace: no other program's port to clash with)
SANDBOX_EGRESS_SOCKET = "/sandbox/egress.sock"
EGRESS_RELAY_PORT = 3128
#: what a sandbox with an egress proxy gets in its environment: every common spelling of "use this proxy", and no
#: exception (the relay is the only way out; a direct connection has no interface to leave by)
EGRESS_ENV = {
    **{name: f"http://127.0.0.1:{EGRESS_RELAY_PORT}" for name in ("HTTPS_PROXY", "HTTP_PROXY", "ALL_PROXY")},
    **{name: f"http://127.0.0.1:{EGRESS_RELAY_PORT}" for name in ("https_proxy", "http_proxy", "all_proxy")},
    "NO_PROXY": "",
    "no_proxy": "",
}
#: Where allow-listed third-party packages (:attr:`Isolation.packages`) are mounted inside the sandbox.
SANDBOX_SITE = "/sandbox/site"

#: Fixed environment every sandbox gets; HOME/TMPDIR are pointed at the scratch directory at launch.
BASE_ENV = {
    "PATH": "/usr/local/bin:/usr/bin:/bin",
    "LANG": "C.UTF-8",
    "LC_ALL": "C.UTF-8",
    "PYTHONDONTWRITEBYTECODE": "1",
    "PYTHONIOENCODING": "utf-8",
    "OMP_NUM_THREADS": "1",
    "OPENBLAS_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
    "TOKENIZERS_PARALLELISM": "false",
    "MPLBACKEND": "Agg",
}


class Outcome(str, enum.Enum):
    """How a sandboxed program (or one worker call) ended."""

    OK = "ok"
    ERROR = "error"  #: the program raised / exited non-zero on its own
    TIMEOUT = "timeout"  #: wall clock ran out; the whole process tree was killed
    CPU_LIMIT = "cpu_limit"  #: RLIMIT_CPU (SIGXCPU / SIGKILL at the hard limit)
    MEMORY_LIMIT = "memory_limit"  #: RLIMIT_AS hit (MemoryError, or killed while allocating)
    OUTPUT_LIMIT = "output_limit"  #: stdout/stderr grew past the cap; killed
    FILE_SIZE_LIMIT = "file_size_limit"  #: RLIMIT_FSIZE (SIGXFSZ)
    KILLED = "killed"  #: ended by another signal
    SANDBOX_ERROR = "sandbox_error"  #: the sandbox itself could not be set up

    @property
    def ok(self) -> bool:
        return self is Outcome.OK

    @property
    def is_limit(self) -> bool:
        """True when the sandbox stopped the program (as opposed to the program failing by itself)."""
        return self in _LIMITS


_LIMITS = frozenset(
    {Outcome.TIMEOUT, Outcome.CPU_LIMIT, Outcome.MEMORY_LIMIT, Outcome.OUTPUT_LIMIT, Outcome.FILE_SIZE_LIMIT}
)


@dataclasses.dataclass(frozen=True)
class Limits:
    """Resource limits of one sandboxed process tree. ``None`` = unlimited (the wall clock of a
    long-lived worker is per call instead)."""

    #: wall-clock seconds for the whole run (run_python) or for one call (SandboxWorker)
    wall_s: float = 60.0
    #: RLIMIT_CPU seconds (soft; the hard limit is one second more)
    cpu_s: int | None = 60
    #: RLIMIT_AS bytes (virtual memory of each process)
    memory_bytes: int | None = 1 * GiB
    #: RLIMIT_FSIZE bytes (largest file a process may write)
    file_size_bytes: int | None = 64 * MiB
    #: RLIMIT_NPROC (processes + threads of the sandbox's uid; only enforced for a non-root uid)
    processes: int | None = 64
    #: RLIMIT_NOFILE
    open_files: int | None = 256
    #: bytes of stdout / stderr kept; more output kills the run with OUTPUT_LIMIT
    stdout_bytes: int = 1 * MiB
    stderr_bytes: int = 1 * MiB
    #: size of the scratch directory (an in-memory tmpfs: HOME, TMPDIR and cwd); writing more
    #: fails with ENOSPC inside the program, the host's disk is never touched
    scratch_bytes: int = 64 * MiB
    #: files (and directories) the scratch directory can hold
    scratch_files: int = 4096
    #: total bytes of the files a run hands back (``run_python(collect=...)``)
    collect_bytes: int = 16 * MiB

    def __post_init__(self) -> None:
        if self.wall_s <= 0:
            raise ValueError(f"Limits.wall_s must be > 0, got {self.wall_s}")
        for name in ("stdout_bytes", "stderr_bytes", "scratch_bytes", "scratch_files", "collect_bytes"):
            if getattr(self, name) <= 0:
                raise ValueError(f"Limits.{name} must be > 0, got {getattr(self, name)}")
        for name in ("cpu_s", "memory_bytes", "file_size_bytes", "processes", "open_files"):
            value = getattr(self, name)
            if value is not None and value <= 0:
                raise ValueError(f"Limits.{name} must be > 0 or None, got {value}")

    def rlimits(self) -> dict[str, tuple[int, int]]:
        """``resource`` module names -> (soft, hard), for the launcher."""
        out: dict[str, tuple[int, int]] = {"RLIMIT_CORE": (0, 0)}
        if self.cpu_s is not None:
            out["RLIMIT_CPU"] = (self.cpu_s, self.cpu_s + 1)
        if self.memory_bytes is not None:
            out["RLIMIT_AS"] = (self.memory_bytes, self.memory_bytes)
        if self.file_size_bytes is not None:
            out["RLIMIT_FSIZE"] = (self.file_size_bytes, self.file_size_bytes)
        if self.processes is not None:
            out["RLIMIT_NPROC"] = (self.processes, self.processes)
        if self.open_files is not None:
            out["RLIMIT_NOFILE"] = (self.open_files, self.open_files)
        return out


class IsolationLevel(str, enum.Enum):
    """How strongly a program is walled off. There is no automatic downgrade between levels."""

    #: the allow-list wall: own mount (fresh root), PID, network, IPC and UTS namespaces, an
    #: unprivileged uid without capabilities, rlimits; setup failure raises SandboxSetupError
    NAMESPACES = "namespaces"
    #: NOT isolated — for trusted local use only: a plain subprocess with rlimits, an allow-listed
    #: environment and its own session; it reads and writes what the caller can and has the network
    NONE = "none"


@dataclasses.dataclass(frozen=True)
class Isolation:
    """What a sandboxed program may see besides the system runtime, its interpreter and its scratch.

    Everything is an allow-list: paths not named here do not exist inside the sandbox.
    """

    #: ``sandbox`` (the default) or ``none`` (trusted local use only; must be asked for by name)
    level: IsolationLevel = IsolationLevel.NAMESPACES
    #: host paths (files or directories) mounted read-only at the same path; ``sys_path`` entries of
    #: a worker are added to these
    read_paths: tuple[str, ...] = ()
    #: third-party top-level packages the program may import: each one's directory (or module file)
    #: and its sibling ``<name>.libs`` are mounted read-only into :data:`SANDBOX_SITE`
    packages: tuple[str, ...] = ()
    #: parent environment variables forwarded by name (never ones that look like credentials)
    pass_env: tuple[str, ...] = ("TZ", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")
    #: the host's network namespace (and its DNS and CA files, read-only) instead of one with no
    #: interface. Every other wall stays. Asked for by name, by one sandbox only: the ``cli`` proposer's
    #: agent, which must reach its model's API
    host_network: bool = False
    #: the host path of the egress proxy's Unix socket (:mod:`whale.sandbox.egress`): the program gets its own
    #: network namespace with loopback only, a relay on 127.0.0.1:EGRESS_RELAY_PORT to this socket, the host's CA
    #: files read-only and :data:`EGRESS_ENV`; it reaches only what the proxy's allow-list allows
    egress_socket: str | None = None

    def __post_init__(self) -> None:
        try:
            object.__setattr__(self, "level", IsolationLevel(self.level))
        except ValueError:
            choices = ", ".join(repr(level.value) for level in IsolationLevel)
            raise ValueError(f"Isolation.level must be one of {choices}, got {self.level!r}") from None
        if not isinstance(self.host_network, bool):
            raise ValueError(f"Isolation.host_network must be True or False, got {self.host_network!r}")
        if self.egress_socket is not None:
            if not isinstance(self.egress_socket, str) or not self.egress_socket.startswith("/"):
                raise ValueError(f"Isolation.egress_socket must be an absolute path, got {self.egress_socket!r}")
            if self.host_network:
                raise ValueError(
                    "Isolation.egress_socket and host_network exclude each other: the proxy is the way out"
                )
            if self.level is not IsolationLevel.NAMESPACES:
                raise ValueError(
                    "Isolation.egress_socket needs level 'namespaces' (its own network namespace); without one the "
                    "program has the host's network and no proxy could wall it"
                )
        for name in ("read_paths", "packages", "pass_env"):
            value = getattr(self, name)
            if isinstance(value, str):
                raise ValueError(f"Isolation.{name} must be a sequence of strings, got the string {value!r}")
            object.__setattr__(self, name, tuple(value))
        bad = [n for n in self.pass_env if SECRET_NAME_RE.search(n)]
        if bad:
            raise ValueError(
                f"Isolation.pass_env would forward credential-like variables {bad}; "
                "pass values explicitly through `env=` if the program really needs them"
            )
        for path in self.read_paths:
            if not path.startswith("/"):
                raise ValueError(f"Isolation.read_paths entries must be absolute paths, got {path!r}")
            if path.rstrip("/") == "":
                raise ValueError("Isolation.read_paths must not contain '/': that would show the whole host")
        for name in self.packages:
            if not name.isidentifier():
                raise ValueError(f"Isolation.packages entries must be top-level package names, got {name!r}")

    @classmethod
    def none(cls, pass_env: tuple[str, ...] = ("TZ", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")) -> Isolation:
        """No isolation (trusted local use only): see :attr:`IsolationLevel.NONE`."""
        return cls(level=IsolationLevel.NONE, pass_env=pass_env)

    @property
    def sandboxed(self) -> bool:
        return self.level is IsolationLevel.NAMESPACES

    @property
    def shares_network(self) -> bool:
        """The program reaches the host's network (asked for by name, or no isolation at all)."""
        return self.host_network or not self.sandboxed


def build_env(
    scratch: str,
    parent_env: Mapping[str, str],
    pass_env: Sequence[str],
    extra: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """The sandbox's whole environment: :data:`BASE_ENV`, HOME/TMPDIR = scratch, allow-listed
    parent names, then explicit ``extra`` values. Nothing else from the parent leaks in."""
    env = dict(BASE_ENV)
    env["HOME"] = scratch
    env["TMPDIR"] = scratch
    for name in pass_env:
        if name in parent_env and not SECRET_NAME_RE.search(name):
            env[name] = parent_env[name]
    if extra:
        env.update({str(k): str(v) for k, v in extra.items()})
    return env


_EXC_LINE_RE = re.compile(r"^([A-Za-z_][\w.]*(?:Error|Exception|Exit|Interrupt|Warning|Iteration)\w*)(?::\s?(.*))?$")


def last_exception(stderr_tail: str) -> tuple[str | None, str | None]:
    """(exception type, message) from the last traceback line of ``stderr``, if any."""
    for line in reversed(stderr_tail.strip().splitlines()[-20:]):
        match = _EXC_LINE_RE.match(line.strip())
        if match:
            return match.group(1).rsplit(".", 1)[-1], (match.group(2) or "").strip() or None
    return None, None


def classify(
    returncode: int | None,
    *,
    timed_out: bool = False,
    output_overflow: bool = False,
    stderr_tail: str = "",
    setup_error: str | None = None,
) -> tuple[Outcome, str | None]:
    """Name how a sandboxed process ended: (outcome, exception type or signal name or None).

    Order matters: the sandbox's own kills (setup failure, output cap, wall clock) explain a death
    better than the signal that delivered it.
    """
    if setup_error is not None:
        return Outcome.SANDBOX_ERROR, None
    if output_overflow:
        return Outcome.OUTPUT_LIMIT, None
    if timed_out:
        return Outcome.TIMEOUT, None
    exc_type, _ = last_exception(stderr_tail)
    if exc_type == "MemoryError":
        return Outcome.MEMORY_LIMIT, exc_type
    if returncode is None:
        return Outcome.KILLED, None
    if returncode == 0:
        return Outcome.OK, None
    if returncode < 0:
        sig = -returncode
        name = _signal_name(sig)
        if sig == signal.SIGXCPU:
            return Outcome.CPU_LIMIT, name
        if sig == signal.SIGXFSZ:
            return Outcome.FILE_SIZE_LIMIT, name
        return Outcome.KILLED, name
    if exc_type is not None and exc_type in {"OSError"} and "File too large" in stderr_tail:
        return Outcome.FILE_SIZE_LIMIT, exc_type
    return Outcome.ERROR, exc_type


def _signal_name(sig: int) -> str:
    try:
        return signal.Signals(sig).name
    except ValueError:
        return f"signal {sig}"


def tail_text(data: bytes, limit: int = 4000) -> str:
    """The last ``limit`` characters of captured bytes, decoded leniently (for error messages)."""
    return data[-limit * 4 :].decode("utf-8", errors="replace")[-limit:]


#: ``spec.execution.sandbox.isolation``: kernel namespaces (fail closed), the harness pod as the wall (cluster only), or
#: none at all (trusted local use). Here, beside :class:`Isolation`, so the domain API can hand
#: :func:`tool_isolation` to a domain without importing the harness runtime (the layers in pyproject.toml).
SpecIsolation = Literal["namespaces", "pod", "none"]
ISOLATION_LEVELS: tuple[str, ...] = get_args(SpecIsolation)


def sandbox_isolation(level: SpecIsolation) -> Isolation:
    """The ``whale.sandbox.Isolation`` for a level: every namespace the launcher offers with no
    fallback for ``namespaces``; no namespaces for ``none`` and ``pod`` (there the pod is the wall; the
    launcher still applies rlimits, the allow-listed environment and a fresh scratch directory)."""
    if level not in ISOLATION_LEVELS:
        raise ValueError(f"isolation must be one of {list(ISOLATION_LEVELS)}, got {level!r}")
    return Isolation() if level == "namespaces" else Isolation.none()


def tool_isolation(level: SpecIsolation) -> Isolation | None:
    """The isolation for a tool that runs model-written code with its own default (the math domain's
    code interpreter, which adds its allowed packages): None = keep the tool's default when that is
    already the fail-closed wall; otherwise :func:`sandbox_isolation`. One spec field sets both.
    ``pod`` keeps the namespaces here too: under ``pod`` the code tool runs in its own pod (its server is
    told so there); a local runner in a workload pod, which holds credentials, never runs code unwalled."""
    if level in ("namespaces", "pod"):
        return None
    return sandbox_isolation(level)
