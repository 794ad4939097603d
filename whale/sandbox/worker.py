"""A long-lived sandboxed process serving JSON calls over pipes.

Starting a sandbox costs tens of milliseconds; an episode calls harness hooks many times. So the
harness runtime starts one :class:`SandboxWorker` per harness (or per concurrent episode slot): the
worker loads an entry file once (inside the sandbox) and then answers ``call(fn, *args)`` with
JSON values. Each call has its own wall clock: a call that overruns kills the worker
(``SandboxCallError`` with ``Outcome.TIMEOUT``); the next call starts a fresh one. An exception in
the called function is an ordinary answer (``Outcome.ERROR``; the worker lives on).
"""

from __future__ import annotations

import dataclasses
import json
import os
import select
import subprocess
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import IO, Any

from whale.sandbox.policy import Isolation, Limits, MiB, Outcome, classify, tail_text
from whale.sandbox.process import Launched, launch

ENTRY_FILE = "worker_entry.py"

#: how long a worker that died by itself gets to report how (its launcher exits right after)
_EXIT_REPORT_S = 2.0

#: A worker lives for many calls: no total CPU cap by default, 30 s per call.
WORKER_LIMITS = Limits(wall_s=30.0, cpu_s=None)


class SandboxCallError(RuntimeError):
    """A worker call did not return a value. ``outcome`` says why: ERROR (the function raised;
    ``error_type``/``remote_traceback`` tell which), or a limit/death (the worker is gone)."""

    def __init__(
        self,
        outcome: Outcome,
        message: str,
        *,
        error_type: str | None = None,
        remote_traceback: str | None = None,
        stderr_tail: str = "",
    ) -> None:
        super().__init__(f"{outcome.value}: {message}")
        self.outcome = outcome
        self.error_type = error_type
        self.remote_traceback = remote_traceback
        self.stderr_tail = stderr_tail


@dataclasses.dataclass
class _Proc:
    launched: Launched
    stderr: bytearray
    stderr_thread: threading.Thread
    buffer: bytearray
    functions: list[str]


