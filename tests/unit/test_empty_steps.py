"""RSFT steps that keep no trajectory: counted in the status while a weight phase runs (from its metrics
lines) and after it ends (from its result), level-based like the rest of ``decide``."""

from __future__ import annotations

from whale.core import layout
from whale.core.alternation import Child, ChildState, Observations, decide
from whale.core.spec import WhaleRunSpec
from whale.core.status import WhaleRunStatus
from whale.rsft.phase import empty_steps, step_lines
from whale.runner.local import status_summary

from .sim import parsed, weight_line

RUN = "empty"
SIZES = {"weight": 256 * 10, "harness": 4, "test": 10}
SPEC = WhaleRunSpec.model_validate(
    {
        "domain": "synthetic",
        "condition": "whale",
        "model": {"name": "tiny"},
        "schedule": {"totalSteps": 6, "weightStepsPerCycle": 3},
        "evaluation": {"atStart": False, "intervalSteps": 1000},
    }
)


def line(step: int, kept: int) -> dict:
    return weight_line(step, 0.0 if kept == 0 else 0.5, kept=kept, rollouts=4)


def observe(metrics: dict | None = None, **kw) -> Observations:
    return Observations(run=RUN, split_sizes=SIZES, metrics=parsed(metrics or {}), **kw)


def test_the_running_phase_counts_its_empty_steps_from_its_metrics() -> None:
    status = decide(SPEC, WhaleRunStatus(), observe()).status
    assert status.active_phase == "c01-weight" and status.empty_steps == 0 and status.last_empty_step is None
    running = {"c01-weight": Child(ChildState.RUNNING)}
    metrics = {"c01-weight": [line(1, 0), line(2, 3), line(3, 0)]}
    after = decide(SPEC, status, observe(children=running, metrics=metrics)).status
    assert (after.empty_steps, after.empty_steps_completed, after.last_empty_step) == (2, 0, 3)
    assert decide(SPEC, after, observe(children=running, metrics=metrics)).status == after  # level-based
    summary = status_summary(after)["emptySteps"]
    assert summary.startswith("2 RSFT step(s) kept no trajectory (last: step 3)")


def test_finished_phases_count_from_their_result_and_add_to_the_running_one() -> None:
    status = decide(SPEC, WhaleRunStatus(), observe()).status
    result = {"finalStep": 3, "checkpoint": layout.checkpoint_prefix(RUN, 3), "rollouts": 12, "emptySteps": [1, 3]}
    done = decide(SPEC, status, observe(results={"c01-weight": result}, checkpoints=frozenset({3}))).status
    assert (done.empty_steps, done.empty_steps_completed, done.last_empty_step) == (2, 2, 3)
    assert done.active_phase == "c01-harness"
    harness = {
        "acceptedHarness": "runs/empty/harnesses/a.py",
        "acceptedCandidate": "i1",
        "acceptedScore": 0.1,
        "iterations": 6,
        "rollouts": 24,
    }
    results = {"c01-weight": result, "c01-harness": harness}
    second = decide(SPEC, done, observe(results=results, checkpoints=frozenset({3}))).status
    assert second.active_phase == "c02-weight"
    metrics = {"c02-weight": [line(4, 2), line(5, 0)]}
    running = decide(
        SPEC,
        second,
        observe(
            results=results,
            checkpoints=frozenset({3}),
            metrics=metrics,
            children={"c02-weight": Child(ChildState.RUNNING)},
        ),
    ).status
    assert (running.empty_steps, running.empty_steps_completed, running.last_empty_step) == (3, 2, 5)


def test_a_result_from_before_the_field_and_lines_without_kept_count_nothing() -> None:
    status = decide(SPEC, WhaleRunStatus(), observe()).status
    old = {"finalStep": 3, "checkpoint": layout.checkpoint_prefix(RUN, 3), "rollouts": 12}
    done = decide(SPEC, status, observe(results={"c01-weight": old}, checkpoints=frozenset({3}))).status
    assert (done.empty_steps, done.last_empty_step) == (0, None)
    assert status_summary(done)["emptySteps"] is None
    assert empty_steps(step_lines([{"step": 2}, line(1, 0), line(4, 1), line(3, 0)])) == [1, 3]
