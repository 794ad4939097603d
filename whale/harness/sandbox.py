"""How the harness process is started: the one place that sets its limits.

A harness file is untrusted once a proposer writes it, so its process runs sandboxed:
no network, rlimits (address space, CPU seconds, file size), an environment without credentials,
a private scratch directory, and wall timeouts per hook call and at start (the per-call clock is
enforced by ``whale.harness.process``, which kills and restarts the process on overrun).

Backends, chosen by :func:`spawn_worker`:

* ``whale.sandbox`` (the project's sandboxed-subprocess primitive): network + mount namespaces, a
  fresh unprivileged uid, hidden credential directories, rlimits, allow-listed environment. Used
  whenever it is importable. Its launcher is synchronous; we adopt its pipes into asyncio so one
  process serves many concurrent episodes.
* ``local`` (fallback): ``unshare --net`` when the kernel allows it, rlimits in ``preexec_fn``, a
  fixed environment, a temporary working directory.

Both run the same worker code (``whale.harness.worker``) and speak the same JSON-lines protocol.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import logging
import os
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

log = logging.getLogger(__name__)
_REPO_ROOT = Path(__file__).resolve().parents[2]

#: variables copied into the harness environment (values fixed here, never read from the parent)
_SAFE_ENV = {
    "PATH": "/usr/local/bin:/usr/bin:/bin",
    "LANG": "C.UTF-8",
    "LC_ALL": "C.UTF-8",
    "PYTHONHASHSEED": "0",
    "PYTHONDONTWRITEBYTECODE": "1",
    "PYTHONUNBUFFERED": "1",
}


@dataclasses.dataclass(frozen=True)
class SandboxLimits:
    """Resource limits of one harness process (which serves many episodes)."""

    #: address-space limit (RLIMIT_AS)
    memory_bytes: int = 1 << 30
    #: CPU seconds over the process's whole life (RLIMIT_CPU); hooks are cheap string work
    cpu_seconds: int = 3600
    #: largest file the process may write (RLIMIT_FSIZE)
    file_size_bytes: int = 1 << 20
    #: wall seconds one hook call may take before the process is killed and restarted
    hook_timeout_s: float = 30.0
    #: wall seconds to start and load the harness
    start_timeout_s: float = 60.0
    #: largest JSON answer of one hook call
    max_response_bytes: int = 8 << 20
    #: tail of the process's stderr kept for error messages
    stderr_tail_bytes: int = 16 << 10
    #: isolate the network (a new network namespace) when the kernel allows it
    isolate_network: bool = True


@functools.cache
def _netns_prefix() -> tuple[str, ...]:
    """The argv prefix that gives a child its own (empty) network namespace here, or () if none works."""
    unshare = shutil.which("unshare")
    if not unshare:
        log.warning("harness sandbox: `unshare` not found; no network namespace (audit hook only)")
        return ()
    for prefix in ((unshare, "--net"), (unshare, "-rn")):
        try:
            done = subprocess.run([*prefix, "true"], capture_output=True, timeout=10, check=False)
        except (OSError, subprocess.TimeoutExpired):
            continue
        if done.returncode == 0:
            return prefix
    log.warning("harness sandbox: cannot create a network namespace here; relying on the audit hook")
    return ()


def network_isolated() -> bool:
    """Whether harness processes get their own network namespace on this machine."""
    return bool(_netns_prefix())


def _set_limits(limits: SandboxLimits) -> None:  # runs in the child between fork and exec
    resource.setrlimit(resource.RLIMIT_AS, (limits.memory_bytes, limits.memory_bytes))
    resource.setrlimit(resource.RLIMIT_CPU, (limits.cpu_seconds, limits.cpu_seconds + 5))
    resource.setrlimit(resource.RLIMIT_FSIZE, (limits.file_size_bytes, limits.file_size_bytes))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    os.setsid()


def sandbox_env(workdir: Path) -> dict[str, str]:
    """The whole environment of a harness process: fixed values only, no credentials."""
    return {**_SAFE_ENV, "HOME": str(workdir), "TMPDIR": str(workdir)}


def spawn(argv: list[str], limits: SandboxLimits) -> tuple[subprocess.Popen[bytes], Path]:
    """Start ``argv`` with the local limits and pipes on stdin/stdout/stderr; returns the process
    and its private working directory (the caller removes it)."""
    workdir = Path(tempfile.mkdtemp(prefix="whale-harness-"))
    prefix = _netns_prefix() if limits.isolate_network else ()
    proc = subprocess.Popen(  # noqa: S603 - argv built here, no shell
        [*prefix, *argv],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=workdir,
        env=sandbox_env(workdir),
        preexec_fn=functools.partial(_set_limits, limits),  # noqa: PLW1509 - only rlimits + setsid
    )
    return proc, workdir


@dataclasses.dataclass
class Spawned:
    """A started harness process, adopted into asyncio."""

    stdin: asyncio.StreamWriter
    stdout: asyncio.StreamReader
    stderr: asyncio.StreamReader
    #: "whale.sandbox" or "local"
    backend: str
    #: what isolation was achieved (backend-specific, for logs and the report)
    isolation: dict[str, object]
    _kill: Callable[[], None]
    _poll: Callable[[], int | None]
    #: asyncio transports over the pipes, closed before the pipes themselves
    _transports: list[asyncio.BaseTransport] = dataclasses.field(default_factory=list)
    _cleanup: Callable[[], None] | None = None

    @property
    def returncode(self) -> int | None:
        return self._poll()

    async def kill(self) -> None:
        """Kill the process tree, close the pipes, remove its scratch directory."""
        await asyncio.to_thread(self._kill)
        for transport in self._transports:
            transport.close()
        if self._cleanup is not None:
            await asyncio.to_thread(self._cleanup)


def _entry_code(allowed: frozenset[str], max_bytes: int) -> str:
    return (
        "from whale.harness.worker import harness_functions as _load\n"
        f"globals().update(_load('harness.py', {sorted(allowed)!r}, {max_bytes}))\n"
    )


async def _adopt(proc: subprocess.Popen[bytes], limit: int) -> tuple[asyncio.StreamWriter, asyncio.StreamReader, asyncio.StreamReader, list[asyncio.BaseTransport]]:
    """asyncio streams over a Popen's pipes (the whale.sandbox launcher hands back a Popen)."""
    loop = asyncio.get_running_loop()
    readers, transports = [], []
    for pipe in (proc.stdout, proc.stderr):
        reader = asyncio.StreamReader(limit=limit)
        transport, _ = await loop.connect_read_pipe(lambda r=reader: asyncio.StreamReaderProtocol(r), pipe)
        readers.append(reader)
        transports.append(transport)
    transport, protocol = await loop.connect_write_pipe(asyncio.streams.FlowControlMixin, proc.stdin)
    transports.append(transport)
    writer = asyncio.StreamWriter(transport, protocol, None, loop)
    return writer, readers[0], readers[1], transports


