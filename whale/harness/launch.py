"""How the harness process is started: the one place that sets its limits and its isolation.

A harness file is untrusted once a proposer writes it, so its process always starts through
``whale.sandbox`` (``launch``): its own namespaces (network, mounts, ...) and a fresh unprivileged uid,
rlimits (address space, CPU seconds, file size), an allow-listed environment without credentials, a
private scratch directory, and wall timeouts per hook call and at start (the per-call clock is enforced
by ``whale.harness.process``, which kills and restarts the process on overrun).

The process sees only what it is given (allow list, not deny list):

* the harness file, copied into its scratch directory;
* a staged read-only package directory (:func:`stage_worker_package`) holding nothing but
  ``whale/__init__.py`` and ``whale/harness/__init__.py`` (both empty), ``whale/harness/api.py`` and
  ``whale/harness/worker.py`` (both standard library only) — passed as its only ``sys_path`` entry;
* the standard library. The worker drops every other import path and finder before the harness runs
  (``whale.harness.worker.confine_imports``), so the checkout, the installed domain packages and the
  data root are neither importable nor readable (the sandbox's filesystem wall hides them as well).

Isolation levels (``spec.execution.sandbox.isolation``, :data:`IsolationLevel`):

* ``namespaces`` (default): kernel isolation or nothing. When the sandbox cannot isolate on this host,
  starting fails with :class:`IsolationUnavailableError` — never a silent fallback.
* ``pod``: on a cluster only. The run's harness pod is the wall (no credentials, no service-account
  token, no egress, restricted securityContext, optionally gVisor/Kata): the harness host
  (``whale.harness.host``) starts each process there without kernel namespaces but with everything
  else (rlimits, a fresh scratch directory, the allow-listed environment, the confined imports), and
  the workloads reach it over :mod:`whale.harness.remote`. Without a harness host (``whale run``)
  starting fails closed with :class:`IsolationUnavailableError` naming ``spec.execution.sandbox.isolation``.
* ``none``: trusted local use only, asked for by name. The process still starts through
  ``whale.sandbox`` (rlimits, allow-listed environment, its own session, the worker's audit hook) but
  runs as the caller, in the caller's namespaces: it can read whatever the caller can. A warning is
  logged once per process and the level is recorded in the phase results.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import logging
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path

from whale.sandbox.policy import ISOLATION_LEVELS, sandbox_isolation
from whale.sandbox.policy import SpecIsolation as IsolationLevel

log = logging.getLogger(__name__)

_HERE = Path(__file__).resolve().parent


#: the files of the staged package, relative to its root, and where their text comes from (None: empty)
_PACKAGE_FILES: dict[str, Path | None] = {
    "whale/__init__.py": None,
    "whale/harness/__init__.py": None,
    "whale/harness/api.py": _HERE / "api.py",
    "whale/harness/worker.py": _HERE / "worker.py",
}
#: the largest harness file the runtime copies into a sandbox (proposer files are capped far lower)
MAX_HARNESS_BYTES = 1 << 20


class IsolationUnavailableError(RuntimeError):
    """The sandbox cannot isolate the harness process on this host and the spec did not opt out.

    Not a :class:`~whale.harness.process.HarnessError`: it is not the harness's fault, so it fails
    the phase instead of scoring a candidate 0."""


def unavailable_message(why: str) -> str:
    return f"kernel isolation is unavailable here: {why}; set spec.execution.sandbox.isolation: none only for trusted local use"


#: why ``pod`` cannot run where no harness host is configured (``whale run``, a workload without one)
POD_WITHOUT_HOST = (
    "spec.execution.sandbox.isolation is pod, which runs harness files only in the run's harness pod on a cluster "
    "(WHALE_HARNESS_HOST is not set here); use namespaces (or none, for trusted local use) outside a cluster"
)
#: the environment that names the run's harness host (the operator sets both in the workload pods)
HARNESS_HOST_ENV = "WHALE_HARNESS_HOST"
HARNESS_TOKEN_ENV = "WHALE_HARNESS_TOKEN"


@dataclasses.dataclass(frozen=True)
class HarnessHost:
    """Where the run's harness host listens (``host:port``) and the run's caller token (not in the repr)."""

    address: str
    port: int
    token: str = dataclasses.field(repr=False)

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> HarnessHost | None:
        """The host the operator configured (:data:`HARNESS_HOST_ENV`, :data:`HARNESS_TOKEN_ENV`), else None."""
        value = environ.get(HARNESS_HOST_ENV, "").strip()
        if not value:
            return None
        address, sep, port = value.rpartition(":")
        if not sep or not address or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError(f"{HARNESS_HOST_ENV} must be host:port, got {value!r}")
        token = environ.get(HARNESS_TOKEN_ENV, "")
        if not token:
            raise ValueError(f"{HARNESS_HOST_ENV} is set but {HARNESS_TOKEN_ENV} (the run's harness token) is empty")
        return cls(address, int(port), token)


@dataclasses.dataclass(frozen=True)
class SandboxLimits:
    """Resource limits and isolation level of one harness process (which serves many episodes)."""

    #: address-space limit (RLIMIT_AS)
    memory_bytes: int = 1 << 30
    #: CPU seconds over the process's whole life (RLIMIT_CPU); hooks are cheap string work
    cpu_seconds: int = 3600
    #: largest file the process may write (RLIMIT_FSIZE; the worker refuses every write anyway)
    file_size_bytes: int = 1 << 20
    #: wall seconds one hook call may take before the process is killed and restarted
    hook_timeout_s: float = 30.0
    #: wall seconds to start and load the harness
    start_timeout_s: float = 60.0
    #: largest JSON answer of one hook call
    max_response_bytes: int = 8 << 20
    #: tail of the process's stderr kept for error messages
    stderr_tail_bytes: int = 16 << 10
    #: ``spec.execution.sandbox.isolation``: "namespaces" (fail closed), "pod" (the harness pod is the wall) or "none"
    #: (trusted local use only)
    isolation: IsolationLevel = "namespaces"
    #: the run's harness host: processes start there (:mod:`whale.harness.remote`) instead of here
    host: HarnessHost | None = None

    def __post_init__(self) -> None:
        if self.isolation not in ISOLATION_LEVELS:
            raise ValueError(f"SandboxLimits.isolation must be one of {list(ISOLATION_LEVELS)}, got {self.isolation!r}")


_warned_none: list[bool] = []  # warn once per process


def warn_if_unisolated(level: IsolationLevel) -> None:
    """Log, once per process, that untrusted code runs without isolation."""
    if level == "none" and not _warned_none:
        _warned_none.append(True)
        log.warning(
            "spec.execution.sandbox.isolation is none: harness files and model-written code run WITHOUT kernel "
            "isolation, as this process's user (trusted local use only)"
        )


def stdlib_dirs() -> list[str]:
    """The interpreter's standard library directories (what ``python -I -S`` puts on sys.path): the
    import path entries under its base prefix, without installed packages."""
    bases = [os.path.realpath(p) for p in (sys.base_prefix, sys.base_exec_prefix)]
    out = []
    for entry in (os.path.dirname(os.__file__), *sys.path):
        real = os.path.realpath(entry) if entry else ""
        parts = real.split(os.sep)
        if (
            real
            and any(real == b or real.startswith(b.rstrip("/") + "/") for b in bases)
            and "site-packages" not in parts
            and "dist-packages" not in parts
        ):
            out.append(real)
    return list(dict.fromkeys(out))


def stage_worker_package(dest: Path) -> Path:
    """Write the worker's package (4 files, see the module doc) under ``dest``, read-only, and return
    ``dest``: the one ``sys_path`` entry of the harness process."""
    for rel, source in _PACKAGE_FILES.items():
        path = dest / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("" if source is None else source.read_text(encoding="utf-8"), encoding="utf-8")
        path.chmod(0o444)
    for directory in (dest / "whale" / "harness", dest / "whale", dest):
        directory.chmod(0o555)
    return dest


def _remove_tree(path: Path) -> None:
    for root, dirs, _ in os.walk(path):
        for name in dirs:
            os.chmod(os.path.join(root, name), 0o755)
    os.chmod(path, 0o755)
    shutil.rmtree(path, ignore_errors=True)


@dataclasses.dataclass
class Spawned:
    """A started harness process, adopted into asyncio."""

    stdin: asyncio.StreamWriter
    stdout: asyncio.StreamReader
    stderr: asyncio.StreamReader
    #: what isolation was achieved: the level asked for plus the launcher's report
    isolation: dict[str, object]
    _kill: Callable[[], None]
    _poll: Callable[[], int | None]
    #: asyncio transports over the pipes, closed before the pipes themselves
    _transports: list[asyncio.BaseTransport] = dataclasses.field(default_factory=list)
    _cleanup: Callable[[], None] | None = None

    @property
    def returncode(self) -> int | None:
        return self._poll()

    @property
    def idle_closed(self) -> bool:
        """The harness host closed this process's connection for idleness (a local process never is)."""
        return False

    async def kill(self) -> None:
        """Kill the process tree, close the pipes, remove its scratch and package directories."""
        await asyncio.to_thread(self._kill)
        for transport in self._transports:
            transport.close()
        if self._cleanup is not None:
            await asyncio.to_thread(self._cleanup)