class SandboxWorker:
    """Sandboxed process that runs ``entry`` once, then serves calls to its public functions.

    Args:
        entry: path of the entry file (copied into scratch as ``worker_entry.py``); or use ``entry_code``.
        files: more files placed in the scratch directory (e.g. the untrusted harness file).
        limits: ``wall_s`` applies per call; ``cpu_s`` to the worker's whole life.
        start_timeout_s: how long loading the entry file may take.
        max_reply_bytes: larger replies kill the worker (``Outcome.OUTPUT_LIMIT``).
    """

    def __init__(
        self,
        entry: str | os.PathLike[str] | None = None,
        *,
        entry_code: str | None = None,
        files: Mapping[str, str | bytes] | None = None,
        env: Mapping[str, str] | None = None,
        limits: Limits | None = None,
        isolation: Isolation | None = None,
        sys_path: list[str] | None = None,
        start_timeout_s: float = 60.0,
        max_reply_bytes: int = 16 * MiB,
    ) -> None:
        if (entry is None) == (entry_code is None):
            raise ValueError("SandboxWorker needs exactly one of `entry` or `entry_code`")
        code = entry_code if entry_code is not None else Path(entry).read_text(encoding="utf-8")  # type: ignore[arg-type]  # one of the two is set (checked above)
        self._files: dict[str, str | bytes] = {**(files or {}), ENTRY_FILE: code}
        self._env = dict(env or {})
        self.limits = limits or WORKER_LIMITS
        self.isolation = isolation or Isolation()
        self._sys_path = list(sys_path or [])
        self.start_timeout_s = start_timeout_s
        self.max_reply_bytes = max_reply_bytes
        self._proc: _Proc | None = None
        self._lock = threading.Lock()
        self._next_id = 0
        #: how many times a dead worker was started again
        self.restarts = 0
        self._started_once = False

    # ----- lifecycle -------------------------------------------------------------------------------

    def __enter__(self) -> SandboxWorker:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def alive(self) -> bool:
        return self._proc is not None and self._proc.launched.proc.poll() is None

    @property
    def isolation_report(self) -> dict[str, Any]:
        return self._proc.launched.isolation if self._proc else {}

    @property
    def functions(self) -> list[str]:
        """Public callables the entry file defines (after start)."""
        return list(self._proc.functions) if self._proc else []

    def start(self) -> SandboxWorker:
        """Start the worker (no-op when running). Raises SandboxCallError when the entry file fails."""
        with self._lock:
            self._ensure_started()
        return self

    def close(self) -> None:
        with self._lock:
            self._stop()

    def _stop(self) -> None:
        if self._proc is not None:
            proc, self._proc = self._proc, None
            proc.launched.cleanup()
            proc.stderr_thread.join(timeout=2)

    def _ensure_started(self) -> _Proc:
        if self._proc is not None:
            return self._proc
        if self._started_once:
            self.restarts += 1
        self._started_once = True
        launched = launch(
            mode="worker",
            target=ENTRY_FILE,
            args=[],
            limits=self.limits,
            isolation=self.isolation,
            files=self._files,
            env=self._env,
            stdin=subprocess.PIPE,
            sys_path=self._sys_path,
        )
        stderr = bytearray()
        thread = threading.Thread(target=_drain, args=(launched, stderr, self.limits.stderr_bytes), daemon=True)
        thread.start()
        proc = _Proc(launched, stderr, thread, bytearray(), [])
        self._proc = proc
        hello = self._read_reply(proc, self.start_timeout_s, "starting the worker")
        if not hello.get("ready"):
            self._stop()
            raise SandboxCallError(
                Outcome.ERROR,
                f"the worker entry failed to load: {hello.get('error_type')}: {hello.get('message')}",
                error_type=hello.get("error_type"),
                remote_traceback=hello.get("traceback"),
            )
        proc.functions = list(hello.get("functions", []))
        return proc

    # ----- calls -------------------------------------------------------------------------------------

    def call(self, fn: str, *args: Any, timeout_s: float | None = None, **kwargs: Any) -> Any:
        """Call ``fn(*args, **kwargs)`` in the sandbox; JSON values in and out."""
        with self._lock:
            proc = self._ensure_started()
            self._next_id += 1
            rid = self._next_id
            try:
                line = json.dumps({"id": rid, "fn": fn, "args": list(args), "kwargs": kwargs}) + "\n"
            except (TypeError, ValueError) as exc:
                raise TypeError(f"arguments of sandbox call {fn!r} are not JSON values: {exc}") from exc
            try:
                stdin = assert_stream(proc.launched.proc.stdin)
                stdin.write(line.encode())
                stdin.flush()
            except (BrokenPipeError, OSError):
                raise self._death(proc, timed_out=False, what=f"calling {fn!r}") from None
            reply = self._read_reply(proc, timeout_s if timeout_s is not None else self.limits.wall_s, f"call {fn!r}")
            if reply.get("id") != rid:
                self._stop()
                raise SandboxCallError(Outcome.SANDBOX_ERROR, f"worker answered out of order: {reply!r:.200}")
            if reply.get("ok"):
                return reply.get("result")
            raise SandboxCallError(
                Outcome.ERROR,
                f"{reply.get('error_type')}: {reply.get('message')}",
                error_type=reply.get("error_type"),
                remote_traceback=reply.get("traceback"),
            )

    def _read_reply(self, proc: _Proc, timeout_s: float, what: str) -> dict[str, Any]:
        out = assert_stream(proc.launched.proc.stdout)
        fd = out.fileno()
        deadline = time.monotonic() + timeout_s
        while b"\n" not in proc.buffer:
            left = deadline - time.monotonic()
            if left <= 0:
                raise self._death(proc, timed_out=True, what=what)
            ready, _, _ = select.select([fd], [], [], left)
            if not ready:
                continue
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                raise self._death(proc, timed_out=False, what=what)
            proc.buffer += chunk
            if len(proc.buffer) > self.max_reply_bytes and b"\n" not in proc.buffer:
                raise self._death(proc, timed_out=False, what=what, overflow=True)
        line, _, rest = bytes(proc.buffer).partition(b"\n")
        proc.buffer[:] = rest
        try:
            reply = json.loads(line)
        except ValueError as exc:
            self._stop()
            raise SandboxCallError(Outcome.SANDBOX_ERROR, f"unreadable worker reply during {what}: {exc}") from exc
        if not isinstance(reply, dict):
            self._stop()
            raise SandboxCallError(Outcome.SANDBOX_ERROR, f"worker reply is not an object during {what}")
        return reply

    def _death(self, proc: _Proc, *, timed_out: bool, what: str, overflow: bool = False) -> SandboxCallError:
        """Kill the worker and describe why it is gone."""
        if not timed_out and not overflow:  # it died by itself: let the launcher report how
            proc.launched.wait_exit(_EXIT_REPORT_S)
        proc.launched.kill_tree()
        proc.stderr_thread.join(timeout=2)
        stderr = tail_text(bytes(proc.stderr))
        outcome, error_type = classify(
            proc.launched.proc.returncode, timed_out=timed_out, output_overflow=overflow, stderr_tail=stderr
        )
        if outcome is Outcome.OK:  # exited cleanly mid-protocol: still a death
            outcome = Outcome.ERROR
        self._stop()
        reason = {Outcome.TIMEOUT: f"no answer within the time limit during {what}"}.get(
            outcome, f"the worker died during {what}"
        )
        return SandboxCallError(
            outcome, reason + (f" ({error_type})" if error_type else ""), error_type=error_type, stderr_tail=stderr
        )


def assert_stream(stream: IO[bytes] | None) -> IO[bytes]:
    """The pipe, or a SandboxCallError when it is gone."""
    if stream is None:
        raise SandboxCallError(Outcome.SANDBOX_ERROR, "worker pipes are closed")
    return stream


def _drain(launched: Launched, buf: bytearray, keep: int) -> None:
    """Keep the last ``keep`` bytes of the worker's stderr (its prints go there too)."""
    err = launched.proc.stderr
    if err is None:
        return
    try:
        while chunk := err.read1(1 << 16):  # type: ignore[attr-defined]  # Popen's pipe: a BufferedReader
            buf += chunk
            if len(buf) > 2 * keep:
                del buf[: len(buf) - keep]
    except (OSError, ValueError):
        return
