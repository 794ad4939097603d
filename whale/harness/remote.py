"""The workloads' side of the run's harness host: a harness process that runs in the harness pod.

On a cluster the harness files (untrusted) do not run in the workload pods, which hold the store
credentials and have egress; they run in the run's harness pod (``whale.harness.host``), which holds
neither. :func:`spawn_remote` opens one TCP connection per harness process and returns the same
:class:`~whale.harness.launch.Spawned` a local sandbox gives, so :class:`~whale.harness.process.HarnessProcess`
(its ids, its per-call clock, its restarts) runs unchanged over it. Closing the connection kills the
process (the host kills its process group).

Wire protocol (one connection = one harness process):

1. the caller sends one JSON line (at most :data:`MAX_HELLO_BYTES`): ``{"token", "harness"`` (the
   file's text), ``"allowed"`` (import allow list), ``"limits"`` (:data:`LIMIT_FIELDS`)``}``;
2. the host answers with frames ``<channel byte><4-byte big-endian length><payload>``: first one
   ``s`` frame (JSON ``{"ok": true, "isolation": {...}}`` or ``{"ok": false, "error", "kind"}``),
   then ``o`` (the process's stdout) and ``e`` (its stderr) frames, and one ``x`` frame (JSON
   ``{"returncode"}``) when the process ended, before it closes the connection;
3. after the first line, whatever the caller sends is the process's stdin (JSON lines, each at most
   the host's message limit).

A ``run_shell`` request (:func:`run_shell`, one connection per command) is a first line with ``"kind":
"shell"``, ``"command"``, ``"timeout_s"`` and ``"snapshot_bytes"``, followed by that many bytes of the snapshot
(:mod:`whale.harness.shell`); the host answers with one ``s`` frame: ``{"ok": true, "output"}`` (the agent's
answer text) or ``{"ok": false, "error"}``, and closes the connection.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import struct
import time
from pathlib import Path
from typing import Any

from whale.harness import launch

#: channel bytes of the host's frames
STATUS, STDOUT, STDERR, EXIT = b"s", b"o", b"e", b"x"
FRAME_HEADER = struct.Struct(">cI")
#: the largest frame the host sends (stdout/stderr chunks are cut to this)
MAX_FRAME_BYTES = 1 << 20
#: the caller's first line: the harness file (at most launch.MAX_HARNESS_BYTES) and a little JSON around it
MAX_HELLO_BYTES = 2 * launch.MAX_HARNESS_BYTES + (64 << 10)
#: the SandboxLimits fields that travel to the host (it clamps each to its own maximum)
LIMIT_FIELDS = (
    "memory_bytes",
    "cpu_seconds",
    "file_size_bytes",
    "hook_timeout_s",
    "start_timeout_s",
    "max_response_bytes",
    "stderr_tail_bytes",
)
#: how long closing waits for the host to confirm the process is gone
CLOSE_TIMEOUT_S = 10.0
#: one connection attempt, and how long a caller waits for a host that is not up yet (its pod starting)
CONNECT_TIMEOUT_S = 10.0
HOST_READY_TIMEOUT_S = 300.0
#: the first line's ``kind`` of a run_shell request (without one: a harness process)
SHELL = "shell"
#: how long past a command's wall clock a caller waits for the host's answer (the sandbox's teardown, the transfer)
SHELL_ANSWER_GRACE_S = 30.0


class HarnessHostError(launch.IsolationUnavailableError):
    """The harness host could not be reached, refused the caller, or could not start a process for a reason
    that is not the harness file's: the phase fails (like missing isolation), no candidate scores 0 for it."""


def frame(channel: bytes, payload: bytes) -> bytes:
    return FRAME_HEADER.pack(channel, len(payload)) + payload


