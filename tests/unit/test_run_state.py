"""The typed state of the core: PhaseId keys round-trip, RunState transitions return new values and
(de)serialise losslessly, the status reasons and condition types are one enum each."""

from __future__ import annotations

import dataclasses

import pytest

from whale.core import state as state_mod
from whale.core.layout import PhaseId, eval_phase_key, harness_phase_key, weight_phase_key
from whale.core.protocol import PhaseKind
from whale.core.state import RunState, best_eval
from whale.core.status import EvalPoint, Reason, RunPhase, Stage, WhaleRunStatus


@pytest.mark.parametrize(
    ("phase", "key"),
    [
        (PhaseId.weight(1), "c01-weight"),
        (PhaseId.harness(12), "c12-harness"),
        (PhaseId.harness(123), "c123-harness"),
        (PhaseId.eval(0, 0, "start"), "eval-c00-s000000-start"),
        (PhaseId.eval(3, 40, "weight"), "eval-c03-s000040-weight"),
        (PhaseId.eval(1, 0, "harness", 7), "eval-c01-s000000-harness-i0007"),
    ],
)
def test_phase_id_formats_and_parses_its_key(phase: PhaseId, key: str) -> None:
    assert phase.key == str(phase) == key
    assert PhaseId.parse(key) == phase


def test_the_key_helpers_are_phase_ids() -> None:
    assert weight_phase_key(2) == PhaseId(PhaseKind.WEIGHT, 2).key
    assert harness_phase_key(2) == PhaseId(PhaseKind.HARNESS, 2).key
    assert eval_phase_key(2, 5, "weight", 3) == PhaseId(PhaseKind.EVAL, 2, 5, "weight", 3).key


@pytest.mark.parametrize(
    "key",
    [
        "",
        "c1-weight",
        "c01-train",
        "eval-c01-s4-weight",
        "eval-c01-s000004-other",
        "c01-weight-x",
        "../c01-weight",
        "eval-c01-s000004-weight-i7",
    ],
)
def test_not_a_phase_key_is_refused(key: str) -> None:
    with pytest.raises(ValueError, match="not a phase key"):
        PhaseId.parse(key)


def test_only_an_evaluation_has_a_step() -> None:
    with pytest.raises(ValueError, match="only an evaluation"):
        PhaseId(PhaseKind.WEIGHT, 1, step=3)
    with pytest.raises(ValueError, match="not a phase identity"):
        PhaseId(PhaseKind.EVAL, 1)


def full_status() -> WhaleRunStatus:
    return WhaleRunStatus.model_validate(
        {
            "phase": "Running",
            "cycle": 2,
            "stage": "harness",
            "step": 4,
            "activePhase": "c02-harness",
            "completedPhases": ["c01-weight", "c01-harness", "c02-weight"],
            "attempts": {"c02-harness": 2},
            "failures": {"c02-harness": 1},
            "stopRequested": ["c01-harness"],
            "rolloutsCompleted": 40,
            "evals": [
                {"phase": "eval-c00-s000000-start", "cycle": 0, "step": 0, "after": "start", "meanAtK": 0.5, "k": 4},
                {"phase": "eval-c01-s000002-weight", "cycle": 1, "step": 2, "after": "weight"},
            ],
            "integrityFlags": [{"phase": "c01-harness", "candidate": "i02-c1", "reasons": ["[r] x"]}],
            "conditions": [{"type": "Interrupted", "status": "True", "reason": "Signal"}],
            "reason": "Resumed",
            "observedGeneration": 3,
        }
    )


def test_run_state_round_trips_the_status() -> None:
    status = full_status()
    state = RunState.from_status(status)
    assert state.completed_phases == ("c01-weight", "c01-harness", "c02-weight")
    assert state.to_status() == status
    assert RunState.from_status(WhaleRunStatus()).to_status() == WhaleRunStatus()


def test_transitions_return_new_values_and_leave_the_old_one() -> None:
    state = RunState.from_status(full_status())
    retried = state.with_failure("c02-harness").with_retry("c02-harness", "again")
    assert (retried.failures["c02-harness"], retried.attempts["c02-harness"], retried.message) == (2, 3, "again")
    assert (state.failures["c02-harness"], state.attempts["c02-harness"]) == (1, 2)
    preempted = state.with_preemption("eval-c01-s000002-weight")
    assert preempted.attempts["eval-c01-s000002-weight"] == 2 and preempted.preemptions == 1
    assert "eval-c01-s000002-weight" not in state.attempts
    with pytest.raises(AttributeError):
        state.step = 9  # type: ignore[misc]


