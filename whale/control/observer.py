"""One observer of a run's store, for both controllers (the store is the truth; see docs/storage.md)."""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Collection, Iterable, Mapping
from typing import Any

from pydantic import ValidationError

from whale.core import layout
from whale.core.alternation import Child, ChildState, Observations
from whale.core.layout import PhaseId
from whale.core.protocol import PhaseKind, PhaseMetrics, parse_metrics_line
from whale.core.status import WhaleRunStatus
from whale.store import ObjectNotFound, Store

log = logging.getLogger(__name__)


def _problem(exc: ValidationError) -> str:
    """The first field a line got wrong, by its wire name, and why."""
    err = exc.errors()[0]
    where = ".".join(str(p) for p in err.get("loc", ())) or "the line"
    return f"field {where}: {err.get('msg', 'invalid')}"


def read_metrics(
    store: Store, run: str, phase: str, warned: set[tuple[str, int]] | None = None
) -> tuple[PhaseMetrics, ...]:
    """The metrics lines of ``phase``, each parsed into its kind's model (``whale.core.protocol``).

    A line that does not parse (not JSON, or not its model) is skipped with a warning naming the phase, the
    line and the field (never an error: the run goes on from the lines that do); ``warned`` remembers the
    lines already warned about, so a controller that re-reads every poll warns once per line."""
    return MetricsLines(phase).read(store, run, warned)


class MetricsLines:
    """One phase's metrics lines as last read: a digest of the file's bytes up to its last newline and the lines
    they parsed to, so that the next reading parses only what was appended. A weight phase's file grows by a
    line a step (420 in one phase of an ``rsft_only`` example) and a controller reads it at every progress poll;
    parsing them all again cost about 8 µs a line (3.5 ms at 420, ``benchmarks/metrics_read.py``). Should the
    file not begin with the bytes read before (a phase's attempt begun again writes it afresh), it is parsed whole.
    Holds 16 bytes of digest, not the file."""

    def __init__(self, phase: str):
        self.phase = phase
        self.kind = PhaseId.parse(phase).kind
        self._size = 0  # bytes parsed, up to and with the last newline
        self._digest = b""
        self._count = 0  # lines in those bytes, for the warnings' line numbers
        self._lines: tuple[PhaseMetrics, ...] = ()
        #: what the last reading returned (None: not read yet), for a controller that need not read it again
        self.last: tuple[PhaseMetrics, ...] | None = None

    def read(self, store: Store, run: str, warned: set[tuple[str, int]] | None = None) -> tuple[PhaseMetrics, ...]:
        """The phase's lines now (a file not written yet: none), parsing what was appended since the last reading."""
        self.last = self._read(store, run, warned)
        return self.last

    def _read(self, store: Store, run: str, warned: set[tuple[str, int]] | None) -> tuple[PhaseMetrics, ...]:
        if self.kind is PhaseKind.PREPARE:
            return ()  # data preparation writes no metrics lines
        key = layout.metrics_key(run, self.phase)
        try:
            data = store.read_bytes(key)
        except ObjectNotFound:
            return ()  # nothing logged yet
        view = memoryview(data)
        digest = hashlib.blake2b(view[: self._size], digest_size=16)  # one pass: checked, then carried on
        if not (self._size and len(data) >= self._size and digest.digest() == self._digest):
            self._size, self._digest, self._count, self._lines = 0, b"", 0, ()
            digest = hashlib.blake2b(digest_size=16)
        whole = data.rfind(b"\n") + 1  # the complete lines; a last line without its newline is parsed, not kept
        if whole > self._size:
            head, count = self._parse(data[self._size : whole], self._count, key, warned)
            self._lines, self._count = self._lines + head, self._count + count
            digest.update(view[self._size : whole])
            self._size, self._digest = whole, digest.digest()
        tail = self._parse(data[whole:], self._count, key, warned)[0] if whole < len(data) else ()
        return self._lines + tail

    def _parse(
        self, chunk: bytes, before: int, key: str, warned: set[tuple[str, int]] | None
    ) -> tuple[tuple[PhaseMetrics, ...], int]:
        """The lines of ``chunk`` that parse, and how many lines it holds, numbered from ``before`` + 1 (a chunk
        begins at a line's start: a newline is one byte in UTF-8, never part of another character)."""
        out: list[PhaseMetrics] = []
        lines = chunk.decode("utf-8", "replace").splitlines()
        for number, line in enumerate(lines, before + 1):
            if not line.strip():
                continue
            try:
                out.append(parse_metrics_line(self.kind, json.loads(line)))
            except ValueError as exc:  # not JSON, or pydantic's ValidationError (a ValueError): not its model
                if warned is None or (self.phase, number) not in warned:
                    why = _problem(exc) if isinstance(exc, ValidationError) else f"not valid JSON: {exc}"
                    log.warning("phase %s: ignoring line %d of %s (%s)", self.phase, number, key, why)
                    if warned is not None:
                        warned.add((self.phase, number))
        return tuple(out), len(lines)


