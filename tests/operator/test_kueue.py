"""Kueue's view of a Job: created suspended under a queue, and an eviction after the start is told apart
from waiting for admission even though Kueue clears ``status.startTime`` when it evicts."""

from __future__ import annotations

from typing import Any

from whale_operator import kueue


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
    # an eviction caught before the start time was cleared counts too
    early = job(suspend=True, start="2026-12-03T09:00:00Z", conditions=[("Suspended", "True", "JobSuspended", "")])
    assert kueue.evicted(early) == "JobSuspended"
