"""`whale logs NAME [--phase P] [--attempt N] [-f] [--tail N]`: a run's workload output, live.

Which log: ``--phase`` (its latest attempt, or ``--attempt``), else the runner's latest child
(``control/child.json``). Where from: the file itself when the runner that holds the run lock runs on
this host (live to the byte), else the copy the runner keeps in the store (``layout.log_key``: renewed
every few seconds while the child runs, in full when it ends), so a run on another machine or against S3
is followed too. Reads are bounded: :data:`CHUNK_BYTES` at a time from an offset (``Store.read_range``),
``--tail`` keeps only the last lines in memory.

``-f`` follows: with ``--phase``, until that attempt has ended; without, the run — each new child's log
in turn, under a ``==> phase (attempt n) <==`` header — until no runner holds the run lock.
"""

from __future__ import annotations

import codecs
import dataclasses
import re
import socket
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path

from whale import layout
from whale.runner.control import ChildRecord, read_child
from whale.store import ObjectNotFound, Store

#: the most one read takes from a log
CHUNK_BYTES = 64 * 1024
#: a line kept for --tail is cut to this many bytes
MAX_LINE_BYTES = 16 * 1024
#: how often -f looks for more
POLL_S = 0.5
_ATTEMPT_RE = re.compile(r"attempt-(\d+)\.log$")


class LogsError(ValueError):
    """No such log; the message says which logs there are."""


@dataclasses.dataclass(frozen=True)
class LogTarget:
    phase: str
    attempt: int
    #: the store copy
    key: str
    #: the file itself, when the runner of this attempt runs on this host and the file is there
    local: Path | None = None

    def header(self) -> str:
        return f"==> {self.phase} (attempt {self.attempt}) <==\n"


def logged_attempts(store: Store, run: str, phase: str) -> list[int]:
    prefix = f"{layout.phase_prefix(run, phase)}/logs/"
    found = (_ATTEMPT_RE.search(key) for key in store.list(prefix, recursive=False))
    return sorted(int(m.group(1)) for m in found if m)


def phases_with_logs(store: Store, run: str) -> list[str]:
    prefix = f"{layout.run_prefix(run)}/phases/"
    return sorted({key[len(prefix) :].split("/", 1)[0] for key in store.list(prefix) if "/logs/attempt-" in key})


def find_target(
    store: Store, run: str, phase: str | None = None, attempt: int | None = None, host: str | None = None
) -> LogTarget:
    """The log to show (see the module doc); :class:`LogsError` naming the logs there are when none fits."""
    child = read_child(store, run)
    host = socket.gethostname() if host is None else host
    if phase is None:
        if child is None:
            there = phases_with_logs(store, run)
            raise LogsError(
                f"run {run!r}: no runner has recorded a child; "
                + (f"give --phase: phases with logs: {', '.join(there)}" if there else "it has no workload log yet")
            )
        phase = child.phase
        attempt = attempt or child.attempt
    elif attempt is None:
        attempts = logged_attempts(store, run, phase)
        if child is not None and child.phase == phase:
            attempts.append(child.attempt)
        if not attempts:
            there = phases_with_logs(store, run)
            raise LogsError(f"no log of phase {phase!r} in run {run!r}; phases with logs: {', '.join(there) or 'none'}")
        attempt = max(attempts)
    local = None
    if child is not None and (child.phase, child.attempt) == (phase, attempt) and child.host == host:
        path = Path(child.log)
        local = path if path.is_file() else None
    target = LogTarget(phase, attempt, layout.log_key(run, phase, attempt), local)
    if local is None and not store.exists(target.key) and not _is_child(child, target):
        raise LogsError(
            f"no log of {phase} attempt {attempt} in run {run!r} (attempts with logs: "
            f"{', '.join(map(str, logged_attempts(store, run, phase))) or 'none'})"
        )
    return target


def _is_child(child: ChildRecord | None, target: LogTarget) -> bool:
    return child is not None and (child.phase, child.attempt) == (target.phase, target.attempt)


class LogReader:
    """Reads one log in pieces of at most :data:`CHUNK_BYTES` from ``offset``: from the local file when the
    target has one, else from the store copy (absent yet = nothing to read yet)."""

    def __init__(self, store: Store, target: LogTarget, offset: int = 0):
        self.store, self.target, self.offset = store, target, offset

    def read(self) -> bytes:
        if self.target.local is not None:
            try:
                with open(self.target.local, "rb") as fh:
                    fh.seek(self.offset)
                    data = fh.read(CHUNK_BYTES)
            except FileNotFoundError:
                data = b""
        else:
            try:
                data = self.store.read_range(self.target.key, self.offset, CHUNK_BYTES)
            except ObjectNotFound:
                data = b""
        self.offset += len(data)
        return data

    def drain(self, out: Callable[[bytes], None]) -> int:
        """Everything there is now, piece by piece; bytes read."""
        total = 0
        while data := self.read():
            out(data)
            total += len(data)
        return total

    def skip_to_tail(self, lines: int, out: Callable[[bytes], None]) -> None:
        """Read to the end, then write only its last ``lines`` lines (each cut to :data:`MAX_LINE_BYTES`)."""
        kept: deque[bytes] = deque(maxlen=max(lines, 0))
        partial = b""
        while data := self.read():
            parts = (partial + data).split(b"\n")
            partial = parts.pop()[:MAX_LINE_BYTES]
            kept.extend(p[:MAX_LINE_BYTES] + b"\n" for p in parts)
        if partial:
            kept.append(partial)
        for line in kept:
            out(line)


class TextOut:
    """Bytes of a log to text (UTF-8, bad bytes replaced, a character split across pieces kept whole)."""

    def __init__(self, write: Callable[[str], None]):
        self.write = write
        self.decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def __call__(self, data: bytes) -> None:
        text = self.decoder.decode(data)
        if text:
            self.write(text)


def _ended(store: Store, run: str, target: LogTarget) -> bool:
    """The attempt has ended: the runner says so, moved on to another child, or no runner holds the run."""
    lock = store.read_lease(layout.lock_key(run))
    if lock is None or not lock.live:
        return True
    child = read_child(store, run)
    return not _is_child(child, target) or (child is not None and child.ended_at is not None)


def show(
    store: Store,
    run: str,
    target: LogTarget,
    write: Callable[[str], None],
    *,
    follow: bool = False,
    follow_run: bool = False,
    tail: int | None = None,
    poll_s: float = POLL_S,
    sleep: Callable[[float], None] = time.sleep,
    host: str | None = None,
) -> None:
    """Write the log of ``target`` (its last ``tail`` lines); with ``follow``, keep writing what is added
    until the attempt ends; with ``follow_run`` too, go on with each next child of the run until no
    runner holds it."""
    out = TextOut(write)
    reader = LogReader(store, target)
    if tail is not None:
        reader.skip_to_tail(tail, out)
    else:
        reader.drain(out)
    while follow:
        if reader.drain(out):
            continue
        if not _ended(store, run, target):
            sleep(poll_s)
            continue
        reader.drain(out)  # what came with the end
        if not follow_run:
            return
        lock = store.read_lease(layout.lock_key(run))
        child = read_child(store, run)
        if lock is None or not lock.live or child is None or _is_child(child, target):
            if lock is not None and lock.live:
                sleep(poll_s)  # the runner holds the run and has not started the next child yet
                continue
            return
        target = find_target(store, run, child.phase, child.attempt, host)
        write(target.header())
        reader = LogReader(store, target)
        out = TextOut(write)