def test_main_phase_transitions() -> None:
    state = RunState().started("t0")
    assert (state.phase, state.reason, state.start_time) == (RunPhase.RUNNING, Reason.STARTED, "t0")
    state = state.entered(PhaseId.weight(1))
    assert (state.active_phase, state.stage, state.attempts) == ("c01-weight", Stage.WEIGHT, {"c01-weight": 1})
    state = state.weight_done(PhaseId.weight(1), 3, "ck/3", 30, [2])
    assert state.active_phase is None and state.completed_phases == ("c01-weight",)
    assert (state.checkpoint_step, state.rollouts_completed, state.empty_steps_completed, state.last_empty_step) == (
        3,
        30,
        1,
        2,
    )
    done = state.failed(Reason.PHASE_FAILED, "boom", "t1")
    assert done.phase is RunPhase.FAILED and done.to_status().reason == "PhaseFailed"


def test_an_eval_result_updates_best_only_when_better() -> None:
    points = (
        EvalPoint(phase="eval-c00-s000000-start", cycle=0, step=0, after="start"),
        EvalPoint(phase="eval-c01-s000002-weight", cycle=1, step=2, after="weight"),
        EvalPoint(phase="eval-c01-s000004-weight", cycle=1, step=4, after="weight"),
    )
    state = RunState(evals=points).with_eval_result("eval-c01-s000002-weight", 0.5, 4)
    assert state.best is not None and (state.best.phase, state.best.mean_at_k) == ("eval-c01-s000002-weight", 0.5)
    worse = state.with_eval_result("eval-c00-s000000-start", 0.25, 4)
    assert worse.best == state.best and worse.last_eval_mean == 0.25
    better = worse.with_eval_result("eval-c01-s000004-weight", 0.75, 4)
    assert better.best is not None and better.best.phase == "eval-c01-s000004-weight"
    assert better.pending_evals == () and state.pending_evals == (points[0], points[2])
    with pytest.raises(ValueError, match="no result"):
        best_eval(points[0])


def test_an_interrupted_run_resumes_and_a_failed_one_retries() -> None:
    running = RunState().started("t0")
    stopped = running.interrupted(Reason.SIGNAL, "interrupted at t1: SIGTERM", "t1")
    assert (stopped.phase, stopped.reason) == (RunPhase.INTERRUPTED, Reason.INTERRUPTED)
    cond = stopped.interruption()
    assert cond is not None and (cond.reason, cond.last_transition_time) == ("Signal", "t1")
    again = stopped.interrupted(Reason.TIMEOUT, "second", "t2")
    assert [c.reason for c in again.conditions] == ["Timeout"]  # one condition, the latest
    resumed = stopped.taken_over()
    assert (resumed.phase, resumed.reason, resumed.conditions) == (RunPhase.RUNNING, Reason.RESUMED, ())
    assert running.taken_over() is running and resumed.taken_over() is resumed
    done = RunState(phase=RunPhase.SUCCEEDED)
    assert done.interrupted(Reason.SIGNAL, "x", "t") is done

    failed = RunState(
        phase=RunPhase.FAILED,
        reason="PhaseFailed",
        completed_phases=("c01-weight",),
        failures={"c01-weight": 1, "c01-harness": 3},
        attempts={"c01-harness": 3},
        completion_time="t9",
    )
    retried = failed.retried()
    assert (retried.phase, retried.reason, retried.completion_time) == (RunPhase.RUNNING, Reason.RETRIED, None)
    assert retried.failures == {"c01-weight": 1} and retried.attempts == {"c01-harness": 4}
    assert retried.message == "retrying (c01-harness) after: PhaseFailed"
    assert running.retried() is running


def test_the_operator_refuses_or_waits_before_any_phase() -> None:
    first = RunState(completion_time="t0").refused(Reason.INVALID_SPEC, "spec.x: bad", 3, "t1")
    assert (first.phase, first.reason, first.observed_generation, first.completion_time) == (
        RunPhase.FAILED,
        Reason.INVALID_SPEC,
        3,
        "t0",
    )  # the first failure's time stays
    assert RunState().refused(Reason.PREPARE_FAILED, "m", None, "t1").completion_time == "t1"
    waiting = RunState().waiting(Reason.PREPARING_DATA, "Job x is preparing", 2)
    assert (waiting.phase, waiting.reason, waiting.message, waiting.observed_generation) == (
        RunPhase.PENDING,
        Reason.PREPARING_DATA,
        "Job x is preparing",
        2,
    )


def test_a_transition_is_dataclasses_replace_without_its_cost() -> None:
    """``whale.core.state.replace`` (a transition's copy) gives what ``dataclasses.replace`` gives: an equal, frozen,
    new value with every other field kept, and refuses a name that is not a field."""
    before = RunState(cycle=2, attempts={"c02-weight": 1}, completed_phases=("c01-weight",))
    fast = state_mod.replace(before, step=7, active_phase="c02-weight")
    assert fast == dataclasses.replace(before, step=7, active_phase="c02-weight")
    assert fast is not before and before.step == 0 and fast.attempts == {"c02-weight": 1}
    with pytest.raises(dataclasses.FrozenInstanceError):
        fast.step = 8  # type: ignore[misc]
    with pytest.raises(TypeError, match="no_such_field"):
        state_mod.replace(before, no_such_field=1)
    assert RunState.from_status(fast.to_status()) == fast
