"""Launching and killing one sandboxed process tree (shared by :func:`run_python`, the worker and the
harness runtime).

The parent decides everything here — what the new root contains (the system runtime, the
interpreter's prefix without its site-packages, :attr:`Isolation.read_paths`, the worker's
``sys_path``, :attr:`Isolation.packages`), the environment, the rlimits, the uid — and hands it to
``_boot.py`` as JSON over a pipe. It then reads the status the guard writes from inside once it has
checked it runs unprivileged; any failure on the way raises :class:`SandboxSetupError` (there is no
degraded fallback). Killing is closing the *lifeline* pipe: the boot then SIGKILLs the namespace's
init, the kernel kills every other process of the namespace (a ``setsid()`` or double-forked child
too), and the boot exits only after that, so "the launcher has exited" means "nothing of the sandbox
is left". If the caller dies, the lifeline closes by itself.
"""

from __future__ import annotations

import base64
import dataclasses
import functools
import glob
import importlib.util
import itertools
import json
import logging
import os
import select
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from whale.sandbox.policy import (
    EGRESS_ENV,
    EGRESS_RELAY_PORT,
    SANDBOX_EGRESS_SOCKET,
    SANDBOX_SCRATCH,
    SANDBOX_SITE,
    Isolation,
    Limits,
    build_env,
)

log = logging.getLogger(__name__)

_HERE = Path(__file__).resolve().parent
BOOT_PATH = str(_HERE / "_boot.py")
GUARD_PATH = str(_HERE / "_guard.py")
#: where the guard is placed inside the sandbox's read-only root
SANDBOX_GUARD = "/sandbox/guard.py"
SETUP_FAILED_EXIT = 121
BOOT_STATUS_TIMEOUT_S = 30.0
KILL_DEADLINE_S = 5.0
#: the system runtime, mounted read-only (symlinks, as on merged-/usr hosts, are recreated as links)
SYSTEM_PATHS = ("/usr", "/bin", "/sbin", "/lib", "/lib64", "/lib32", "/libx32")
#: what a program with the host's network (``Isolation(host_network=True)``) needs to resolve names and
#: verify TLS: mounted read-only where the host has them
NETWORK_FILES = (
    "/etc/resolv.conf",
    "/etc/hosts",
    "/etc/host.conf",
    "/etc/gai.conf",
    "/etc/ssl",
    "/etc/ca-certificates",
    "/etc/pki",
    "/etc/crypto-policies",
)
#: of those, what a program behind the egress proxy needs: the CA files only (the proxy resolves names)
TLS_FILES = tuple(
    p for p in NETWORK_FILES if p not in ("/etc/resolv.conf", "/etc/hosts", "/etc/host.conf", "/etc/gai.conf")
)
#: the program's uid inside the sandbox when the caller is not root (the second user namespace maps
#: it to the caller's uid on the host; it has no capability anywhere)
INNER_UID = 1000

#: Sandbox uids (root callers) start here (far above regular accounts); each live sandbox gets its
#: own uid, so RLIMIT_NPROC counts one sandbox only. A process owns the block of ``UID_SLOTS`` uids
#: at ``UID_BASE + (pid % 100000) * UID_SLOTS``.
UID_BASE = 200_000
UID_SLOTS = 1024
_uid_counter = itertools.count()
_live_uids: set[int] = set()
_uid_lock = threading.Lock()


class SandboxSetupError(RuntimeError):
    """The sandbox itself could not be started (not the program's fault). The message names the step
    that failed; there is no automatic fallback to weaker isolation."""


def _allocate_uid() -> int:
    """A uid no live sandbox of this process holds and no running process uses."""
    block = UID_BASE + (os.getpid() % 100_000) * UID_SLOTS
    with _uid_lock:
        start = next(_uid_counter)
        for i in range(UID_SLOTS):
            uid = block + (start + i) % UID_SLOTS
            if uid not in _live_uids and not _pids_of_uid(uid):
                _live_uids.add(uid)
                return uid
    raise SandboxSetupError(f"all {UID_SLOTS} sandbox uids of this process are in use")


def _release_uid(uid: int | None) -> None:
    with _uid_lock:
        _live_uids.discard(uid)


