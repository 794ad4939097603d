"""Kueue's view of a Job: created suspended under a queue, and an eviction after the start is told apart
from waiting for admission even though Kueue clears ``status.startTime`` when it evicts; each eviction is counted
once, on the Job that is kept; Kueue's own words are read from its Workload."""

from __future__ import annotations

from typing import Any

from whale.core.alternation import ChildState
from whale_operator import kueue, observe


def job(*, suspend: bool, annotations=None, start: str | None = None, active: int = 0, conditions=()):
    status: dict[str, Any] = {
        "conditions": [{"type": t, "status": s, "reason": r, "message": m} for t, s, r, m in conditions]
    }
    if start:
        status["startTime"] = start
    if active:
        status["active"] = active
    return {
        "metadata": {"name": "j", "annotations": dict(annotations or {})},
        "spec": {"suspend": suspend},
        "status": status,
    }


QUEUED = job(suspend=True, conditions=[("Suspended", "True", "JobSuspended", "Job suspended")])
ADMITTED = job(
    suspend=False,
    start="2026-12-03T09:00:00Z",
    active=1,
    conditions=[("Suspended", "False", "JobResumed", "Job resumed")],
)


def test_a_queued_job_is_not_evicted_and_is_not_marked():
    assert kueue.suspended(QUEUED) and kueue.evicted(QUEUED) is None
    assert not kueue.needs_started_mark(QUEUED)


def test_an_admitted_job_is_marked_once():
    assert kueue.needs_started_mark(ADMITTED)
    marked = {
        **ADMITTED,
        "metadata": {"annotations": kueue.started_patch("2026-12-03T09:00:05Z")["metadata"]["annotations"]},
    }
    assert not kueue.needs_started_mark(marked) and kueue.evicted(marked) is None


def test_an_eviction_is_seen_after_the_start_time_is_cleared():
    # what Kueue's preemption leaves: suspend again, startTime gone, our mark still there
    evicted = job(
        suspend=True,
        annotations={kueue.STARTED_ANNOTATION: "2026-12-03T09:00:05Z"},
        conditions=[("Suspended", "True", "JobSuspended", "Job suspended")],  # the Job controller's own words
    )
    assert kueue.evicted(evicted) == "Job suspended"
    # without the mark the same object reads as queued: the mark is what tells them apart
    unmarked = {**evicted, "metadata": {"annotations": {}}}
    assert kueue.evicted(unmarked) is None
    # a Job suspended with a start time it never showed the operator running is queued, not evicted: counting it
    # would count it again at every reconcile until Kueue clears the start time
    early = job(suspend=True, start="2026-12-03T09:00:00Z", conditions=[("Suspended", "True", "JobSuspended", "")])
    assert kueue.evicted(early) is None


def test_an_eviction_is_counted_once_on_the_job_and_the_next_admission_is_a_new_start():
    evicted = job(
        suspend=True,
        annotations={kueue.STARTED_ANNOTATION: "2026-12-03T09:00:05Z"},
        conditions=[("Suspended", "True", "JobSuspended", "Job suspended")],
    )
    patch = kueue.eviction_patch(evicted)
    assert patch == {"metadata": {"annotations": {kueue.STARTED_ANNOTATION: None, kueue.EVICTIONS_ANNOTATION: "1"}}}
    counted = job(
        suspend=True,
        annotations={kueue.EVICTIONS_ANNOTATION: "1"},
        conditions=[("Suspended", "True", "JobSuspended", "Job suspended")],
    )
    # seen again before Kueue re-admits it: nothing new to count
    assert kueue.evicted(counted) is None and kueue.evictions(counted) == 1
    child = observe.job_child(counted)
    assert child.state is ChildState.RUNNING and child.evictions == 1 and observe.EVICTED_WAITING in child.message
    # observed before the operator's patch landed: the eviction seen now is counted in the child already
    assert observe.job_child(evicted).evictions == 1
    # re-admitted (Kueue unsuspends the same Job): running again, marked again, a second eviction counts 2
    readmitted = {**ADMITTED, "metadata": {"annotations": {kueue.EVICTIONS_ANNOTATION: "1"}}}
    assert kueue.needs_started_mark(readmitted) and observe.job_child(readmitted).evictions == 1
    again = job(
        suspend=True,
        annotations={kueue.EVICTIONS_ANNOTATION: "1", kueue.STARTED_ANNOTATION: "2026-12-03T10:00:00Z"},
        conditions=[("Suspended", "True", "JobSuspended", "Job suspended")],
    )
    assert kueue.eviction_patch(again)["metadata"]["annotations"][kueue.EVICTIONS_ANNOTATION] == "2"
    # a count someone mangled is read as none rather than failing the reconcile
    assert kueue.evictions(job(suspend=True, annotations={kueue.EVICTIONS_ANNOTATION: "lots"})) == 0