class StoreObserver:
    """Reads what the workloads of one run wrote, as ``decide()`` observations.

    Reads only what can still change the status: the result of each phase not yet absorbed into it
    (a finished phase's result is never re-read), the running main phase's metrics lines, and the
    complete checkpoints — cached, since a complete checkpoint never changes."""

    def __init__(self, store: Store, run: str):
        self.store = store
        self.run = run
        self._complete: set[int] = set()
        self._warned: set[tuple[str, int]] = set()
        #: the results last read (:meth:`results`), for an observation that need not read them again
        self._results: dict[str, dict[str, Any]] = {}
        #: each phase's metrics lines as last read and parsed (:meth:`read_metrics`; :meth:`metrics`, ``ended``), for
        #: the phases still read
        self._parsed: dict[str, MetricsLines] = {}
        #: the phases whose result has been read at least once (:meth:`results`, ``ended``)
        self._read: set[str] = set()
        #: the run's phases have been listed once (:meth:`results`)
        self._listed = False
        #: the run's checkpoints have been listed once (:meth:`checkpoints`)
        self._checkpoints_listed = False

    def results(
        self,
        status: WhaleRunStatus,
        children: Mapping[str, Child] | None = None,
        absorbed: set[str] | None = None,
        ended: Collection[str] | None = None,
    ) -> dict[str, dict[str, Any]]:
        """result.json of every phase not yet absorbed into ``status``. The run's phases are listed in the store at
        this observer's first reading, and again whenever ``status`` counts no attempt (a new run, or a status begun
        again): what the store holds then is taken in whatever the status says. After that only the phases in flight
        can have a result to read: those the status launched (``attempts`` lists every phase it started) or has a
        child of, less those it absorbed. So a reading costs what runs now, not the run's length (a listing of every
        phase grew by a phase at each transition: 0.35 ms more a reconcile 35 transitions in, on a local disk).
        ``absorbed``: :func:`absorbed_phases` of ``status``, when the caller has it. ``ended``: the phases whose child the
        caller sees ended; only their results are read, and those of phases never read here yet: a phase's result
        counts once its child has ended, and that end is what makes the caller look again, so the last reading of the
        others stands (on S3 a result not yet written is a request answered "no such key" at each reconcile of a
        phase that runs for hours). None: every phase in flight is read."""
        if absorbed is None:
            absorbed = absorbed_phases(status)
        in_flight = set(status.attempts) | set(children or ())
        if status.active_phase:
            in_flight.add(status.active_phase)
        if self._listed and status.attempts:
            phases = sorted(in_flight)
        else:
            phases = [
                entry.rstrip("/").rsplit("/", 1)[-1]
                for entry in self.store.list(layout.phases_prefix(self.run), recursive=False)
            ]
            self._listed = True
            self._read |= in_flight - set(phases)  # the listing read them: nothing of theirs in the store
        out: dict[str, dict[str, Any]] = {}
        for phase in phases:
            if phase in absorbed:
                continue
            if ended is not None and phase not in ended and phase in self._read:
                if phase in self._results:
                    out[phase] = self._results[phase]
                continue
            self._read.add(phase)
            raw = self.store.read_json_or_none(layout.result_key(self.run, phase))
            if raw is not None:
                out[phase] = raw
        self._results = out
        return out

    def metrics(
        self,
        status: WhaleRunStatus,
        children: Mapping[str, Child] | None = None,
        ended: Collection[str] | None = None,
        *,
        everything: bool = True,
    ) -> dict[str, tuple[PhaseMetrics, ...]]:
        """The metrics lines, parsed, of the main phase in progress and of every phase whose child runs
        (an evaluation's lines are its progress, for the Stalled condition). ``ended`` (a controller woken by something
        else than the passing of time, :meth:`results`): only the lines of those phases and of phases not read here
        yet are read; the others' last reading stands until the next progress poll (``ended`` None) reads them.
        ``everything`` False (any reading but a controller's full one): a main phase without a child (one waiting for an
        evaluation to finish first, or for its next attempt) keeps its last reading, as only a child writes its lines
        (on S3 each poll read it again: a request answered "no such key" for as long as the evaluation ran)."""
        children = children or {}
        phases = {p for p, c in children.items() if c.state is ChildState.RUNNING}
        if status.active_phase:
            phases.add(status.active_phase)
        out: dict[str, tuple[PhaseMetrics, ...]] = {}
        for phase in sorted(phases):
            held = parsed.last if (parsed := self._parsed.get(phase)) is not None else None
            stands = (ended is not None and phase not in ended) or (not everything and phase not in children)
            out[phase] = held if held is not None and stands else self.read_metrics(phase)
        for gone in self._parsed.keys() - phases:
            del self._parsed[gone]  # a phase no longer read: what was parsed of it is let go
        return out

    def read_metrics(self, phase: str) -> tuple[PhaseMetrics, ...]:
        """:func:`read_metrics` of one phase, warning once per line that does not parse; what was parsed at this
        observer's last reading of it is not parsed again (:class:`MetricsLines`)."""
        parsed = self._parsed.get(phase)
        if parsed is None:
            parsed = self._parsed[phase] = MetricsLines(phase)
        return parsed.read(self.store, self.run, self._warned)

    def checkpoints(self, phases: Iterable[str] | None = None) -> frozenset[int]:
        """Steps with a COMPLETE checkpoint. ``phases``: the phases in flight (their children, their results not yet
        absorbed); only a weight phase writes checkpoints, so while none of them is one the store is not listed again
        after a first listing (a run keeps its checkpoints until it succeeds: a listing grew with the run's length).
        None: listed whatever runs."""
        if phases is not None and self._checkpoints_listed and not any(_writes_checkpoints(p) for p in phases):
            return frozenset(self._complete)
        self._checkpoints_listed = True
        for entry in self.store.list(layout.checkpoints_prefix(self.run) + "/", recursive=False):
            step = layout.parse_checkpoint_step(entry.rstrip("/").rsplit("/", 1)[-1])
            if (
                step is not None
                and step not in self._complete
                and self.store.exists(layout.checkpoint_complete_key(self.run, step))
            ):
                self._complete.add(step)
        return frozenset(self._complete)

    def observe(
        self,
        status: WhaleRunStatus,
        children: Mapping[str, Child],
        split_sizes: Mapping[str, int],
        now: str,
        generation: int | None = None,
        *,
        results: bool = True,
        ended: Collection[str] | None = None,
        progress: bool = True,
        checkpoints: bool = True,
    ) -> Observations:
        """Everything ``decide`` needs, with the controller's view of the children. ``results`` False: the phases'
        results are those read last time, less the ones ``status`` has absorbed since (a controller that knows no
        child has finished since: a phase writes its result before its child ends). ``ended``: the phases whose child
        has ended, the only ones whose results are read again (:meth:`results`). ``progress`` False (with ``ended``):
        what a running phase writes is not read again either — its metrics lines (:meth:`metrics`), its checkpoints —
        but for the phases in ``ended``: a controller woken by something else than the passing of time (a watch
        event); a line or a checkpoint written mid-phase is found by the next progress poll. ``checkpoints`` False
        (with ``ended``): a running weight phase's checkpoints are not listed either, by a poll too (nothing of its is
        evaluated before it ends: :func:`whale.core.alternation.evaluates_mid_phase`)."""
        absorbed = absorbed_phases(status)
        read = (
            self.results(status, children, absorbed, ended)
            if results
            else {k: v for k, v in self._results.items() if k not in absorbed}
        )
        in_flight = [*children, *read]
        if ended is not None and not (progress and checkpoints):
            in_flight = [p for p in in_flight if p in ended]
        return Observations(
            run=self.run,
            children=dict(children),
            results=read,
            metrics=self.metrics(status, children, None if progress else ended, everything=ended is None),
            checkpoints=self.checkpoints(in_flight),
            split_sizes=dict(split_sizes),
            now=now,
            generation=generation,
        )


def _writes_checkpoints(phase: str) -> bool:
    """Whether the phase keyed ``phase`` is one that writes checkpoints (a weight phase)."""
    try:
        return PhaseId.parse(phase).kind is PhaseKind.WEIGHT
    except ValueError:  # not a phase key: not known not to write any
        return True


def absorbed_phases(status: WhaleRunStatus) -> set[str]:
    """The phases whose results ``status`` already holds (never read again)."""
    return set(status.completed_phases) | {e.phase for e in status.evals if e.mean_at_k is not None}