def entry_code(harness: str, allowed_imports: frozenset[str], package_dir: str) -> str:
    """The sandbox's entry file: load the harness through the staged worker (nothing else is importable)."""
    config = {
        "harness": harness,
        "allowed": sorted(allowed_imports),
        "package_dir": package_dir,
        "stdlib_dirs": stdlib_dirs(),
    }
    return f"from whale.harness.worker import serve_entry as _serve_entry\nglobals().update(_serve_entry({config!r}))\n"


async def _adopt(
    proc: subprocess.Popen[bytes], limit: int
) -> tuple[asyncio.StreamWriter, asyncio.StreamReader, asyncio.StreamReader, list[asyncio.BaseTransport]]:
    """asyncio streams over a Popen's pipes (the whale.sandbox launcher hands back a Popen)."""
    loop = asyncio.get_running_loop()
    readers: list[asyncio.StreamReader] = []
    transports: list[asyncio.BaseTransport] = []
    for pipe in (proc.stdout, proc.stderr):
        reader = asyncio.StreamReader(limit=limit)
        read_transport, _ = await loop.connect_read_pipe(functools.partial(asyncio.StreamReaderProtocol, reader), pipe)
        readers.append(reader)
        transports.append(read_transport)
    write_transport, protocol = await loop.connect_write_pipe(asyncio.streams.FlowControlMixin, proc.stdin)
    transports.append(write_transport)
    writer = asyncio.StreamWriter(write_transport, protocol, None, loop)
    return writer, readers[0], readers[1], transports


