"""Deterministic names and labels of a WhaleRun's children.

Every child's name is a function of (run, phase, attempt) only, so that running a handler twice,
or restarting the operator between "create" and "observe", finds the child it made instead of
making a second one. Names obey the DNS limits (63 characters minus the suffixes Kubernetes adds:
an Indexed Job's pods are ``<job>-<index>``), shortened with a hash when a run name is long.
"""

from __future__ import annotations

import hashlib

from whale.core import layout
from whale.core.spec import API_GROUP

#: label keys (``whale.dev/...``) and the standard app labels
LABEL_RUN = f"{API_GROUP}/run"
LABEL_CYCLE = f"{API_GROUP}/cycle"
LABEL_PHASE = f"{API_GROUP}/phase"
LABEL_ATTEMPT = f"{API_GROUP}/attempt"
LABEL_KIND = f"{API_GROUP}/kind"
#: on the pod template of a pod that runs untrusted code (builders.LABEL_UNTRUSTED)
LABEL_UNTRUSTED = f"{API_GROUP}/untrusted"
LABEL_QUEUE = "kueue.x-k8s.io/queue-name"
APP_NAME = "whale"
MANAGED_BY = "whale-operator"

#: what operators before 2026-12-06 wrote on a run's vLLM Deployment, the checkpoint it served (the status's
#: ``currentCheckpoint`` names it): removed where still found (:meth:`whale_operator.children.JobLauncher.serve_checkpoint`)
ANNOTATION_CHECKPOINT = f"{API_GROUP}/checkpoint"
#: annotations the operator writes on children
ANNOTATION_REQUEST = f"{API_GROUP}/request"
#: a Deployment's rendered pod template, hashed: a differing hash means the spec changed it (re-rendered)
ANNOTATION_TEMPLATE_HASH = f"{API_GROUP}/template-hash"

#: Jobs leave room for ``-<index>`` (Indexed pods' hostnames) and ``-rdzv`` (the headless Service)
MAX_JOB_NAME = 56
MAX_NAME = layout.DNS_LABEL_MAX_LEN
_HASH_LEN = 8
#: the suffixes of the children named ``<run>-<suffix>``; each fits ``layout.LONGEST_CHILD_SUFFIX``,
#: so a valid run name is never cut in them (tests/security/test_manifests.py checks it)
INFERENCE_SUFFIX = "vllm"
AUTH_SUFFIX = "auth"
SERVED_SUFFIX = "served"
WEIGHT_SYNC_SUFFIX = "weight-sync"
SANDBOX_POLICY_SUFFIX = layout.LONGEST_CHILD_SUFFIX.removeprefix("-")
#: the harness host's children
HARNESS_SUFFIX = "harness"
HARNESS_POLICY_SUFFIX = "harness-isolation"
WORKLOAD_POLICY_SUFFIX = "workload-ingress"


class RunNameError(ValueError):
    """The WhaleRun's name cannot name its children."""


def check_run_name(run: str) -> str:
    """The one rule of ``whale.core.layout.check_run_name`` (what `whale validate` checks), as a RunNameError."""
    try:
        return layout.check_run_name(run)
    except ValueError as exc:
        raise RunNameError(f"{exc}; rename the WhaleRun") from None


def _fit(head: str, tail: str, limit: int) -> str:
    """``head-tail`` within ``limit`` characters; a long head is cut and a hash of the full name
    keeps distinct inputs distinct."""
    full = f"{head}-{tail}" if tail else head
    if len(full) <= limit:
        return full
    digest = hashlib.sha256(full.encode()).hexdigest()[:_HASH_LEN]
    room = limit - len(tail) - _HASH_LEN - (2 if tail else 1)
    cut = head[: max(room, 1)].rstrip("-")
    return f"{cut}-{digest}-{tail}" if tail else f"{cut}-{digest}"


def job_name(run: str, phase: str, attempt: int) -> str:
    """``<run>-<phase>-<attempt>``, e.g. ``demo-c01-weight-1``."""
    return _fit(run, f"{phase}-{attempt}", MAX_JOB_NAME)


#: the JobSet API the phase JobSets use (JobSet >= 0.8: ``dependsOn``)
JOBSET_API_VERSION = "jobset.x-k8s.io/v1alpha2"
#: the two replicated Jobs of a phase JobSet (``cluster.admission: jobSet``): the phase's vLLM server and its
#: workload (today's Job template); JobSet names their pods ``<jobset>-<replicatedJob>-<job>-<pod>-<5 random>``
JOBSET_INFERENCE = "inference"
JOBSET_WORKLOAD = "workload"
#: JobSet's webhook refuses a JobSet whose longest pod name would pass 63 characters: leave room for
#: ``-workload-0-1023`` (train.numNodes <= 1024) and the ``-abcde`` the Job controller appends
MAX_JOBSET_NAME = MAX_NAME - len(f"-{JOBSET_WORKLOAD}-0-1023") - len("-abcde")


