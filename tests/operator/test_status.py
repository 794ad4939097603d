"""Pure status logic: Job -> ChildState, conditions (transition times), events, the status patch."""

from __future__ import annotations

import pytest

from whale.core.alternation import ChildState, StartPhase, StopPhase
from whale.core.protocol import EvalPhaseArgs, phase_request
from whale.core.status import BestEval, RunPhase, Stage, WhaleRunStatus
from whale_operator import observe
from whale_operator import status as st

#: the least spec a request can be made from
MIN_SPEC = {"domain": "synthetic", "condition": "rsft_only", "model": {"name": "m"}, "schedule": {"totalSteps": 4}}


def job(conditions=(), suspend=False, started=False, deleting=False, phase="c01-weight", attempt=1):
    meta = {"name": f"r-{phase}-{attempt}", "labels": {"whale.dev/phase": phase, "whale.dev/attempt": str(attempt)}}
    if deleting:
        meta["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    status = {"conditions": [{"type": t, "status": "True", "reason": r, "message": m} for t, r, m in conditions]}
    if started:
        status["startTime"] = "2026-01-01T00:00:00Z"
    return {"metadata": meta, "spec": {"suspend": suspend}, "status": status}


@pytest.mark.parametrize(
    "j, state",
    [
        (job(), ChildState.RUNNING),
        (job([("Complete", "", "")]), ChildState.SUCCEEDED),
        (job([("SuccessCriteriaMet", "", "")]), ChildState.SUCCEEDED),
        (job([("Failed", "BackoffLimitExceeded", "Job has reached the specified backoff limit")]), ChildState.FAILED),
        (job([("Failed", "DeadlineExceeded", "Job was active longer than specified deadline")]), ChildState.FAILED),
        (
            job([("Failed", "PodFailurePolicy", "Pod default/p has condition DisruptionTarget matching FailJob rule")]),
            ChildState.PREEMPTED,
        ),
        (job([("Suspended", "JobSuspended", "Job suspended")], suspend=True), ChildState.RUNNING),  # queued
        # suspended with a start time the operator never saw it run with: queued (only the started mark tells an
        # eviction, and an evicted Job is kept anyway: tests/operator/test_kueue.py)
        (job([("Suspended", "JobSuspended", "Job suspended")], suspend=True, started=True), ChildState.RUNNING),
        (job([("Complete", "", "")], deleting=True), ChildState.RUNNING),
    ],
)
def test_job_child_state(j, state):
    assert observe.job_child(j).state is state


def test_failed_child_carries_the_worker_message():
    pods = [
        {
            "status": {
                "containerStatuses": [
                    {"name": "sidecar", "state": {"terminated": {"exitCode": 2, "message": "not this"}}},
                    {
                        "name": "worker",
                        "state": {"terminated": {"exitCode": 1, "message": "trace\nValueError: bad data"}},
                    },
                ]
            }
        }
    ]
    child = observe.job_child(
        job([("Failed", "PodFailurePolicy", "exit code 1")]), observe.failed_pod_message(pods, "worker")
    )
    assert child.message == "PodFailurePolicy: exit code 1; ValueError: bad data"


def test_current_and_stale_jobs():
    jobs = [
        job(phase="c01-weight", attempt=1),
        job(phase="c01-weight", attempt=2),
        job([("Complete", "", "")], phase="eval-c00-s000000-start", attempt=1),
    ]
    attempts = {"c01-weight": 2}
    assert {p: j["metadata"]["name"] for p, j in observe.current_jobs(jobs, attempts).items()} == {
        "c01-weight": "r-c01-weight-2",
        "eval-c00-s000000-start": "r-eval-c00-s000000-start-1",
    }
    assert [j["metadata"]["name"] for j in observe.stale_jobs(jobs, attempts)] == ["r-c01-weight-1"]


def test_conditions_keep_transition_time_unless_they_flip():
    running = WhaleRunStatus(phase=RunPhase.RUNNING, stage=Stage.WEIGHT, cycle=1, active_phase="c01-weight")
    view = st.InferenceView(managed=True, ready=False)
    first = st.with_conditions(running, [], view, 1, "T1")
    same = st.with_conditions(running.model_copy(update={"step": 3}), first.conditions, view, 2, "T2")
    ready = st.with_conditions(running, same.conditions, st.InferenceView(managed=True, ready=True), 2, "T3")
    by = lambda s: {c.type: c for c in s.conditions}  # noqa: E731
    assert [c.type for c in first.conditions] == list(st.CONDITION_TYPES)
    assert by(same)["Progressing"].last_transition_time == "T1"
    assert by(same)["Progressing"].observed_generation == 2
    assert by(ready)["InferenceReady"].status == "True" and by(ready)["InferenceReady"].last_transition_time == "T3"
    assert by(ready)["Progressing"].last_transition_time == "T1"
    done = running.model_copy(update={"phase": RunPhase.SUCCEEDED, "reason": "Completed", "message": "ok"})
    fin = st.with_conditions(done, ready.conditions, view, 2, "T4")
    assert by(fin)["Succeeded"].status == "True" and by(fin)["Succeeded"].last_transition_time == "T4"
    assert by(fin)["Progressing"].status == "False" and by(fin)["InferenceReady"].reason == "ScaledDown"


def test_conditions_build_only_what_changed():
    """A reconcile that changes no condition gets its status back as it was; one that changes one condition rebuilds
    that one alone, and the result is what a status built from scratch holds."""
    running = WhaleRunStatus(phase=RunPhase.RUNNING, stage=Stage.WEIGHT, cycle=1, active_phase="c01-weight")
    view = st.InferenceView(managed=True, ready=False)
    first = st.with_conditions(running, [], view, 1, "T1")
    assert st.with_conditions(first, first.conditions, view, 1, "T2") is first
    ready = st.with_conditions(first, first.conditions, st.InferenceView(managed=True, ready=True), 1, "T3")
    kept = [a is b for a, b in zip(ready.conditions, first.conditions, strict=True)]
    assert kept == [c.type != "InferenceReady" for c in first.conditions]
    assert ready == st.with_conditions(running, first.conditions, st.InferenceView(managed=True, ready=True), 1, "T3")
    # a new generation is written on every condition; a condition whose status flips gets the time of the flip
    again = st.with_conditions(ready, ready.conditions, view, 2, "T4")
    assert all(c.observed_generation == 2 for c in again.conditions)
    by = {c.type: c for c in again.conditions}
    assert by["InferenceReady"].last_transition_time == "T4" and by["Progressing"].last_transition_time == "T1"


def test_events_describe_transitions():
    before = WhaleRunStatus(phase=RunPhase.PENDING)
    after = WhaleRunStatus(
        phase=RunPhase.RUNNING,
        preemptions=1,
        best=BestEval(mean_at_k=0.3, k=8, phase="eval-c00-s000000-start", cycle=0, step=0),
    )
    req = phase_request(
        MIN_SPEC,
        run="r",
        phase="eval-c00-s000000-start",
        attempt=2,
        args=EvalPhaseArgs(cycle=0, step=0, after="start", checkpoint=None, harness=None),
    )
    evs = st.events(before, after, (StartPhase(req), StopPhase("c01-weight", "patience")))
    assert [(e.type, e.reason) for e in evs] == [
        ("Normal", "Started"),
        ("Warning", "Preempted"),
        ("Normal", "NewBest"),
        ("Warning", "PhaseRetried"),
        ("Normal", "StopRequested"),
    ]


def test_status_merge_patch_clears_removed_fields():
    old = {"phase": "Running", "activePhase": "c01-weight", "attempts": {"a": 1}, "best": {"k": 8, "harness": "h"}}
    new = {"phase": "Running", "attempts": {"a": 2}, "best": {"k": 8}}
    assert st.merge_patch(old, new) == {"activePhase": None, "attempts": {"a": 2}, "best": {"harness": None}}
    assert st.merge_patch(new, new) == {}


def queue_conds(view):
    return {t: (s, r, m) for t, s, r, m in st.queue_conditions(view)}


def test_queued_and_admitted_follow_the_run_s_queue():
    no_queue = queue_conds(st.QueueView(None))
    assert no_queue["Queued"][:2] == ("False", "NoQueue") and no_queue["Admitted"][:2] == ("False", "NoQueue")
    absent = queue_conds(st.QueueView("gpu", served=False))
    assert absent["Queued"][:2] == ("True", "KueueNotInstalled") and "install Kueue" in absent["Queued"][2]
    waiting = queue_conds(st.QueueView("gpu", waiting=("Job r-c01-weight-1 waits for admission; Kueue: no quota",)))
    assert waiting["Queued"][:2] == ("True", "WaitingForAdmission") and "Kueue: no quota" in waiting["Queued"][2]
    assert waiting["Admitted"][:2] == ("False", "WaitingForAdmission")
    admitted = queue_conds(st.QueueView("gpu", admitted=("Job r-c01-weight-1",)))
    assert admitted["Queued"][:2] == ("False", "Admitted") and admitted["Admitted"][:2] == ("True", "Admitted")
    assert "LocalQueue gpu" in admitted["Admitted"][2]
    evicted = queue_conds(st.QueueView("gpu", evicted=("Job r-c01-weight-1 evicted 1 time(s) (last: Preempted)",)))
    assert evicted["Queued"][:2] == ("True", "Evicted") and evicted["Admitted"][:2] == ("False", "Evicted")
    # an evaluation admitted while the weight phase waits again: both true, the eviction said
    both = queue_conds(st.QueueView("gpu", evicted=("Job w evicted",), admitted=("Job e",)))
    assert both["Queued"][:2] == ("True", "Evicted") and both["Admitted"][:2] == ("True", "Admitted")
    idle = queue_conds(st.QueueView("gpu"))
    assert idle["Queued"][:2] == ("False", "NoChild") and idle["Admitted"][:2] == ("False", "NoChild")
    missing = queue_conds(st.QueueView("gpu", queue_missing=("Job r-c01-weight-1",), namespace="team-a"))
    assert missing["Queued"][:2] == ("True", "LocalQueueNotFound") and missing["Admitted"][:2] == (
        "False",
        "LocalQueueNotFound",
    )
    assert (
        "no LocalQueue gpu in namespace team-a" in missing["Queued"][2] and "Job r-c01-weight-1" in missing["Queued"][2]
    )
    long = queue_conds(st.QueueView("gpu", waiting=("x" * 5000,)))
    assert len(long["Queued"][2]) == 1000


def test_a_queue_view_reads_each_child_as_the_queue_holds_it():
    from whale.core.alternation import Child
    from whale_operator import kueue

    suspended = {"metadata": {"name": "j"}, "spec": {"suspend": True}, "status": {}}
    running = {"metadata": {"name": "j"}, "spec": {"suspend": False}, "status": {"active": 1}}
    facts = kueue.WorkloadFacts(
        "job-j-1", evicted="Preempted: to accommodate w", pending="insufficient quota", requeue_at="T", active=False
    )
    view = st.QueueView("gpu").with_child("Job j", running, Child(ChildState.RUNNING), None)
    assert view.admitted == ("Job j",)
    view = view.with_child("Job k", suspended, Child(ChildState.RUNNING, evictions=2), facts)
    (line,) = view.evicted
    assert "Job k evicted 2 time(s) (last: Preempted: to accommodate w)" in line
    assert "deactivated" in line and "requeued by Kueue at T" in line and "insufficient quota" in line
    view = view.with_child("Job l", suspended, Child(ChildState.RUNNING), None)
    assert view.waiting == ("Job l waits for admission",)
    no_queue = kueue.WorkloadFacts("job-m-1", pending="LocalQueue gpu doesn't exist", missing_queue="gpu")
    view = view.with_child("Job m", suspended, Child(ChildState.RUNNING), no_queue)
    assert view.queue_missing == ("Job m",) and view.waiting == ("Job l waits for admission",)


def test_without_a_queue_view_the_queue_conditions_stay_as_they_were():
    first = st.with_conditions(
        WhaleRunStatus(), [], st.InferenceView(False), 1, "t0", st.QueueView("gpu", waiting=("Job j waits",))
    )
    kept = st.with_conditions(first, first.conditions, st.InferenceView(False), 1, "t1")
    cond = {c.type: c for c in kept.conditions}
    assert cond["Queued"].status == "True" and cond["Queued"].last_transition_time == "t0"
    fresh = st.with_conditions(WhaleRunStatus(), [], st.InferenceView(False), 1, "t0")
    assert {c.type: c.reason for c in fresh.conditions}["Queued"] == "NoChild"
