"""Pure: what the operator sees of Kubernetes children, as ``decide()`` observations.

A Job's conditions become a :class:`whale.core.alternation.Child`:

=========================================================  ===========
Job                                                        ChildState
=========================================================  ===========
``Complete`` / ``SuccessCriteriaMet`` True                 SUCCEEDED
``Failed`` / ``FailureTarget`` True                        FAILED (PREEMPTED if the cause was a disruption)
suspended after it ran (Kueue eviction/preemption)        RUNNING (kept: Kueue re-admits the same Job), evictions counted
anything else, including suspended-before-start (queued)   RUNNING
being deleted                                              RUNNING (it is gone once the delete finishes)
=========================================================  ===========

A phase JobSet (``cluster.admission: jobSet``) reads the same way, with its ``Completed`` / ``Failed``
conditions (:func:`jobset_child`).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

from whale.core.alternation import Child, ChildState
from whale.core.layout import PhaseId
from whale.inference.doorbell import ANNOTATION as DOORBELL_ANNOTATION
from whale_operator import kueue, names

DISRUPTION = "DisruptionTarget"
#: how a child the queue evicted and kept reads while it waits to be re-admitted
EVICTED_WAITING = "evicted by its queue, kept for Kueue to re-admit it"


def _true(job: dict[str, Any], *types: str) -> dict[str, Any] | None:
    for cond in job.get("status", {}).get("conditions") or []:
        if cond.get("type") in types and cond.get("status") == "True":
            return cond
    return None


def is_jobset(child: dict[str, Any]) -> bool:
    """A phase JobSet (``cluster.admission: jobSet``), not a Job. By shape: list items need not carry a kind."""
    return child.get("kind") == "JobSet" or "replicatedJobs" in (child.get("spec") or {})


def child_kind(child: dict[str, Any]) -> tuple[str, str]:
    """(apiVersion, kind) of a phase child, to patch or delete it."""
    return (names.JOBSET_API_VERSION, "JobSet") if is_jobset(child) else ("batch/v1", "Job")


def pod_selector(child: dict[str, Any]) -> str:
    """The label selector of a phase child's pods (a JobSet's: all of its Jobs')."""
    if is_jobset(child):
        return f"jobset.sigs.k8s.io/jobset-name={child['metadata']['name']}"
    return f"batch.kubernetes.io/job-name={child['metadata']['name']}"


def jobset_child(jobset: dict[str, Any], pod_message: str = "") -> Child:
    """The ChildState of a phase JobSet, read as :func:`job_child` reads a Job: ``Completed`` (its workload
    succeeded, ``successPolicy``) is SUCCEEDED, ``Failed`` is FAILED, suspended again after the operator saw it run
    is an eviction of the whole unit (kept: Kueue re-admits it and JobSet resumes its Jobs), suspended before that is
    queued."""
    if jobset.get("metadata", {}).get("deletionTimestamp"):
        return Child(ChildState.RUNNING, "terminating")
    if _true(jobset, "Completed"):
        return Child(ChildState.SUCCEEDED)
    failed = _true(jobset, "Failed")
    if failed:
        return _failed_child(failed, pod_message)
    return _unfinished(jobset)


def job_child(job: dict[str, Any], pod_message: str = "") -> Child:
    """The ChildState of one Job (or phase JobSet: :func:`jobset_child`); ``pod_message`` is the failed
    container's termination message."""
    if is_jobset(job):
        return jobset_child(job, pod_message)
    if job.get("metadata", {}).get("deletionTimestamp"):
        return Child(ChildState.RUNNING, "terminating")
    if _true(job, "Complete", "SuccessCriteriaMet"):
        return Child(ChildState.SUCCEEDED)
    failed = _true(job, "Failed", "FailureTarget")
    if failed:
        return _failed_child(failed, pod_message)
    return _unfinished(job)


def _unfinished(child: dict[str, Any]) -> Child:
    """A child that has not ended: running, queued, or evicted and kept for Kueue to re-admit (RUNNING all three:
    nothing for ``decide`` to start), with the evictions counted on it, the one seen now included."""
    evictions = kueue.evictions(child) + (kueue.evicted(child) is not None)
    if kueue.suspended(child) and evictions:
        return Child(ChildState.RUNNING, f"{EVICTED_WAITING} ({evictions} eviction(s))", evictions=evictions)
    if kueue.suspended(child):
        return Child(ChildState.RUNNING, "queued: waiting for admission")
    return Child(ChildState.RUNNING, evictions=evictions)


def finished(job: dict[str, Any]) -> bool:
    """The child (Job or JobSet) has ended, succeeded or failed, and is not running again."""
    return job_child(job).state in (ChildState.SUCCEEDED, ChildState.FAILED)