async def spawn_worker(
    harness_path: Path, allowed_imports: frozenset[str], limits: SandboxLimits, backend: str = "auto"
) -> Spawned:
    """Start a harness worker for ``harness_path``. ``backend``: auto | whale.sandbox | local."""
    if backend in ("auto", "whale.sandbox"):
        try:
            from whale.sandbox import Isolation, Limits
            from whale.sandbox.process import launch
        except ImportError:
            if backend == "whale.sandbox":
                raise
        else:
            try:
                return await _spawn_whale_sandbox(harness_path, allowed_imports, limits, launch, Limits, Isolation)
            except RuntimeError as exc:  # whale.sandbox.SandboxSetupError: this host cannot isolate that way
                if backend == "whale.sandbox":
                    raise
                _warn_fallback(exc)
    return await _spawn_local(harness_path, allowed_imports, limits)


_fallback_warned: list[str] = []  # warn once per process


def _warn_fallback(exc: Exception) -> None:
    if not _fallback_warned:
        _fallback_warned.append(str(exc))
        log.warning("harness sandbox: whale.sandbox could not start here (%s); using the local sandbox", exc)


async def _spawn_whale_sandbox(harness_path, allowed_imports, limits, launch, Limits, Isolation) -> Spawned:  # noqa: N803
    sb_limits = Limits(
        wall_s=limits.hook_timeout_s,
        cpu_s=limits.cpu_seconds,
        memory_bytes=limits.memory_bytes,
        file_size_bytes=limits.file_size_bytes,
        stdout_bytes=limits.max_response_bytes,
        stderr_bytes=limits.stderr_tail_bytes,
    )
    files = {
        "worker_entry.py": _entry_code(allowed_imports, limits.max_response_bytes),
        "harness.py": Path(harness_path).read_text(encoding="utf-8"),
    }
    launched = await asyncio.to_thread(
        launch,
        mode="worker",
        target="worker_entry.py",
        args=[],
        limits=sb_limits,
        isolation=Isolation(),  # always its own network namespace (no audit-hook fallback any more)
        scratch=None,
        files=files,
        env=None,
        stdin=subprocess.PIPE,
        sys_path=[str(_REPO_ROOT)],
    )
    try:
        stdin, stdout, stderr, transports = await _adopt(launched.proc, limits.max_response_bytes)
    except BaseException:
        await asyncio.to_thread(launched.cleanup)
        raise
    return Spawned(stdin, stdout, stderr, "whale.sandbox", launched.isolation, launched.kill_tree, launched.proc.poll,
                   transports, launched.cleanup)


async def _spawn_local(harness_path: Path, allowed_imports: frozenset[str], limits: SandboxLimits) -> Spawned:
    argv = worker_argv(harness_path, allowed_imports) + ["--max-bytes", str(limits.max_response_bytes)]
    proc, workdir = spawn(argv, limits)

    def kill() -> None:
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=10)

    def cleanup() -> None:
        for stream in (proc.stdin, proc.stdout, proc.stderr):
            if stream is not None:
                with contextlib.suppress(OSError):
                    stream.close()
        shutil.rmtree(workdir, ignore_errors=True)

    try:
        stdin, stdout, stderr, transports = await _adopt(proc, limits.max_response_bytes)
    except BaseException:
        kill()
        cleanup()
        raise
    isolation = {"network": "netns" if (limits.isolate_network and network_isolated()) else "audit-hook"}
    return Spawned(stdin, stdout, stderr, "local", isolation, kill, proc.poll, transports, cleanup)


def worker_argv(harness_path: Path, allowed_imports: frozenset[str] | set[str]) -> list[str]:
    """``python -I -c <run whale.harness.worker> FILE --allow a,b,c``: -I ignores PYTHON* variables and
    the working directory; the checkout holding ``whale`` is put on the path explicitly."""
    boot = (f"import sys; sys.path.insert(0, {str(_REPO_ROOT)!r}); "
            "from whale.harness.worker import main; sys.exit(main())")
    return [sys.executable, "-I", "-c", boot, str(harness_path), "--allow", ",".join(sorted(allowed_imports))]
