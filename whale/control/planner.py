"""What a controller does with a ``decide()`` answer — the same for the local runner and the operator.

``decide`` is level-based and asks for every child that should exist; a controller runs ONE phase
child at a time (they share the machine or the inference server), owed evaluations first, since they
report on points the run has already passed. :func:`plan` makes that choice once for both; each
controller then carries it out its own way (a subprocess or a Job).
"""

from __future__ import annotations

import enum
from collections.abc import Collection, MutableMapping
from dataclasses import dataclass
from typing import Any

from whale.core import layout
from whale.core.alternation import Fail, Finish, ServeCheckpoint, StartPhase, StopPhase, SuspendRun, Transition
from whale.core.protocol import PhaseKind, PhaseRequest
from whale.core.retention import prunable
from whale.core.spec import KeepCheckpoints
from whale.core.status import RunPhase, WhaleRunStatus
from whale.store import Store


class RunEnd(str, enum.Enum):
    """Why a controller's loop over one run ends (None: it goes on)."""

    FINISHED = "finished"
    FAILED = "failed"
    SUSPENDED = "suspended"


#: a plan with nothing to serve
KEEP_SERVING = object()


@dataclass(frozen=True)
class Plan:
    """What to do now, in this order: write the stop requests; on ``end``, stop every child; make
    inference serve ``serve`` (when it is not ``KEEP_SERVING``); start ``start``."""

    #: the one child to start now (None: one runs already, or nothing is asked for)
    start: StartPhase | None
    stops: tuple[StopPhase, ...]
    #: the checkpoint the inference server must serve now (None: the base model), or KEEP_SERVING
    serve: object
    end: RunEnd | None
    #: why the run ends (the action's reason), for the controller's log
    end_reason: str = ""


def plan(decision: Transition, running: Collection[str]) -> Plan:
    """The plan for ``decision`` when the phases ``running`` have a child that runs now.

    A start is chosen only while the run is Running (or Pending: its data preparation), and only when no
    other phase's child runs; among
    the starts, owed evaluations come first. The server serves what that child samples from, or else
    the checkpoint ``decide`` asks for."""
    end: RunEnd | None = None
    end_reason = ""
    serve: object = KEEP_SERVING
    for action in decision.actions:
        if isinstance(action, SuspendRun):
            end, end_reason = RunEnd.SUSPENDED, action.reason
        elif isinstance(action, Finish):
            end, end_reason = RunEnd.FINISHED, action.reason
        elif isinstance(action, Fail):
            end, end_reason = RunEnd.FAILED, action.message
        elif isinstance(action, ServeCheckpoint):
            serve = action.checkpoint
    start = None
    phase = decision.status.phase
    if phase is RunPhase.RUNNING or phase is RunPhase.PENDING:
        starts = sorted(decision.of_type(StartPhase), key=lambda a: a.kind is not PhaseKind.EVAL)
        if phase is RunPhase.PENDING:  # before the run starts only its data preparation does
            starts = [a for a in starts if a.kind is PhaseKind.PREPARE]
        start = next((a for a in starts if not set(running) - {a.phase}), None)
    if start is not None and start.kind is not PhaseKind.PREPARE:  # data preparation samples nothing
        serve = start.request.samples_from
    return Plan(start=start, stops=tuple(decision.of_type(StopPhase)), serve=serve, end=end, end_reason=end_reason)


def write_stop(store: Store, run: str, action: StopPhase) -> None:
    """Ask the running workload of ``action.phase`` to end cleanly (it checks between steps)."""
    store.write_text(layout.stop_key(run, action.phase), action.reason + "\n")


def write_request(
    store: Store, run: str, request: PhaseRequest, written: MutableMapping[str, Any] | None = None
) -> None:
    """The request the child reads first thing: written before its launch, only when it differs. ``written``: what
    this writer (the request's one writer) wrote before, by key: a request equal to it is not written again, any other
    is written without reading the store first (a request is the same for the same decision, so writing one that is
    there already changes nothing; on S3 the read is a request, "no such key" at each new phase). None: the store is
    read to compare."""
    key = layout.request_key(run, request.phase)
    wire = request.to_wire()
    if written is not None:
        if written.get(key) != wire:
            store.write_json(key, wire)
            written[key] = wire
        return
    if store.read_json_or_none(key) != wire:
        store.write_json(key, wire)


def prune_checkpoints(store: Store, run: str, status: WhaleRunStatus, keep: KeepCheckpoints) -> tuple[int, ...]:
    """Delete the checkpoints a Succeeded run does not keep (:func:`whale.core.retention.prunable`); returns
    their steps. Idempotent: a second call finds nothing to delete."""
    present = []
    for entry in store.list(layout.checkpoints_prefix(run) + "/", recursive=False):
        step = layout.parse_checkpoint_step(entry.rstrip("/").rsplit("/", 1)[-1])
        if step is not None:
            present.append(step)
    steps = prunable(status, present, keep)
    for step in steps:
        store.delete_prefix(layout.checkpoint_prefix(run, step) + "/")
    return steps
