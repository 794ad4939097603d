"""Reading a child Job the way Kueue leaves it: queued, admitted, or evicted after it had started; and Kueue's
``Workload`` of it, where Kueue writes why (the eviction's reason, why it is not admitted yet).

Kueue admits a Job by unsuspending it and evicts (preempts) one by suspending it again and clearing
its ``status.startTime`` (Kueue's ``(*Job).Stop``; the Job controller then writes only ``Job suspended``), so "suspended with a start time" misses every real eviction. What survives
the eviction is what the operator wrote on the Job when it first saw it run: the ``whale.dev/started``
annotation (:func:`started_patch`). An evicted Job is one that carries it and is suspended again; a
suspended Job without it is still waiting for admission. A phase JobSet (``cluster.admission: jobSet``) is read
the same way: Kueue admits and evicts the JobSet as one Workload through its ``spec.suspend``.

Kueue requeues an evicted Job itself and re-admits the same Job (unsuspends it) when it fits again, so the operator
keeps it: on seeing an eviction it moves the Job from "started" to "evicted n times" in one patch
(:func:`eviction_patch`: the started mark goes, ``whale.dev/evictions`` counts), which both counts each eviction
once and lets the next admission be seen as a new start. Pure: Job (or JobSet, Workload) dicts in, facts out.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

STARTED_ANNOTATION = "whale.dev/started"
#: how many times the queue evicted this child (the operator's count, kept on the child it counts)
EVICTIONS_ANNOTATION = "whale.dev/evictions"
#: Kueue's Workload API (kubernetes-sigs/kueue ``apis/kueue/v1beta1/workload_types.go``), read only
WORKLOAD_API_VERSION = "kueue.x-k8s.io/v1beta1"
#: the label Kueue puts on the Workload of a Job or JobSet: the owner's UID (``pkg/controller/constants``)
JOB_UID_LABEL = "kueue.x-k8s.io/job-uid"


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
    """The child's own words (its Suspended condition) when it was evicted after the operator saw it run and the
    operator has not counted that eviction yet (:func:`eviction_patch`), else None. A Job suspended with a start time
    but no mark never ran under the operator's eyes: it reads as queued (Kueue clears the start time on eviction)."""
    if not suspended(job) or not marked_started(job):
        return None
    cond = _condition(job, "Suspended") or {}
    return cond.get("message") or cond.get("reason") or "suspended after it started"


def evictions(job: dict[str, Any]) -> int:
    """How many evictions of this child the operator counted (0 for a malformed count: the count is advisory)."""
    text = str((job.get("metadata", {}).get("annotations") or {}).get(EVICTIONS_ANNOTATION, "0"))
    return int(text) if text.isdigit() else 0


def eviction_patch(job: dict[str, Any]) -> dict[str, Any]:
    """The merge patch that counts the eviction :func:`evicted` saw: one more eviction, and the started mark removed
    (the re-admitted child is marked again when it runs, so its next eviction is seen as new)."""
    return {"metadata": {"annotations": {STARTED_ANNOTATION: None, EVICTIONS_ANNOTATION: str(evictions(job) + 1)}}}


@dataclass(frozen=True)
class WorkloadFacts:
    """What Kueue's Workload of a child says (empty strings where it says nothing)."""

    name: str
    #: ``<reason>: <message>`` of its Evicted condition while True (Preempted, PodsReadyTimeout, InactiveWorkload...)
    evicted: str = ""
    #: why it holds no quota yet (the QuotaReserved condition's message while False: "couldn't assign flavors...")
    pending: str = ""
    #: the ClusterQueue that admitted it (status.admission.clusterQueue), while Admitted is True
    admitted_by: str = ""
    #: when Kueue will requeue it after a back-off (status.requeueState.requeueAt), if it waits for one
    requeue_at: str = ""
    #: False when deactivated (spec.active: false, by an admin or Kueue's requeuing limit): Kueue admits it no more
    active: bool = True
    #: the LocalQueue the Workload names when Kueue says it does not exist (:func:`missing_local_queue`), else ""
    missing_queue: str = ""


def workload_of(workloads: Iterable[dict[str, Any]], child: dict[str, Any]) -> dict[str, Any] | None:
    """The Workload Kueue made for ``child`` (owned by it), if any."""
    uid = child.get("metadata", {}).get("uid")
    for wl in workloads:
        if any(ref.get("uid") == uid for ref in wl.get("metadata", {}).get("ownerReferences") or ()):
            return wl
    return None


def workload_facts(workload: dict[str, Any]) -> WorkloadFacts:
    """The facts of one Workload (kubernetes-sigs/kueue ``workload_types.go``: conditions QuotaReserved, Admitted,
    Evicted; ``status.admission``, ``status.requeueState``; ``spec.active``)."""
    status = workload.get("status") or {}
    evicted = _condition(workload, "Evicted") or {}
    reserved = _condition(workload, "QuotaReserved") or {}
    admitted = _condition(workload, "Admitted") or {}
    return WorkloadFacts(
        name=workload.get("metadata", {}).get("name", ""),
        evicted=_words(evicted) if evicted.get("status") == "True" else "",
        pending=str(reserved.get("message") or "") if reserved.get("status") == "False" else "",
        admitted_by=str((status.get("admission") or {}).get("clusterQueue") or "")
        if admitted.get("status") == "True"
        else "",
        requeue_at=str((status.get("requeueState") or {}).get("requeueAt") or ""),
        active=(workload.get("spec") or {}).get("active", True) is not False,
        missing_queue=missing_local_queue(reserved),
    )


#: what Kueue's workload controller writes on a Workload whose LocalQueue is absent (see :func:`missing_local_queue`)
_NO_LOCAL_QUEUE = re.compile(r"LocalQueue (?P<queue>\S*) doesn't exist")


def missing_local_queue(reserved: dict[str, Any]) -> str:
    """The LocalQueue a Workload names when Kueue says it does not exist, read from its QuotaReserved condition; "" when
    it says nothing of the kind.

    Kueue creates the Workload of a queued Job whatever its ``queue-name`` label names; its workload controller then
    finds no such LocalQueue in the namespace and writes QuotaReserved ``False`` with the message ``LocalQueue <name>
    doesn't exist`` (kubernetes-sigs/kueue ``pkg/controller/core/workload_controller.go``, ``Reconcile``: the
    ``!lqExists`` case, ``UnsetQuotaReservationWithCondition(&wl, kueue.WorkloadInadmissible, fmt.Sprintf("LocalQueue
    %s doesn't exist", wl.Spec.QueueName))``; on its main branch ``getQueueBlocker`` gives the same message with the
    reason ``Misconfigured``). The message is the stable part across releases, so it is what is matched; the operator
    needs no right on LocalQueues for it (it reads the Workload already)."""
    if reserved.get("status") != "False":
        return ""
    found = _NO_LOCAL_QUEUE.fullmatch(str(reserved.get("message") or "").strip())
    return found.group("queue") if found else ""


def _words(cond: dict[str, Any]) -> str:
    return ": ".join(str(p) for p in (cond.get("reason"), cond.get("message")) if p)
