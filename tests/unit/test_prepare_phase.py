"""Data preparation as a phase ``decide`` owns: without split sizes the run's one child is ``prepare``,
retried under ``spec.execution.retry.maxAttempts`` and counted in the status like any phase's attempts."""

from __future__ import annotations

from whale.control.planner import KEEP_SERVING, RunEnd, plan
from whale.core.alternation import Child, ChildState, Fail, Observations, StartPhase, decide
from whale.core.layout import PhaseId
from whale.core.protocol import PhaseKind, PrepareRequest, parse_request
from whale.core.spec import WhaleRunSpec
from whale.core.status import Reason, RunPhase, WhaleRunStatus

RUN = "prep"
SIZES = {"weight": 2560, "harness": 4, "test": 10}
SPEC = WhaleRunSpec.model_validate(
    {
        "domain": "synthetic",
        "condition": "rsft_only",
        "model": {"name": "tiny"},
        "schedule": {"totalSteps": 4},
        "retry": {"maxAttempts": 2},
    }
)


def obs(child: Child | None = None, sizes: dict | None = None) -> Observations:
    children = {"prepare": child} if child is not None else {}
    return Observations(run=RUN, children=children, split_sizes=sizes or {}, now="2026-01-01T00:00:00Z")


def test_the_prepare_phase_key_round_trips_and_its_request_samples_nothing() -> None:
    assert PhaseId.prepare().key == "prepare" and PhaseId.parse("prepare") == PhaseId.prepare()
    assert PhaseKind.PREPARE.workload == "prepare"
    [start] = decide(SPEC, WhaleRunStatus(), obs()).of_type(StartPhase)
    assert isinstance(start.request, PrepareRequest) and start.request.samples_from is None
    assert parse_request(start.request.to_wire()) == start.request


def test_without_sizes_the_run_prepares_first_and_waits_pending() -> None:
    first = decide(SPEC, WhaleRunStatus(), obs())
    [start] = first.of_type(StartPhase)
    assert (start.phase, start.kind, start.attempt) == ("prepare", PhaseKind.PREPARE, 1)
    status = first.status
    assert (status.phase, status.reason, status.attempts) == (RunPhase.PENDING, "PreparingData", {"prepare": 1})
    step = plan(first, running=())
    assert step.start == start and step.serve is KEEP_SERVING  # it starts before the run does; serves nothing
    running = decide(SPEC, status, obs(Child(ChildState.RUNNING, name="Job prep-prepare-1")))
    assert running.actions == () and "Job prep-prepare-1 is materialising" in (running.status.message or "")
    assert decide(SPEC, running.status, obs(Child(ChildState.RUNNING, name="Job prep-prepare-1"))) == running
    # the sizes are in the store: the schedule starts (the prepare child is done, whatever it says now)
    started = decide(SPEC, running.status, obs(Child(ChildState.SUCCEEDED), SIZES)).status
    assert started.phase is RunPhase.RUNNING and started.active_phase == "c01-weight"


def test_a_failed_attempt_is_retried_then_the_run_fails_with_prepare_failed() -> None:
    status = decide(SPEC, WhaleRunStatus(), obs()).status
    failed = Child(ChildState.FAILED, "exit code 1: data file missing", name="Job prep-prepare-1")
    retry = decide(SPEC, status, obs(failed))
    [start] = retry.of_type(StartPhase)
    assert start.attempt == 2 and retry.status.failures == {"prepare": 1}
    assert "attempt 1 failed: Job prep-prepare-1: exit code 1: data file missing" in (retry.status.message or "")
    # exit 0 without the sizes is a failure too
    done = decide(SPEC, retry.status, obs(Child(ChildState.SUCCEEDED, name="Job prep-prepare-2")))
    assert done.status.phase is RunPhase.FAILED and done.status.reason == Reason.PREPARE_FAILED
    assert done.status.message == (
        "data preparation failed 2 times (spec.execution.retry.maxAttempts); Job prep-prepare-2: "
        f"it succeeded without writing runs/{RUN}/control/split_sizes.json"
    )
    assert [type(a) for a in done.actions] == [Fail]
    assert decide(SPEC, done.status, obs()).status == done.status  # terminal


def test_a_suspended_run_waits_to_prepare_and_a_running_preparation_is_left_alone() -> None:
    suspended = SPEC.with_sections(**{"suspend": True})
    waiting = decide(suspended, WhaleRunStatus(), obs())
    assert (
        waiting.of_type(StartPhase) == []
        and waiting.status.message == "spec.execution.suspend is true: data preparation waits"
    )
    assert plan(waiting, running=()).end is RunEnd.SUSPENDED
    assert waiting.status.phase is RunPhase.PENDING
    running = decide(suspended, waiting.status, obs(Child(ChildState.RUNNING)))
    assert running.actions == () and "is materialising" in (running.status.message or "")
    [start] = decide(SPEC, waiting.status, obs()).of_type(StartPhase)  # resumed: it starts
    assert start.phase == "prepare"


def test_a_run_whose_preparation_failed_is_retried_from_preparation() -> None:
    """`whale run --retry` (``RunState.retried``) after PrepareFailed: Pending again, the next attempt of
    ``prepare``, then the schedule starts as a fresh run (the start evaluation owed)."""
    from whale.core.state import RunState

    status = decide(SPEC, WhaleRunStatus(), obs()).status
    status = decide(SPEC, status, obs(Child(ChildState.FAILED, "boom"))).status
    failed = decide(SPEC, status, obs(Child(ChildState.FAILED, "boom"))).status
    assert failed.reason == Reason.PREPARE_FAILED
    retried = RunState.from_status(failed).retried().to_status()
    assert (retried.phase, retried.failures, retried.attempts) == (RunPhase.PENDING, {}, {"prepare": 3})
    [start] = decide(SPEC, retried, obs()).of_type(StartPhase)
    assert (start.phase, start.attempt) == ("prepare", 3)
    started = decide(SPEC, retried, obs(Child(ChildState.SUCCEEDED), SIZES)).status
    assert started.phase is RunPhase.RUNNING and started.start_time == "2026-01-01T00:00:00Z"
    assert [e.phase for e in started.evals] == ["eval-c00-s000000-start"]