async def read_frame(reader: asyncio.StreamReader) -> tuple[bytes, bytes] | None:
    """The next frame, or None at the end of the stream; ValueError for a frame over the limit."""
    try:
        header = await reader.readexactly(FRAME_HEADER.size)
    except asyncio.IncompleteReadError:
        return None
    channel, size = FRAME_HEADER.unpack(header)
    if size > MAX_FRAME_BYTES:
        raise ValueError(f"harness host sent a {size}-byte frame (limit {MAX_FRAME_BYTES})")
    try:
        return channel, await reader.readexactly(size)
    except asyncio.IncompleteReadError:
        return None


def hello(host: launch.HarnessHost, source: str, allowed: frozenset[str], limits: launch.SandboxLimits) -> bytes:
    body = {
        "token": host.token,
        "harness": source,
        "allowed": sorted(allowed),
        "limits": {name: getattr(limits, name) for name in LIMIT_FIELDS},
    }
    return json.dumps(body).encode("utf-8") + b"\n"


@dataclasses.dataclass
class RemoteSpawned(launch.Spawned):
    """A harness process on the harness host; killing it is closing its connection."""

    _demux: asyncio.Task[None] | None = None
    _writer: asyncio.StreamWriter | None = None
    _idle: list[bool] = dataclasses.field(default_factory=list)

    @property
    def idle_closed(self) -> bool:
        return bool(self._idle)

    async def kill(self) -> None:
        """Half-close the connection (the host then kills the process group), wait until the host closes its
        side (the process is gone), then close ours; bounded by :data:`CLOSE_TIMEOUT_S`."""
        writer, demux = self._writer, self._demux
        if writer is not None and not writer.is_closing():
            with contextlib.suppress(OSError, ConnectionError, RuntimeError):
                writer.write_eof()
        if demux is not None and not demux.done():
            try:
                await asyncio.wait_for(asyncio.shield(demux), CLOSE_TIMEOUT_S)
            except TimeoutError:
                demux.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await demux
        if writer is not None:
            writer.close()
            with contextlib.suppress(OSError, ConnectionError):
                await asyncio.wait_for(writer.wait_closed(), CLOSE_TIMEOUT_S)


