"""One-shot sandboxed runs: a Python program in, a typed :class:`SandboxResult` out."""

from __future__ import annotations

import dataclasses
import os
import selectors
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from whale.sandbox.policy import Isolation, Limits, Outcome, classify, tail_text
from whale.sandbox.process import launch

MAIN_FILE = "main.py"
_DRAIN_AFTER_EXIT_S = 2.0


@dataclasses.dataclass(frozen=True)
class SandboxResult:
    """How a sandboxed run ended, with its bounded output."""

    outcome: Outcome
    returncode: int | None
    stdout: str
    stderr: str
    #: exception type named by the traceback, or the signal name that ended it
    error_type: str | None
    wall_s: float
    #: what isolation the launcher achieved: network (netns | netns-userns | audit-hook), uid,
    #: uid_dropped, mounts, guard hooks
    isolation: dict[str, Any]
    stdout_truncated: bool = False
    stderr_truncated: bool = False

    @property
    def ok(self) -> bool:
        return self.outcome.ok

    def describe(self) -> str:
        """One line for logs and archive error fields."""
        what = self.outcome.value
        if self.error_type:
            what += f" ({self.error_type})"
        tail = self.stderr.strip().splitlines()[-1:] if self.stderr.strip() else []
        return what + (f": {tail[0][:300]}" if tail and not self.ok else "")


def run_python(
    code: str | None = None,
    *,
    path: str | os.PathLike[str] | None = None,
    args: list[str] | None = None,
    stdin: bytes | None = None,
    files: Mapping[str, str | bytes] | None = None,
    env: Mapping[str, str] | None = None,
    limits: Limits | None = None,
    isolation: Isolation | None = None,
    scratch: str | os.PathLike[str] | None = None,
) -> SandboxResult:
    """Run ``code`` (or the file at ``path``, copied into scratch) as ``__main__`` in a sandbox.

    Args:
        files: extra files placed in the scratch directory (name -> content) before the run.
        env: explicit environment additions (the only way a value reaches the program).
        scratch: use this directory (kept afterwards, e.g. to collect files the program wrote);
            default a fresh temporary one, removed afterwards.
    """
    if (code is None) == (path is None):
        raise ValueError("run_python needs exactly one of `code` or `path`")
    limits = limits or Limits()
    isolation = isolation or Isolation()
    program = code if code is not None else Path(path).read_text(encoding="utf-8")  # type: ignore[arg-type]
    all_files: dict[str, str | bytes] = {**(files or {}), MAIN_FILE: program}
    stdin_fd = _stdin_fd(stdin) if stdin is not None else None
    try:
        launched = launch(
            mode="run", target=MAIN_FILE, args=list(args or []), limits=limits, isolation=isolation,
            scratch=scratch, files=all_files, env=env, stdin=stdin_fd,
        )
    finally:
        if stdin_fd is not None:
            os.close(stdin_fd)
    try:
        return _collect(launched, limits)
    finally:
        launched.cleanup()


def _stdin_fd(data: bytes) -> int:
    """An unlinked temp file holding ``data``: a program that never reads stdin cannot block us."""
    fd, name = tempfile.mkstemp(prefix="whale-sbx-stdin-")
    os.unlink(name)
    os.write(fd, data)
    os.lseek(fd, 0, os.SEEK_SET)
    return fd


def _collect(launched: Any, limits: Limits) -> SandboxResult:
    """Pump stdout/stderr with caps until the process tree is gone or a limit fires."""
    proc = launched.proc
    caps = {"stdout": limits.stdout_bytes, "stderr": limits.stderr_bytes}
    bufs: dict[str, bytearray] = {"stdout": bytearray(), "stderr": bytearray()}
    sel = selectors.DefaultSelector()
    for name in ("stdout", "stderr"):
        stream = getattr(proc, name)
        os.set_blocking(stream.fileno(), False)
        sel.register(stream.fileno(), selectors.EVENT_READ, name)
    deadline = launched.started + limits.wall_s
    drain_deadline: float | None = None
    timed_out = overflow = False
    truncated = {"stdout": False, "stderr": False}
    while sel.get_map():
        now = time.monotonic()
        if drain_deadline is None and proc.poll() is not None:
            # the main process is gone: kill leftovers (they may hold the pipes open), then drain
            launched.kill_tree()
            drain_deadline = now + _DRAIN_AFTER_EXIT_S
        limit = drain_deadline if drain_deadline is not None else deadline
        if now >= limit:
            if drain_deadline is None:
                timed_out = True
                launched.kill_tree()
            break
        for key, _ in sel.select(timeout=min(0.05, limit - now)):
            name = key.data
            try:
                chunk = os.read(key.fd, 65536)
            except BlockingIOError:
                continue
            if not chunk:
                sel.unregister(key.fd)
                continue
            room = caps[name] - len(bufs[name])
            bufs[name] += chunk[: max(room, 0)]
            if len(chunk) > room:
                truncated[name] = True
                if not overflow:
                    overflow = True
                    launched.kill_tree()
    sel.close()
    launched.kill_tree()
    returncode = proc.returncode
    stderr_text = tail_text(bytes(bufs["stderr"]), limit=limits.stderr_bytes)
    outcome, error_type = classify(
        returncode, timed_out=timed_out, output_overflow=overflow, stderr_tail=stderr_text[-8000:]
    )
    return SandboxResult(
        outcome=outcome,
        returncode=returncode,
        stdout=bytes(bufs["stdout"]).decode("utf-8", errors="replace"),
        stderr=stderr_text,
        error_type=error_type,
        wall_s=time.monotonic() - launched.started,
        isolation=launched.isolation,
        stdout_truncated=truncated["stdout"],
        stderr_truncated=truncated["stderr"],
    )