def _pids_of_uid(uid: int) -> list[int]:
    """Live (non-zombie) processes whose real uid is ``uid`` (from /proc)."""
    out = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/status", "rb") as f:
                zombie = False
                for line in f:
                    if line.startswith(b"State:"):
                        zombie = line.split()[1] in (b"Z", b"X")
                    elif line.startswith(b"Uid:"):
                        if int(line.split()[1]) == uid and not zombie:
                            out.append(int(entry.name))
                        break
        except (FileNotFoundError, ProcessLookupError, PermissionError, ValueError):
            continue
    return out


@dataclasses.dataclass
class Launched:
    """A started sandbox: the boot process (``proc``; its pipes are the program's) and its cleanup."""

    proc: subprocess.Popen[bytes]
    #: the scratch directory as the program sees it (HOME, TMPDIR, cwd)
    scratch: str
    uid: int | None
    status: dict[str, Any]
    #: a host directory to remove afterwards (only with ``level == "none"``)
    host_scratch: str | None
    started: float
    #: closing it kills the sandbox
    lifeline: int | None = None
    #: the collected files arrive here (``collect=``), else None
    result_fd: int | None = None

    @property
    def isolation(self) -> dict[str, Any]:
        return dict(self.status)

    def wait_exit(self, timeout_s: float) -> bool:
        """Wait (bounded) for the sandbox to end by itself — after its program exited, the boot
        still reports how; killing first would turn an exit code into SIGKILL."""
        try:
            self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            return False
        return True

    def kill_tree(self) -> None:
        """Kill every process of the sandbox and wait until the boot reports them gone (bounded)."""
        if self.lifeline is not None:
            os.close(self.lifeline)
            self.lifeline = None
        try:
            self.proc.wait(timeout=KILL_DEADLINE_S)
        except subprocess.TimeoutExpired:
            log.error(
                "sandbox launcher pid %s did not exit after its lifeline closed; killing its group", self.proc.pid
            )
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)  # the boot and the init: the kernel does the rest
            except (ProcessLookupError, PermissionError):
                pass
            try:
                self.proc.wait(timeout=KILL_DEADLINE_S)
            except subprocess.TimeoutExpired:
                log.error("sandbox launcher pid %s did not die after SIGKILL", self.proc.pid)

    def cleanup(self) -> None:
        self.kill_tree()
        for stream in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
            if stream is not None:
                try:
                    stream.close()
                except OSError:
                    pass
        if self.result_fd is not None:
            os.close(self.result_fd)
            self.result_fd = None
        if self.host_scratch is not None:
            shutil.rmtree(self.host_scratch, ignore_errors=True)
        _release_uid(self.uid)


