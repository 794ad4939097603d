"""Reading a child Job the way Kueue leaves it: queued, admitted, or evicted after it had started.

Kueue admits a Job by unsuspending it and evicts (preempts) one by suspending it again and clearing
its ``status.startTime`` (Kueue's ``(*Job).Stop``; the Job controller then writes only ``Job suspended``), so "suspended with a start time" misses every real eviction. What survives
the eviction is what the operator wrote on the Job when it first saw it run: the ``whale.dev/started``
annotation (:func:`started_patch`). An evicted Job is one that carries it and is suspended again; a
suspended Job without it is still waiting for admission. A phase JobSet (``cluster.admission: jobSet``) is read
the same way: Kueue admits and evicts the JobSet as one Workload through its ``spec.suspend``, and its
``Suspended`` condition carries the reason. Pure: Job (or JobSet) dicts in, facts out.
"""

from __future__ import annotations

from typing import Any

STARTED_ANNOTATION = "whale.dev/started"


def _condition(job: dict[str, Any], type_: str) -> dict[str, Any] | None:
    for cond in job.get("status", {}).get("conditions") or ():
        if cond.get("type") == type_:
            return cond
    return None


def suspended_condition(job: dict[str, Any]) -> dict[str, Any] | None:
    """The child's Suspended condition (the Job controller's, or the JobSet controller's), if any."""
    return _condition(job, "Suspended")


def suspended(job: dict[str, Any]) -> bool:
    """The Job is suspended now (by its spec, or the Job controller says so)."""
    cond = _condition(job, "Suspended")
    return bool(job.get("spec", {}).get("suspend")) or (cond is not None and cond.get("status") == "True")


def running_now(job: dict[str, Any]) -> bool:
    """The Job runs pods now (admitted and started): what makes it worth marking as started. A JobSet runs
    when one of its Jobs is active or ready (``status.replicatedJobsStatus``)."""
    status = job.get("status", {})
    jobs = status.get("replicatedJobsStatus") or ()
    return not suspended(job) and bool(
        status.get("startTime")
        or status.get("active")
        or status.get("ready")
        or any(r.get("active") or r.get("ready") for r in jobs)
    )


def marked_started(job: dict[str, Any]) -> bool:
    return STARTED_ANNOTATION in (job.get("metadata", {}).get("annotations") or {})


def needs_started_mark(job: dict[str, Any]) -> bool:
    """Running and not yet marked: the operator patches :func:`started_patch` onto it."""
    return running_now(job) and not marked_started(job)


def started_patch(when: str) -> dict[str, Any]:
    """The merge patch that records the first time the operator saw the Job run."""
    return {"metadata": {"annotations": {STARTED_ANNOTATION: when}}}


def evicted(job: dict[str, Any]) -> str | None:
    """Why the Job was evicted after it had started (the Suspended condition's message), or None.

    Also true for a Job suspended while it still shows a start time (an eviction seen before the Job
    controller cleared it)."""
    if not suspended(job):
        return None
    if not (marked_started(job) or job.get("status", {}).get("startTime")):
        return None
    cond = _condition(job, "Suspended") or {}
    return cond.get("message") or cond.get("reason") or "suspended after it started"
