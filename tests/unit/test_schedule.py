"""The schedule is arithmetic: nothing in resolve/plan/decide grows with the number of steps.

A spec at the upper bounds (a million steps, the most evaluation points, the most cycles) must plan
and decide in a few megabytes; evaluating every step of such a budget is refused up front, naming
the field, without listing a single step. Memory is measured with tracemalloc, never time.
"""

from __future__ import annotations

import json
import tracemalloc
from collections.abc import Callable
from typing import Any

import pytest

from whale.core import layout
from whale.core.alternation import Child, ChildState, Observations, StartPhase, decide
from whale.core.schedule import PLAN_MAX_LISTED, ScheduleError, plan, resolve
from whale.core.spec import MAX_CYCLES, MAX_EVALUATION_POINTS, MAX_STEPS, WhaleRunSpec
from whale.core.status import WhaleRunStatus

SIZES = {"weight": 256 * 10, "harness": 4, "test": 10}  # 10 steps per epoch at promptsPerStep 256
DENSEST = MAX_STEPS // MAX_EVALUATION_POINTS  # the smallest interval allowed over MAX_STEPS
MIB = 1 << 20


def spec_of(condition: str, schedule: dict[str, Any], evaluation: dict[str, Any] | None = None) -> WhaleRunSpec:
    return WhaleRunSpec.model_validate(
        {
            "domain": "synthetic",
            "condition": condition,
            "model": {"name": "tiny"},
            "schedule": schedule,
            "evaluation": evaluation or {},
        }
    )


def peak_bytes(fn: Callable[[], Any]) -> tuple[Any, int]:
    tracemalloc.start()
    try:
        out = fn()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return out, peak


AT_THE_BOUND = {
    "rsft_only": spec_of("rsft_only", {"totalSteps": MAX_STEPS}, {"intervalSteps": DENSEST}),
    "whale-e1": spec_of(
        "whale",
        {"totalSteps": MAX_STEPS, "weightStepsPerCycle": 1, "maxCycles": MAX_CYCLES},
        {"intervalSteps": DENSEST},
    ),
    "adaptive": spec_of(
        "adaptive_whale",
        {
            "totalSteps": MAX_STEPS,
            "maxCycles": MAX_CYCLES,
            "adaptive": {"weight": {"windowSteps": 1, "burnInSteps": 0, "patienceSteps": 1}},
        },
        {"intervalSteps": DENSEST},
    ),
}


def test_evaluation_points_are_a_range_not_a_list():
    sched = resolve(AT_THE_BOUND["rsft_only"], SIZES)
    assert isinstance(sched.eval_points, range) and len(sched.eval_points) == MAX_EVALUATION_POINTS
    assert isinstance(sched.eval_points_between(0, MAX_STEPS), range)
    assert sched.is_eval_point(DENSEST) and not sched.is_eval_point(DENSEST + 1)
    assert not sched.is_eval_point(0) and not sched.is_eval_point(MAX_STEPS + DENSEST)


@pytest.mark.parametrize("interval", [1, 2, 3, 7])
@pytest.mark.parametrize("total", [1, 5, 12])
def test_eval_points_between_is_the_filter_it_replaces(interval, total):
    sched = resolve(spec_of("rsft_only", {"totalSteps": total}, {"intervalSteps": interval}), SIZES)
    every = list(range(interval, total + 1, interval))
    for lo in range(-1, total + 2):
        for hi in range(lo, total + 3):
            assert list(sched.eval_points_between(lo, hi)) == [s for s in every if lo < s <= hi], (lo, hi)


@pytest.mark.parametrize("name", sorted(AT_THE_BOUND))
def test_plan_at_the_bounds_stays_small(name):
    p, peak = peak_bytes(lambda: plan(AT_THE_BOUND[name], SIZES))
    assert peak < 4 * MIB, f"plan() peaked at {peak} bytes"
    assert len(p["phases"]) <= PLAN_MAX_LISTED
    assert len(json.dumps(p)) < 64 * 1024
    assert p["phasesOmitted"] == sum(p["counts"].values()) - len(p["phases"])


def test_plan_counts_and_rollouts_are_exact_at_the_bound():
    p = plan(AT_THE_BOUND["rsft_only"], SIZES)
    assert p["counts"] == {"weight": 1, "harness": 0, "eval": 1 + MAX_EVALUATION_POINTS}
    assert p["rollouts"] == MAX_STEPS * 256 * 8
    p = plan(AT_THE_BOUND["whale-e1"], SIZES)
    # 500 cycles of one step and one harness phase; the evaluation points (every 1000 steps) lie beyond
    assert p["counts"] == {"weight": MAX_CYCLES, "harness": MAX_CYCLES, "eval": 1 + 2 * MAX_CYCLES}
    # incoming evaluation + 5 iterations x 3 proposals, each a 4-episode smoke test (all 4 items) and 4 items
    harness = 4 + (6 - 1) * 3 * (4 + 4)
    assert p["rollouts"] == MAX_CYCLES * (256 * 8 + harness)


