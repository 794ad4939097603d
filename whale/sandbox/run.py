"""One-shot sandboxed runs: a Python program in, a typed :class:`SandboxResult` out."""

from __future__ import annotations

import base64
import dataclasses
import fcntl
import json
import os
import select
import selectors
import time
from collections.abc import Mapping, Sequence
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
    #: what isolation the launcher set up: level, network, pid_namespace, user_namespace (network_user_namespace: a
    #: root caller's egress relay owns its network namespace through one), root,
    #: uid (inside), scratch, scratch_bytes, read_paths, packages, capabilities, audit_hooks
    isolation: dict[str, Any]
    stdout_truncated: bool = False
    stderr_truncated: bool = False
    #: the scratch files asked for with ``collect=`` (name -> content)
    files: dict[str, bytes] = dataclasses.field(default_factory=dict)
    #: asked-for files that did not come back, and why (missing, not a regular file, over budget)
    files_not_collected: dict[str, str] = dataclasses.field(default_factory=dict)

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
    collect: Sequence[str] = (),
) -> SandboxResult:
    """Run ``code`` (or the file at ``path``, copied into scratch) as ``__main__`` in a sandbox.

    Args:
        files: extra files placed in the scratch directory (name -> content) before the run.
        env: explicit environment additions (the only way a value reaches the program).
        collect: scratch file names (relative) to hand back in :attr:`SandboxResult.files` when the
            program exits by itself; regular files only, at most ``limits.collect_bytes`` in all.

    Raises:
        SandboxSetupError: the sandbox could not be set up (nothing ran).
    """
    if (code is None) == (path is None):
        raise ValueError("run_python needs exactly one of `code` or `path`")
    if isinstance(collect, str):
        raise ValueError("run_python(collect=...) takes a list of file names, not one string")
    limits = limits or Limits()
    isolation = isolation or Isolation()
    program = code if code is not None else Path(path).read_text(encoding="utf-8")  # type: ignore[arg-type]  # one of the two is set (checked above)
    all_files: dict[str, str | bytes] = {**(files or {}), MAIN_FILE: program}
    stdin_fd = _stdin_fd(stdin) if stdin is not None else None
    try:
        launched = launch(
            mode="run",
            target=MAIN_FILE,
            args=list(args or []),
            limits=limits,
            isolation=isolation,
            files=all_files,
            env=env,
            stdin=stdin_fd,
            collect=list(collect),
        )
    finally:
        if stdin_fd is not None:
            os.close(stdin_fd)
    try:
        return _collect(launched, limits, list(collect))
    finally:
        launched.cleanup()


def _stdin_fd(data: bytes) -> int:
    """A sealed in-memory file holding ``data``: a program that never reads stdin cannot block us,
    and one that reopens it (``/proc/self/fd/0``) cannot write to it or touch the host's disk."""
    fd = os.memfd_create("whale-sandbox-stdin", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]
    os.lseek(fd, 0, os.SEEK_SET)
    fcntl.fcntl(fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SEAL | fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_WRITE)
    return fd


def _collect(launched: Any, limits: Limits, wanted: list[str]) -> SandboxResult:
    """Pump stdout/stderr with caps until the process tree is gone or a limit fires."""
    proc = launched.proc
    # the collected files arrive base64-encoded inside JSON: 4/3 of the budget plus the framing
    caps = {"stdout": limits.stdout_bytes, "stderr": limits.stderr_bytes, "result": limits.collect_bytes * 2 + 65536}
    bufs: dict[str, bytearray] = {"stdout": bytearray(), "stderr": bytearray(), "result": bytearray()}
    sel = selectors.DefaultSelector()
    for name in ("stdout", "stderr"):
        stream = getattr(proc, name)
        os.set_blocking(stream.fileno(), False)
        sel.register(stream.fileno(), selectors.EVENT_READ, name)
    if launched.result_fd is not None:
        os.set_blocking(launched.result_fd, False)
        sel.register(launched.result_fd, selectors.EVENT_READ, "result")
    # the boot's exit (everything of the sandbox is gone by then) wakes the loop too
    pidfd = os.pidfd_open(proc.pid)
    sel.register(pidfd, selectors.EVENT_READ, "exit")
    deadline = launched.started + limits.wall_s
    drain_deadline: float | None = None
    timed_out = overflow = False
    truncated = {"stdout": False, "stderr": False}
    try:
        while len(sel.get_map()) > (1 if drain_deadline is None else 0):
            now = time.monotonic()
            limit = drain_deadline if drain_deadline is not None else deadline
            if now >= limit:
                if drain_deadline is None:
                    timed_out = True
                    launched.kill_tree()
                break
            for key, _ in sel.select(timeout=limit - now):
                name = key.data
                if name == "exit":
                    # the program and all it started are gone: read what is left in the pipes
                    sel.unregister(pidfd)
                    drain_deadline = time.monotonic() + _DRAIN_AFTER_EXIT_S
                    continue
                try:
                    chunk = os.read(key.fd, 65536)
                except BlockingIOError:
                    continue
                if not chunk:
                    sel.unregister(key.fd)
                    continue
                room = caps[name] - len(bufs[name])
                bufs[name] += chunk[: max(room, 0)]
                if len(chunk) > room and name != "result":
                    truncated[name] = True
                    if not overflow:
                        overflow = True
                        launched.kill_tree()
            if overflow:
                break
        # every pipe is closed but the program still runs: wait for it within the wall clock
        if (
            drain_deadline is None
            and not timed_out
            and not overflow
            and not select.select([pidfd], [], [], max(0.0, deadline - time.monotonic()))[0]
        ):
            timed_out = True
    finally:
        os.close(pidfd)
    sel.close()
    launched.kill_tree()
    returncode = proc.returncode
    stderr_text = tail_text(bytes(bufs["stderr"]), limit=limits.stderr_bytes)
    outcome, error_type = classify(
        returncode, timed_out=timed_out, output_overflow=overflow, stderr_tail=stderr_text[-8000:]
    )
    files, not_collected = _collected(bytes(bufs["result"]), wanted, outcome)
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
        files=files,
        files_not_collected=not_collected,
    )


def _collected(raw: bytes, wanted: list[str], outcome: Outcome) -> tuple[dict[str, bytes], dict[str, str]]:
    """Decode the init's report of collected files."""
    if not wanted:
        return {}, {}
    try:
        report = json.loads(raw) if raw else {}
    except ValueError:
        report = {}
    files = {name: base64.b64decode(data) for name, data in report.get("files", {}).items()}
    missing = dict(report.get("missing", {}))
    for name in wanted:
        if name not in files and name not in missing:
            missing[name] = f"the run did not end by itself ({outcome.value}); nothing was collected"
    return files, missing