def jobset_name(run: str, phase: str, attempt: int) -> str:
    """The JobSet of one phase attempt, ``<run>-<phase>-<attempt>``; beyond :data:`MAX_JOBSET_NAME` its head
    and a hash of the whole (a long phase key alone can pass the limit, so the tail is not kept whole)."""
    full = f"{run}-{phase}-{attempt}"
    if len(full) <= MAX_JOBSET_NAME:
        return full
    digest = hashlib.sha256(full.encode()).hexdigest()[:_HASH_LEN]
    return f"{full[: MAX_JOBSET_NAME - _HASH_LEN - 1].rstrip('-')}-{digest}"


PREPARE = "prepare"


def prepare_job_name(run: str, attempt: int) -> str:
    """``<run>-prepare-<attempt>``: the data preparation Job (split sizes), before any phase."""
    return job_name(run, PREPARE, attempt)


def rendezvous_service_name(job: str) -> str:
    """Headless Service giving an Indexed train Job's pods stable DNS names."""
    return f"{job}-rdzv"


def inference_name(run: str) -> str:
    """The vLLM Deployment and its Service."""
    return _fit(run, INFERENCE_SUFFIX, MAX_NAME)


def served_doorbell_name(run: str) -> str:
    """``<run>-served``: the ConfigMap the vLLM pod's weight-sync sidecar stamps each acknowledgement on
    (:mod:`whale.inference.doorbell`); its watch event wakes the run."""
    return _fit(run, SERVED_SUFFIX, MAX_NAME)


def weight_sync_account_name(run: str) -> str:
    """``<run>-weight-sync``: the vLLM pod's service account (unless ``cluster.serviceAccountName`` names one) and
    the Role + RoleBinding that let its sidecar stamp the doorbell, nothing else."""
    return _fit(run, WEIGHT_SYNC_SUFFIX, MAX_NAME)


def auth_secret_name(run: str) -> str:
    """``<run>-auth``: the run's own Secret (its vLLM API key, its harness host's caller token), made once."""
    return _fit(run, AUTH_SUFFIX, MAX_NAME)


def tool_name(run: str, tool: str) -> str:
    """A tool service of the run (``retriever``, ``sandbox``): Deployment + Service."""
    return _fit(run, tool, MAX_NAME)


def sandbox_policy_name(run: str) -> str:
    return _fit(run, SANDBOX_POLICY_SUFFIX, MAX_NAME)


def harness_name(run: str) -> str:
    """The run's harness host (where harness files run): Deployment + Service, ``<run>-harness``."""
    return _fit(run, HARNESS_SUFFIX, MAX_NAME)


def workload_policy_name(run: str) -> str:
    """The NetworkPolicy that admits only the run's own pods to its workload pods (torchrun's rendezvous)."""
    return _fit(run, WORKLOAD_POLICY_SUFFIX, MAX_NAME)


def harness_policy_name(run: str) -> str:
    """The harness pod's NetworkPolicy (no egress, ingress from the run's pods only)."""
    return _fit(run, HARNESS_POLICY_SUFFIX, MAX_NAME)


def run_labels(run: str) -> dict[str, str]:
    """Labels every child of the run carries; the operator selects its children by these."""
    return {
        "app.kubernetes.io/name": APP_NAME,
        "app.kubernetes.io/instance": run,
        "app.kubernetes.io/managed-by": MANAGED_BY,
        LABEL_RUN: run,
    }


def child_labels(
    run: str, component: str, *, cycle: int | None = None, phase: str | None = None, attempt: int | None = None
) -> dict[str, str]:
    labels = run_labels(run)
    labels["app.kubernetes.io/component"] = component
    if cycle is not None:
        labels[LABEL_CYCLE] = str(cycle)
    if phase is not None:
        labels[LABEL_PHASE] = phase
    if attempt is not None:
        labels[LABEL_ATTEMPT] = str(attempt)
    return labels


def run_selector(run: str) -> str:
    """Label selector of every child of a run."""
    return f"{LABEL_RUN}={run},app.kubernetes.io/managed-by={MANAGED_BY}"


def children_selector() -> str:
    """Label selector of every child of every run (of a namespace, listed once for all its runs)."""
    return f"{LABEL_RUN},app.kubernetes.io/managed-by={MANAGED_BY}"