def _read_harness(path: Path) -> str:
    size = path.stat().st_size
    if size > MAX_HARNESS_BYTES:
        raise ValueError(f"harness file {path.name} is {size} bytes; the limit is {MAX_HARNESS_BYTES}")
    return path.read_text(encoding="utf-8")


async def spawn_worker(harness_path: Path, allowed_imports: frozenset[str], limits: SandboxLimits) -> Spawned:
    """Start a harness worker for ``harness_path``: on the run's harness host when ``limits.host`` names
    one (:mod:`whale.harness.remote`), else here through ``whale.sandbox`` (:func:`spawn_local`).

    Raises :class:`IsolationUnavailableError` when ``limits.isolation`` is ``namespaces`` and this host
    cannot provide them, or is ``pod`` and no harness host is configured (the message names
    ``spec.execution.sandbox.isolation``)."""
    if limits.host is not None:
        from whale.harness import remote

        return await remote.spawn_remote(limits.host, Path(harness_path), allowed_imports, limits)
    if limits.isolation == "pod":
        raise IsolationUnavailableError(POD_WITHOUT_HOST)
    return await spawn_local(harness_path, allowed_imports, limits)


async def spawn_local(
    harness_path: Path, allowed_imports: frozenset[str], limits: SandboxLimits, *, in_harness_pod: bool = False
) -> Spawned:
    """Start a harness worker here through ``whale.sandbox``. ``in_harness_pod``: the caller is the harness
    host (``whale.harness.host``), the only place level ``pod`` may start a process."""
    from whale.sandbox import Limits, SandboxSetupError
    from whale.sandbox.process import launch

    if limits.isolation == "pod" and not in_harness_pod:
        raise IsolationUnavailableError(POD_WITHOUT_HOST)
    warn_if_unisolated(limits.isolation)
    source = _read_harness(Path(harness_path))
    package = stage_worker_package(Path(tempfile.mkdtemp(prefix="whale-harness-pkg-")))
    sb_limits = Limits(
        wall_s=limits.hook_timeout_s,
        cpu_s=limits.cpu_seconds,
        memory_bytes=limits.memory_bytes,
        file_size_bytes=limits.file_size_bytes,
        stdout_bytes=limits.max_response_bytes,
        stderr_bytes=limits.stderr_tail_bytes,
    )
    files = {"worker_entry.py": entry_code("harness.py", allowed_imports, str(package)), "harness.py": source}
    try:
        launched = await asyncio.to_thread(
            launch,
            mode="worker",
            target="worker_entry.py",
            args=[],
            limits=sb_limits,
            isolation=sandbox_isolation(limits.isolation),
            scratch=None,
            files=files,
            env=None,
            stdin=subprocess.PIPE,
            sys_path=[str(package)],
        )
    except SandboxSetupError as exc:
        _remove_tree(package)
        if limits.isolation != "namespaces":
            raise
        raise IsolationUnavailableError(unavailable_message(str(exc).strip())) from exc
    except BaseException:
        _remove_tree(package)
        raise

    def cleanup() -> None:
        try:
            launched.cleanup()
        finally:
            _remove_tree(package)

    try:
        stdin, stdout, stderr, transports = await _adopt(launched.proc, limits.max_response_bytes)
    except BaseException:
        await asyncio.to_thread(cleanup)
        raise
    isolation = {**launched.isolation, "level": limits.isolation}
    return Spawned(stdin, stdout, stderr, isolation, launched.kill_tree, launched.proc.poll, transports, cleanup)
