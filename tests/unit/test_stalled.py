"""The Stalled condition: True while a phase's child runs and the store shows no progress for
``spec.execution.retry.stallAfterSeconds``, False again on the next metrics line. ``decide`` is given the time
(``Observations.now``), so the tests step it; nothing sleeps."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from pydantic import ValidationError

from whale.core import layout
from whale.core.alternation import Child, ChildState, Observations, StartPhase, decide
from whale.core.spec import WhaleRunSpec
from whale.core.status import ConditionType, WhaleRunStatus
from whale.runner.local import status_summary

from .sim import parsed, weight_line

RUN = "stall"
SIZES = {"weight": 2560, "harness": 4, "test": 10}
T0 = datetime(2026, 1, 1, tzinfo=UTC)
RUNNING = {"c01-weight": Child(ChildState.RUNNING, name="Job stall-c01-weight-1")}


def make_spec(**retry: object) -> WhaleRunSpec:
    return WhaleRunSpec.model_validate(
        {
            "domain": "synthetic",
            "condition": "rsft_only",
            "model": {"name": "tiny"},
            "schedule": {"totalSteps": 10},
            "evaluation": {"atStart": False},
            "retry": retry,
        }
    )


def at(minutes: float) -> str:
    return (T0 + timedelta(minutes=minutes)).strftime("%Y-%m-%dT%H:%M:%SZ")


def observe(minutes: float, lines: list[dict] | None = None, children: dict | None = None) -> Observations:
    metrics = parsed({"c01-weight": lines}) if lines else {}
    return Observations(
        run=RUN, split_sizes=SIZES, now=at(minutes), children=RUNNING if children is None else children, metrics=metrics
    )


def stalled(status: WhaleRunStatus):
    return next((c for c in status.conditions if c.type == ConditionType.STALLED), None)


def test_a_child_without_progress_is_stalled_then_not_after_a_new_metrics_line() -> None:
    spec = make_spec(stallAfterSeconds=3600)
    # the child decided on and launched: that is where the clock starts
    status = decide(spec, WhaleRunStatus(), observe(0, children={})).status
    assert status.last_progress_time == at(0) and "running=c01-weight" in (status.progress_mark or "")
    launched = status
    status = decide(spec, status, observe(1)).status  # the child seen running: what the launch already counted
    assert status.last_progress_time == at(0) and stalled(status) is None
    assert status == launched  # nothing to write (was: a second status write at every child's first sighting)
    status = decide(spec, status, observe(59)).status  # 59 minutes of nothing: not yet
    assert stalled(status) is None and status.last_progress_time == at(0)

    status = decide(spec, status, observe(60)).status
    cond = stalled(status)
    assert cond is not None and cond.status == "True" and cond.reason == "NoProgress"
    assert cond.message == (
        f"no progress in the store for 60 minutes (since {at(0)}, spec.execution.retry.stallAfterSeconds); "
        "phase c01-weight, Job stall-c01-weight-1"
    )
    assert cond.last_transition_time == at(60)
    assert status_summary(status)["stalled"] == cond.message  # `whale status` shows it
    assert status.phase.value == "Running" and status.active_phase == "c01-weight"  # nothing was stopped
    later = decide(spec, status, observe(90)).status
    assert later == status  # level-based: the same world, the same status (the message does not tick)

    status = decide(spec, later, observe(95, [weight_line(1, 0.5)])).status
    cond = stalled(status)
    assert cond is not None and cond.status == "False" and cond.reason == "ProgressSeen"
    assert status.last_progress_time == at(95) and cond.last_transition_time == at(95)
    assert status_summary(status)["stalled"] is None
    # and again, should the next line be as long in coming
    assert stalled(decide(spec, status, observe(95 + 60, [weight_line(1, 0.5)])).status).status == "True"


def test_a_checkpoint_or_a_result_is_progress_and_no_running_child_is_no_stall() -> None:
    spec = make_spec(stallAfterSeconds=600)
    status = decide(spec, WhaleRunStatus(), observe(0, children={})).status
    status = decide(spec, status, observe(1)).status
    with_checkpoint = Observations(run=RUN, split_sizes=SIZES, now=at(10), children=RUNNING, checkpoints=frozenset({2}))
    status = decide(spec, status, with_checkpoint).status
    assert status.last_progress_time == at(10) and stalled(status) is None
    idle = Observations(run=RUN, split_sizes=SIZES, now=at(500), children={}, checkpoints=frozenset({2}))
    assert stalled(decide(spec, status, idle).status) is None  # nothing runs: nothing is stalled


def test_null_never_stalls_and_the_field_is_strict_and_bounded() -> None:
    spec = make_spec(stallAfterSeconds=None)
    status = decide(spec, WhaleRunStatus(), observe(0, children={})).status
    status = decide(spec, status, observe(1)).status
    assert stalled(decide(spec, status, observe(60 * 24 * 30)).status) is None
    assert make_spec().execution.retry.stall_after_seconds == 3600  # the default: an hour
    for bad in (10, "3600", 10**9):
        with pytest.raises(ValidationError, match="stallAfterSeconds"):
            make_spec(stallAfterSeconds=bad)


def test_a_phase_that_ended_is_progress_once_whatever_of_its_lines_the_next_reading_holds() -> None:
    """The reconcile that absorbs a phase's end reads its last metrics lines; the next one, woken by the next child's
    watch event, no longer reads them (``Reading.EVENT``). The same world read twice is no progress: the lines of a
    phase whose child has ended do not count, or every transition moved ``lastProgressTime`` and cost a status write.
    Nor does the next child's first sighting: its start was counted when it was decided."""
    spec = make_spec(stallAfterSeconds=3600)
    status = decide(spec, WhaleRunStatus(), observe(0, children={})).status
    status = decide(spec, status, observe(1, [weight_line(1, 0.5)])).status
    ended = {"c01-weight": Child(ChildState.SUCCEEDED)}
    result = {
        "c01-weight": {
            "finalStep": 2,
            "checkpoint": layout.checkpoint_prefix(RUN, 2),
            "rollouts": 32,
            "stoppedBy": "target",
        }
    }
    lines = parsed({"c01-weight": [weight_line(1, 0.5), weight_line(2, 0.5)]})

    def world(minutes: float, metrics: dict, children: dict) -> Observations:
        return Observations(
            run=RUN,
            split_sizes=SIZES,
            now=at(minutes),
            children=children,
            results=result,
            metrics=metrics,
            checkpoints=frozenset({2}),
        )

    absorbed = decide(spec, status, world(30, lines, ended))
    assert absorbed.status.last_progress_time == at(30)  # the phase's end, its result and checkpoint: progress
    assert "c01-weight" in absorbed.status.completed_phases and absorbed.status.active_phase != "c01-weight"
    [started] = [a.request.phase for a in absorbed.actions if isinstance(a, StartPhase)]
    again = decide(spec, absorbed.status, world(31, {}, ended)).status  # its lines no longer read
    assert again.progress_mark == absorbed.status.progress_mark
    assert again.last_progress_time == at(30)
    assert again == absorbed.status  # nothing to write
    # the next child, started at 30, seen running: counted when it was started, so no progress and nothing to write
    running = decide(spec, again, world(40, {}, {**ended, started: Child(ChildState.RUNNING)})).status
    assert running.last_progress_time == at(30) and running == again