def job_phase(job: dict[str, Any]) -> tuple[str, int] | None:
    """(phase, attempt) from a Job's labels; None for a Job that is not a phase attempt. A data-preparation
    Job (``builders.prepare_job``: kind ``prepare``, no phase label) is the attempt of phase ``prepare``."""
    labels = job.get("metadata", {}).get("labels") or {}
    phase, attempt = labels.get(names.LABEL_PHASE), labels.get(names.LABEL_ATTEMPT)
    if phase is None and labels.get(names.LABEL_KIND) == names.PREPARE:
        phase = PhaseId.prepare().key
    if not phase or not attempt or not attempt.isdigit():
        return None
    return phase, int(attempt)


def current_jobs(jobs: Iterable[dict[str, Any]], attempts: dict[str, int]) -> dict[str, dict[str, Any]]:
    """The Job of each phase's current attempt (``status.attempts``; attempt 1 when not yet counted)."""
    out: dict[str, dict[str, Any]] = {}
    for job in jobs:
        key = job_phase(job)
        if key is None:
            continue
        phase, attempt = key
        if attempt == attempts.get(phase, 1):
            out[phase] = job
    return out


def stale_jobs(jobs: Iterable[dict[str, Any]], attempts: dict[str, int]) -> list[dict[str, Any]]:
    """Jobs of superseded attempts that still run (a preempted attempt left suspended): delete them. Only a phase
    counted past its first attempt can have one: with none (most runs, most of the time) no Job is looked at, so
    this costs nothing that grows with the run's finished Jobs."""
    if not attempts or max(attempts.values()) <= 1:
        return []
    out = []
    for job in jobs:
        key = job_phase(job)
        if key is None or job.get("metadata", {}).get("deletionTimestamp"):
            continue
        phase, attempt = key
        if attempt < attempts.get(phase, 1) and job_child(job).state in (ChildState.RUNNING, ChildState.PREEMPTED):
            out.append(job)
    return out


def failed_pod_message(pods: Iterable[dict[str, Any]], container: str) -> str:
    """The termination message (last log lines) of the failed worker container, if any."""
    for pod in pods:
        for cs in pod.get("status", {}).get("containerStatuses") or []:
            term = (cs.get("state") or {}).get("terminated") or {}
            if cs.get("name") == container and term.get("exitCode", 0) != 0:
                return term.get("message") or term.get("reason") or f"exit code {term.get('exitCode')}"
    return ""


def deployment_ready(dep: dict[str, Any] | None) -> bool:
    if not dep:
        return False
    want = dep.get("spec", {}).get("replicas", 1)
    return want > 0 and int(dep.get("status", {}).get("readyReplicas") or 0) >= want


def inference_ready(dep: dict[str, Any] | None, children: Iterable[dict[str, Any]] = ()) -> bool:
    """The run's vLLM server is ready: the run-wide Deployment, or (``cluster.admission: jobSet``) the server Job
    of a phase JobSet that runs now (``status.replicatedJobsStatus``)."""
    if deployment_ready(dep):
        return True
    for child in children:
        if not is_jobset(child) or job_child(child).state is not ChildState.RUNNING or kueue.suspended(child):
            continue
        for rjob in child.get("status", {}).get("replicatedJobsStatus") or ():
            if rjob.get("name") == names.JOBSET_INFERENCE and int(rjob.get("ready") or 0) >= 1:
                return True
    return False


def _failed_child(failed: dict[str, Any], pod_message: str) -> Child:
    """A child whose Failed condition is set: preempted when a disruption failed it (no failure spent), else failed
    with the condition's words and the failed container's last line."""
    text = f"{failed.get('reason', 'Failed')}: {failed.get('message', '')}".strip(": ")
    if DISRUPTION in text:
        return Child(ChildState.PREEMPTED, text)
    detail = pod_message.strip().splitlines()[-1] if pod_message.strip() else ""
    return Child(ChildState.FAILED, f"{text}; {detail}" if detail else text)


def wake_digest(body: Mapping[str, Any]) -> str | None:
    """What a reconcile reads of a child (a Job or JobSet, a Deployment, the doorbell ConfigMap) that the operator
    did not write itself, as one string:
    a watch event that leaves it unchanged (the operator's own started mark on a Job, say) need not
    wake the run. None when there is nothing to read yet (a child the operator has just made, no status, no
    acknowledgement): its creation wakes nothing either, the reconcile that made it knows it is there."""
    meta = body.get("metadata") or {}
    annotations = meta.get("annotations") or {}
    kind = body.get("kind")
    if kind == "ConfigMap":
        read: dict[str, Any] = {"served": annotations.get(DOORBELL_ANNOTATION)}
        empty = read["served"] is None
    else:
        spec = body.get("spec") or {}
        read = {
            "status": body.get("status") or {},
            "suspend": spec.get("suspend"),
            "replicas": spec.get("replicas"),
            "template": annotations.get(names.ANNOTATION_TEMPLATE_HASH),
        }  # not the operator's own marks (whale.dev/started): writing them wakes nothing
        empty = not read["status"]
    if meta.get("deletionTimestamp"):
        return "deleting"
    return None if empty else json.dumps(read, sort_keys=True, default=str)