def workload(owner_uid: str, conditions=(), **status: Any) -> dict[str, Any]:
    return {
        "metadata": {"name": "job-x-1a2b3", "ownerReferences": [{"kind": "Job", "name": "x", "uid": owner_uid}]},
        "spec": {"active": status.pop("active", True)},
        "status": {
            "conditions": [{"type": t, "status": s, "reason": r, "message": m} for t, s, r, m in conditions],
            **status,
        },
    }


def test_kueues_words_come_from_the_workload_of_the_child():
    child = {"metadata": {"name": "x", "uid": "u-1"}}
    mine = workload(
        "u-1",
        conditions=[
            ("QuotaReserved", "False", "Pending", "couldn't assign flavors to pod set main: insufficient quota"),
            ("Admitted", "False", "NoReservation", "The workload has no reservation"),
            ("Evicted", "True", "Preempted", "Preempted to accommodate a workload (UID: w) due to prioritization"),
        ],
        requeueState={"count": 2, "requeueAt": "2026-12-03T10:05:00Z"},
    )
    other = workload("u-2")
    assert kueue.workload_of([other, mine], child) is mine
    assert kueue.workload_of([other], child) is None
    facts = kueue.workload_facts(mine)
    assert facts.evicted.startswith("Preempted: Preempted to accommodate")
    assert facts.pending.endswith("insufficient quota") and facts.requeue_at == "2026-12-03T10:05:00Z"
    assert facts.active and facts.admitted_by == ""
    admitted = workload(
        "u-1",
        conditions=[("QuotaReserved", "True", "QuotaReserved", ""), ("Admitted", "True", "Admitted", "")],
        admission={"clusterQueue": "gpu-cq"},
    )
    assert kueue.workload_facts(admitted).admitted_by == "gpu-cq" and kueue.workload_facts(admitted).pending == ""
    assert not kueue.workload_facts(workload("u-1", active=False)).active


def test_kueues_missing_localqueue_is_read_from_the_workloads_quota_reserved_condition():
    """Kueue's words (workload_controller.go): ``Inadmissible`` in its releases, ``Misconfigured`` on its main branch,
    the same message in both."""
    for reason in ("Inadmissible", "Misconfigured"):
        wl = workload("u-1", conditions=[("QuotaReserved", "False", reason, "LocalQueue gpu doesn't exist")])
        facts = kueue.workload_facts(wl)
        assert facts.missing_queue == "gpu" and facts.pending == "LocalQueue gpu doesn't exist"
    for other in (
        ("QuotaReserved", "False", "Inadmissible", "ClusterQueue cq doesn't exist"),
        ("QuotaReserved", "False", "Inadmissible", "LocalQueue gpu is inactive"),
        ("QuotaReserved", "True", "QuotaReserved", "LocalQueue gpu doesn't exist"),
    ):
        assert kueue.workload_facts(workload("u-1", conditions=[other])).missing_queue == ""