def test_a_long_plan_lists_its_first_and_last_entries():
    p = plan(spec_of("rsft_only", {"totalSteps": 10_000}, {"intervalSteps": 10}), SIZES)
    half = PLAN_MAX_LISTED // 2
    assert p["phasesOmitted"] == 1 + 1 + 1000 - PLAN_MAX_LISTED
    assert p["phases"][0] == {"cycle": 0, "kind": "eval", "step": 0, "after": "start"}
    assert p["phases"][1] == {"cycle": 1, "kind": "weight", "fromStep": 0, "toStep": 10_000}
    assert [e["step"] for e in p["phases"][2:half]] == list(range(10, 10 * (half - 1), 10))
    assert [e["step"] for e in p["phases"][half:]] == list(range(10_000 - 10 * (half - 1), 10_001, 10))


def test_a_short_plan_lists_everything():
    p = plan(spec_of("whale", {"totalSteps": 10, "weightStepsPerCycle": 4}, {"intervalSteps": 5}), SIZES)
    assert "phasesOmitted" not in p and len(p["phases"]) == sum(p["counts"].values())


@pytest.mark.parametrize(
    ("evaluation", "field"),
    [
        ({"intervalSteps": 1}, "spec.experiment.evaluation.intervalSteps"),
        ({}, "spec.experiment.evaluation.intervalEpochs"),  # the default, 0.1 epoch = 1 step here
    ],
)
def test_evaluating_every_step_of_the_largest_budget_is_refused_without_listing_it(evaluation, field):
    spec = spec_of("rsft_only", {"totalSteps": MAX_STEPS}, evaluation)
    (exc, peak) = peak_bytes(lambda: pytest.raises(ScheduleError, resolve, spec, SIZES).value)  # noqa: RUF061 - a call, measured
    assert exc.field == field and f"at most {MAX_EVALUATION_POINTS}" in str(exc)
    assert "evaluate every 1000 steps or more" in str(exc)
    assert peak < MIB


def test_a_budget_in_epochs_is_bounded_once_converted():
    spec = spec_of("rsft_only", {"totalEpochs": 2}, {"intervalEpochs": 1})
    with pytest.raises(ScheduleError) as info:
        resolve(spec, {"weight": 256 * MAX_STEPS, "harness": 4})
    assert info.value.field == "spec.experiment.schedule.totalEpochs" and "more than the maximum" in str(info.value)


def test_decide_at_the_bounds_stays_small():
    """The first call (which starts the weight phase with its save steps), then a call with hundreds
    of checkpoints in the store: both within a few megabytes, none of it proportional to totalSteps."""
    spec = AT_THE_BOUND["rsft_only"]
    obs = Observations(run="big", split_sizes=SIZES, now="t")
    first, peak = peak_bytes(lambda: decide(spec, WhaleRunStatus(), obs))
    assert peak < 4 * MIB, f"decide() peaked at {peak} bytes"
    (start,) = [a for a in first.actions if isinstance(a, StartPhase) and a.phase == "c01-weight"]
    assert start.request.weight.save_steps == list(range(DENSEST, MAX_STEPS + 1, DENSEST))

    done = frozenset(range(DENSEST, 300 * DENSEST + 1, DENSEST))
    running = Observations(
        run="big", split_sizes=SIZES, now="t", checkpoints=done, children={"c01-weight": Child(ChildState.RUNNING)}
    )
    later, peak = peak_bytes(lambda: decide(spec, first.status, running))
    assert peak < 8 * MIB, f"decide() peaked at {peak} bytes"
    owed = [e.phase for e in later.status.evals if e.after == "weight"]
    assert owed == [layout.eval_phase_key(1, s, "weight") for s in sorted(done)]


def test_decide_late_in_a_run_of_many_cycles_stays_small():
    """A whale run at its 400th cycle: the status holds 800 main phases and their evaluations."""
    spec = AT_THE_BOUND["whale-e1"]
    done = [
        layout.weight_phase_key(c) if k == "w" else layout.harness_phase_key(c)
        for c in range(1, 401)
        for k in ("w", "h")
    ]
    evals = [
        {"phase": layout.eval_phase_key(c, c, "weight"), "cycle": c, "step": c, "after": "weight", "meanAtK": 0.5}
        for c in range(1, 401)
    ]
    status = WhaleRunStatus.model_validate(
        {
            "phase": "Running",
            "cycle": 400,
            "checkpointStep": 400,
            "completedPhases": done,
            "evals": evals,
            "currentCheckpoint": layout.checkpoint_prefix("big", 400),
            "attempts": {p: 1 for p in done},
        }
    )
    obs = Observations(run="big", split_sizes=SIZES, now="t", checkpoints=frozenset(range(1, 401)))
    decision, peak = peak_bytes(lambda: decide(spec, status, obs))
    assert peak < 8 * MIB, f"decide() peaked at {peak} bytes"
    (start,) = [a for a in decision.actions if isinstance(a, StartPhase)]
    assert start.phase == "c401-weight" and (start.request.weight.from_step, start.request.weight.target_step) == (
        400,
        401,
    )