async def connect(
    host: launch.HarnessHost, ready_timeout_s: float
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A connection to the host, retried while it is not up yet (its pod may start after the workload's: the
    operator scales it up with the phase), for at most ``ready_timeout_s``."""
    deadline = time.monotonic() + ready_timeout_s
    delay_s = 0.2
    while True:
        try:
            return await asyncio.wait_for(asyncio.open_connection(host.address, host.port), CONNECT_TIMEOUT_S)
        except (OSError, TimeoutError) as exc:
            if time.monotonic() + delay_s > deadline:
                raise HarnessHostError(
                    f"the run's harness host {host.address}:{host.port} is unreachable after {ready_timeout_s:g} s: {exc}"
                ) from exc
        await asyncio.sleep(delay_s)  # NOTE: a backoff between attempts, not a synchronisation
        delay_s = min(delay_s * 2, 5.0)


async def spawn_remote(
    host: launch.HarnessHost,
    harness_path: Path,
    allowed_imports: frozenset[str],
    limits: launch.SandboxLimits,
    ready_timeout_s: float = HOST_READY_TIMEOUT_S,
) -> launch.Spawned:
    """Start one harness process on ``host`` (see the module doc); raises :class:`HarnessHostError` when the
    host cannot be reached or refuses, ``ValueError`` for a harness file over the size limit."""
    source = launch._read_harness(harness_path)
    reader, writer = await connect(host, ready_timeout_s)
    try:
        writer.write(hello(host, source, allowed_imports, limits))
        await writer.drain()
        first = await asyncio.wait_for(read_frame(reader), limits.start_timeout_s)
        status = json.loads(first[1]) if first is not None and first[0] == STATUS else None
    except (OSError, TimeoutError, ValueError) as exc:
        writer.close()
        raise HarnessHostError(f"the harness host {host.address}:{host.port} did not answer: {exc}") from exc
    except BaseException:
        writer.close()
        raise
    if not isinstance(status, dict) or not status.get("ok"):
        writer.close()
        error = status.get("error") if isinstance(status, dict) else "the connection closed"
        raise HarnessHostError(f"the harness host {host.address}:{host.port} refused: {str(error)[:500]}")

    stdout = asyncio.StreamReader(limit=limits.max_response_bytes)
    stderr = asyncio.StreamReader(limit=limits.max_response_bytes)
    exit_code: list[int] = []
    idle: list[bool] = []

    async def demux() -> None:
        # NOTE: feed_data has no backpressure (a pipe's transport pauses itself): an answer line longer than the
        # limit ends the connection here, so a harness cannot fill this process's memory
        line_bytes = 0
        try:
            while (got := await read_frame(reader)) is not None:
                channel, payload = got
                if channel == STDOUT:
                    newline = payload.rfind(b"\n")
                    line_bytes = len(payload) - newline - 1 if newline >= 0 else line_bytes + len(payload)
                    if line_bytes > limits.max_response_bytes:
                        stdout.feed_data(b"\n")  # the reader sees one unreadable answer and the process as dead
                        break
                    stdout.feed_data(payload)
                elif channel == STDERR:
                    stderr.feed_data(payload)
                elif channel == EXIT:
                    ended = json.loads(payload)
                    code = ended.get("returncode") if isinstance(ended, dict) else None
                    exit_code.append(code if isinstance(code, int) else -1)
                    if isinstance(ended, dict) and ended.get("idle") is True:
                        idle.append(True)
        except (OSError, ValueError):
            pass  # a broken connection is a dead process, reported below
        finally:
            writer.close()
            if not exit_code:
                exit_code.append(-9)
            stdout.feed_eof()
            stderr.feed_eof()

    task = asyncio.create_task(demux())
    isolation: dict[str, Any] = {**dict(status.get("isolation") or {}), "host": f"{host.address}:{host.port}"}
    return RemoteSpawned(
        stdin=writer,
        stdout=stdout,
        stderr=stderr,
        isolation=isolation,
        _kill=lambda: None,
        _poll=lambda: exit_code[0] if exit_code else None,
        _demux=task,
        _writer=writer,
        _idle=idle,
    )


# ----- the proposer's run_shell on the host --------------------------------------------------------------


def shell_hello(host: launch.HarnessHost, command: str, timeout_s: float, snapshot: bytes) -> bytes:
    """The first line of a ``shell`` request; the snapshot's ``snapshot_bytes`` raw bytes follow it."""
    body = {"token": host.token, "kind": SHELL, "command": command, "timeout_s": timeout_s}
    return json.dumps({**body, "snapshot_bytes": len(snapshot)}).encode("utf-8") + b"\n"


async def run_shell(
    host: launch.HarnessHost,
    command: str,
    timeout_s: float,
    snapshot: bytes,
    ready_timeout_s: float = HOST_READY_TIMEOUT_S,
) -> str:
    """Run one ``run_shell`` command on ``host`` over a snapshot of the archive and candidates
    (:func:`whale.harness.shell.pack`) and return its answer text; :class:`HarnessHostError` when the host
    cannot be reached, refuses, or does not answer within the command's wall clock plus a grace."""
    reader, writer = await connect(host, ready_timeout_s)
    try:
        writer.write(shell_hello(host, command, timeout_s, snapshot))
        writer.write(snapshot)
        await writer.drain()
        got = await asyncio.wait_for(read_frame(reader), timeout_s + SHELL_ANSWER_GRACE_S)
        answer = json.loads(got[1]) if got is not None and got[0] == STATUS else None
    except (OSError, TimeoutError, ValueError) as exc:
        raise HarnessHostError(f"the harness host {host.address}:{host.port} did not answer: {exc!r}") from exc
    finally:
        writer.close()
        with contextlib.suppress(OSError, ConnectionError):
            await asyncio.wait_for(writer.wait_closed(), CLOSE_TIMEOUT_S)
    if not isinstance(answer, dict) or not answer.get("ok") or not isinstance(answer.get("output"), str):
        error = answer.get("error") if isinstance(answer, dict) else "the connection closed"
        raise HarnessHostError(f"the harness host {host.address}:{host.port} refused: {str(error)[:500]}")
    return str(answer["output"])