def _under(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


def base_python() -> str:
    """The interpreter outside any virtual environment (the sandbox has no venv, only its prefix)."""
    return os.path.realpath(getattr(sys, "_base_executable", None) or sys.executable)


@functools.cache
def _interpreter_mounts() -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(read-only trees the interpreter needs besides the system paths, its site-packages to hide)."""
    prefixes = {os.path.realpath(sys.base_prefix), os.path.realpath(sys.base_exec_prefix)}
    python_dir = os.path.dirname(base_python())
    trees = {p for p in prefixes if not any(_under(p, s) for s in SYSTEM_PATHS)}
    if not any(_under(python_dir, t) for t in trees | set(SYSTEM_PATHS)):
        trees.add(python_dir)
    hide: set[str] = set()
    for prefix in prefixes | {"/usr", "/usr/local"}:
        for pattern in (
            "lib/python3*/site-packages",
            "lib/python3*/dist-packages",
            "lib/python3/dist-packages",
            "lib64/python3*/site-packages",
            "local/lib/python3*/dist-packages",
        ):
            hide.update(os.path.realpath(p) for p in glob.glob(os.path.join(prefix, pattern)) if os.path.isdir(p))
    return tuple(sorted(trees)), tuple(sorted(hide))


@functools.lru_cache(maxsize=128)
def package_mounts(name: str) -> tuple[tuple[str, str], ...]:
    """(host path, path inside) of an allow-listed package: its directory or module file, and its
    sibling ``<name>.libs`` (bundled shared libraries of manylinux wheels)."""
    spec = importlib.util.find_spec(name)
    if spec is None:
        raise SandboxSetupError(
            f"Isolation.packages: {name!r} is not installed for {sys.executable}; "
            "install it or remove it from the allow-list"
        )
    if spec.submodule_search_locations is not None:
        locations = list(spec.submodule_search_locations)
        if len(locations) != 1:
            raise SandboxSetupError(
                f"Isolation.packages: {name!r} is a namespace package spread over "
                f"{locations}; allow-list a regular package instead"
            )
        source = locations[0]
    elif spec.origin and os.path.isabs(spec.origin):
        source = spec.origin
    else:
        raise SandboxSetupError(f"Isolation.packages: {name!r} is built into the interpreter; it needs no entry")
    source = os.path.realpath(source)
    mounts = [(source, f"{SANDBOX_SITE}/{os.path.basename(source)}")]
    libs = os.path.join(os.path.dirname(source), f"{name}.libs")
    if os.path.isdir(libs):
        mounts.append((os.path.realpath(libs), f"{SANDBOX_SITE}/{name}.libs"))
    return tuple(mounts)


def _read_binds(paths: Sequence[str], field: str) -> list[tuple[str, str]]:
    """(host source, target) for allow-listed read-only paths: at their path and, when that is a
    symlink, also at the resolved one."""
    out = []
    for path in paths:
        path = os.path.abspath(path)
        if not os.path.exists(path):
            raise SandboxSetupError(f"{field}: {path} does not exist; remove it or create it before the run")
        real = os.path.realpath(path)
        if real == "/":
            raise SandboxSetupError(f"{field}: {path} is the host's root; name the directories the program needs")
        for target in dict.fromkeys((path, real)):
            if not any(_under(target, s) for s in SYSTEM_PATHS):
                out.append((real, target))
    return out


def _etc(uid: int, network: bool = False) -> dict[str, str]:
    return {
        "passwd": (
            f"root:x:0:0:root:/:/usr/sbin/nologin\nsandbox:x:{uid}:{uid}:sandbox:{SANDBOX_SCRATCH}:"
            "/usr/sbin/nologin\nnobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n"
        ),
        "group": f"root:x:0:\nsandbox:x:{uid}:\nnogroup:x:65534:\n",
        "nsswitch.conf": "passwd: files\ngroup: files\nhosts: files" + (" dns" if network else "") + "\n",
    }


def _network_binds(files: Sequence[str] = NETWORK_FILES) -> list[tuple[str, str]]:
    """The host's DNS and CA files that exist, for a sandbox with the host's network (the CA files only behind the
    egress proxy)."""
    present = [p for p in files if os.path.exists(p)]
    return _read_binds(present, "the network files")


def _stat(path: str) -> os.stat_result:
    try:
        return os.stat(path)
    except OSError as exc:
        raise SandboxSetupError(f"Isolation.egress_socket: cannot reach {path}: {exc.strerror}") from None


def _check_file_names(files: Mapping[str, str | bytes] | None, collect: Sequence[str]) -> None:
    for field, names in (("files", list(files or {})), ("collect", list(collect))):
        for name in names:
            parts = name.split("/")
            if not name or name.startswith("/") or any(p in ("", ".", "..") for p in parts):
                raise ValueError(
                    f"sandbox {field} name {name!r} escapes the scratch directory; "
                    "use a relative path without '.' or '..' components"
                )


def _encode_files(files: Mapping[str, str | bytes] | None) -> dict[str, str]:
    return {
        name: base64.b64encode(content.encode("utf-8") if isinstance(content, str) else content).decode()
        for name, content in (files or {}).items()
    }


def launch(
    *,
    mode: str,
    target: str,
    args: list[str],
    limits: Limits,
    isolation: Isolation,
    files: Mapping[str, str | bytes] | None,
    env: Mapping[str, str] | None,
    stdin: int | None,
    sys_path: list[str] | None = None,
    collect: Sequence[str] = (),
    scratch: None = None,
) -> Launched:
    """Start the sandboxed process; returns once the guard inside reported its isolation.

    Args:
        mode: ``run`` (run ``target`` as ``__main__``) or ``worker`` (serve calls, see the guard).
        target: file name in the scratch directory (put it in ``files``).
        sys_path: directories put on the program's ``sys.path``; mounted read-only like
            :attr:`Isolation.read_paths`.
        collect: scratch file names handed back at the end of a run (``Launched.result_fd``).
        scratch: no longer supported (the scratch is an in-memory tmpfs); kept so old callers get a
            clear error instead of a TypeError.

    Raises:
        SandboxSetupError: an isolation step failed (the message names it); nothing runs.
    """
    if scratch is not None:
        raise ValueError(
            "launch(scratch=...) is gone: the scratch directory is an in-memory tmpfs inside the "
            "sandbox; pass files in with `files=` and get them back with `collect=`"
        )
    if mode not in ("run", "worker"):
        raise ValueError(f"launch mode must be 'run' or 'worker', got {mode!r}")
    _check_file_names(files, [target, *collect])
    root = os.geteuid() == 0
    sandboxed = isolation.sandboxed
    uid = _allocate_uid() if sandboxed and root else None
    host_scratch = None
    try:
        if sandboxed:
            scratch_path = SANDBOX_SCRATCH
            trees, hide = _interpreter_mounts()
            binds = [(t, t) for t in trees]
            binds += _read_binds(isolation.read_paths, "Isolation.read_paths")
            binds += _read_binds(sys_path or [], "sys_path")
            if isolation.shares_network:
                binds += _network_binds()
            elif isolation.egress_socket is not None:
                binds += _network_binds(TLS_FILES)
                if not stat.S_ISSOCK(_stat(isolation.egress_socket).st_mode):
                    raise SandboxSetupError(f"Isolation.egress_socket: {isolation.egress_socket} is not a socket")
                binds.append((isolation.egress_socket, SANDBOX_EGRESS_SOCKET))
            for name in isolation.packages:
                binds += package_mounts(name)
            binds = list(dict.fromkeys(binds))
            targets = [t for _, t in binds]
            if len(set(targets)) != len(targets):
                raise SandboxSetupError(f"two read-only mounts want the same place: {sorted(targets)}")
            hide = tuple(h for h in hide if not any(_under(t, h) for t in targets))
            program_uid = INNER_UID if uid is None else uid  # uid: allocated when root
        else:
            host_scratch = tempfile.mkdtemp(prefix="whale-sbx-")
            scratch_path = host_scratch
            binds, hide, targets, program_uid = [], (), [], os.getuid()
        guard_path = SANDBOX_GUARD if sandboxed else GUARD_PATH
        site = [SANDBOX_SITE] if sandboxed and isolation.packages else []
        status_seed = {
            "level": isolation.level.value,
            "network": "host" if isolation.shares_network else "egress" if isolation.egress_socket else "netns",
            "pid_namespace": sandboxed,
            "scratch": scratch_path,
            "scratch_bytes": limits.scratch_bytes if sandboxed else None,
            "read_paths": sorted(set(targets) - set(_interpreter_mounts()[0])) if sandboxed else [],
            "packages": list(isolation.packages) if sandboxed else [],
        }
        cfg = {
            "sandboxed": sandboxed,
            "root": root,
            "uid": program_uid,
            "owner_in_ns": (uid if root else 0) if sandboxed else os.getuid(),
            "share_network": isolation.shares_network,
            # the relay to the egress proxy, started by the init before the program (loopback brought up first)
            "relay": {"port": EGRESS_RELAY_PORT, "socket": SANDBOX_EGRESS_SOCKET} if isolation.egress_socket else None,
            "status": status_seed,
            "system": list(SYSTEM_PATHS),
            "binds": binds,
            "hide": list(hide),
            "etc": _etc(program_uid, isolation.shares_network),
            "scratch": scratch_path,
            "scratch_bytes": limits.scratch_bytes,
            "scratch_files": limits.scratch_files,
            "files": _encode_files(files),
            "collect": list(collect),
            "collect_bytes": limits.collect_bytes,
            "rlimits": limits.rlimits(),
            # the sandbox's processes together (their private resident memory), checked by its init
            "sandbox_memory_bytes": limits.memory_bytes if sandboxed else None,
            "python": base_python(),
            "guard_path": guard_path,
            "guard_source": Path(GUARD_PATH).read_text(encoding="utf-8") if sandboxed else "",
            "guard": {
                "mode": mode,
                "sandboxed": sandboxed,
                "target": os.path.join(scratch_path, target),
                "args": list(args),
                "sys_path": [*site, *(os.path.abspath(p) for p in sys_path or [])],
                "scratch": scratch_path,
                "network": isolation.shares_network or isolation.egress_socket is not None,
                "read_roots": [*SYSTEM_PATHS, *targets, "/sandbox", "/dev", "/etc", "/proc"],
            },
            "env": build_env(
                scratch_path,
                os.environ,
                isolation.pass_env,
                {**(env or {}), **(EGRESS_ENV if isolation.egress_socket else {})},
            ),
        }
        payload = json.dumps(cfg).encode()
    except BaseException:
        _release_uid(uid)
        if host_scratch is not None:
            shutil.rmtree(host_scratch, ignore_errors=True)
        raise
    return _start(payload, stdin, uid, scratch_path, host_scratch, bool(collect))


def _start(
    payload: bytes, stdin: int | None, uid: int | None, scratch: str, host_scratch: str | None, want_result: bool
) -> Launched:
    cfg_r, cfg_w = os.pipe()
    status_r, status_w = os.pipe()
    life_r, life_w = os.pipe()
    result_r, result_w = os.pipe() if want_result else (None, None)
    child_fds = [fd for fd in (cfg_r, status_w, life_r, result_w) if fd is not None]
    try:
        proc = subprocess.Popen(
            [
                base_python(),
                "-I",
                "-S",
                BOOT_PATH,
                str(cfg_r),
                str(status_w),
                str(life_r),
                str(result_w if result_w is not None else -1),
            ],
            stdin=stdin if stdin is not None else subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
            pass_fds=child_fds,
            env={"LANG": "C.UTF-8"},
            cwd="/",
        )
    except OSError as exc:
        for fd in (cfg_w, status_r, life_w, result_r):
            if fd is not None:
                os.close(fd)
        _release_uid(uid)
        if host_scratch is not None:
            shutil.rmtree(host_scratch, ignore_errors=True)
        raise SandboxSetupError(f"cannot start the sandbox launcher: {exc}") from exc
    finally:
        for fd in child_fds:
            os.close(fd)
    launched = Launched(proc, scratch, uid, {}, host_scratch, time.monotonic(), life_w, result_r)
    try:
        try:
            _send(cfg_w, payload, BOOT_STATUS_TIMEOUT_S)
            raw = _read_all(status_r, BOOT_STATUS_TIMEOUT_S)
        finally:
            os.close(status_r)
        try:
            status = json.loads(raw) if raw else {"error": "the sandbox launcher died before reporting"}
        except ValueError:
            status = {"error": f"unreadable launcher status {raw[:200]!r}"}
        if not isinstance(status, dict):
            status = {"error": f"unreadable launcher status {raw[:200]!r}"}
        if "error" in status:
            raise SandboxSetupError(f"sandbox setup failed: {status['error']}{_stderr_tail(proc)}")
    except BaseException:
        launched.cleanup()
        raise
    launched.status = status
    launched.started = time.monotonic()
    return launched


def _stderr_tail(proc: subprocess.Popen[bytes]) -> str:
    """What the launcher printed before dying (a Python traceback of the boot), if it died."""
    try:
        proc.wait(timeout=KILL_DEADLINE_S)
    except subprocess.TimeoutExpired:
        return ""
    if proc.stderr is None:
        return ""
    os.set_blocking(proc.stderr.fileno(), False)
    try:
        data = proc.stderr.read() or b""
    except OSError:
        return ""
    text = data.decode("utf-8", errors="replace").strip()
    return f" (launcher stderr: {text[-500:]})" if text else ""


def _send(fd: int, data: bytes, timeout_s: float) -> None:
    """Write ``data`` to ``fd`` and close it, within a deadline."""
    deadline = time.monotonic() + timeout_s
    os.set_blocking(fd, False)
    view = memoryview(data)
    try:
        while view:
            left = deadline - time.monotonic()
            if left <= 0:
                raise SandboxSetupError(f"the sandbox launcher did not read its configuration within {timeout_s} s")
            _, ready, _ = select.select([], [fd], [], left)
            if not ready:
                continue
            try:
                view = view[os.write(fd, view) :]
            except BlockingIOError:
                continue
            except BrokenPipeError:
                raise SandboxSetupError("the sandbox launcher died before reading its configuration") from None
    finally:
        os.close(fd)


def _read_all(fd: int, timeout_s: float) -> bytes:
    """Read ``fd`` to EOF within a deadline."""
    deadline = time.monotonic() + timeout_s
    chunks: list[bytes] = []
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            raise SandboxSetupError(f"the sandbox launcher reported nothing within {timeout_s} s")
        ready, _, _ = select.select([fd], [], [], left)
        if not ready:
            continue
        chunk = os.read(fd, 65536)
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)
