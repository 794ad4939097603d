"""One admission unit per phase (``cluster.admission: jobSet``), gang scheduling (PodGroup), and the custom APIs a
spec's children need.
"""

from __future__ import annotations

from typing import Any

from whale.core.protocol import PhaseKind, PhaseRequest
from whale.domain import ToolService
from whale_operator import names
from whale_operator.builders.colocated import DRA_API_VERSION, DRA_NEEDS
from whale_operator.builders.inference import inference_deployment
from whale_operator.builders.jobs import _request_cycle, job
from whale_operator.builders.pods import INFERENCE, VLLM_PORT, Manifest, RunRef, uses_vllm
from whale_operator.cluster_spec import ClusterRunSpec

# ----- one admission unit per phase (cluster.admission: jobSet) and gang scheduling -----------------

#: JobSet >= 0.8 (``dependsOn``); Kueue admits a JobSet as one Workload, a pod set per replicated Job
JOBSET_API_VERSION = names.JOBSET_API_VERSION
#: scheduler-plugins' coscheduling: the PodGroup and the pod label that puts a pod in it
PODGROUP_API_VERSION = "scheduling.x-k8s.io/v1alpha1"
POD_GROUP_LABEL = "scheduling.x-k8s.io/pod-group"
#: the phase's vLLM server restarts in place (its container) this often before the JobSet fails
INFERENCE_JOB_RESTARTS = 3


def uses_jobset(spec: ClusterRunSpec) -> bool:
    """``cluster.admission`` resolved: each phase a JobSet holding its own vLLM server and its workload. ``auto``
    means yes under a Kueue queue when vLLM runs on GPUs of its own (colocated already puts both in one pod)."""
    admission = spec.cluster.admission
    if admission == "auto":
        return bool(spec.cluster.queue_name) and uses_vllm(spec) and spec.execution.inference.placement == "separate"
    return admission == "jobSet"


def jobset_host(run: RunRef, jobset: str, replicated_job: str, pod: int = 0) -> str:
    """The DNS name JobSet gives pod ``pod`` of the first Job of ``replicated_job`` (``network.enableDNSHostnames``:
    a headless Service named after the JobSet)."""
    return f"{jobset}-{replicated_job}-0-{pod}.{jobset}.{run.namespace}.svc"


def _without_queue(meta: dict[str, Any]) -> dict[str, Any]:
    """A template's metadata without the queue label: Kueue admits the JobSet, never its Jobs or pods one by one."""
    out = dict(meta)
    out["labels"] = {k: v for k, v in (meta.get("labels") or {}).items() if k != names.LABEL_QUEUE}
    return out


def _replicated_job_labels(run: RunRef, component: str) -> dict[str, str]:
    """The labels of a JobSet's child Jobs: not the run's selector (``decide`` sees the JobSet, not its Jobs)."""
    return {
        "app.kubernetes.io/name": names.APP_NAME,
        "app.kubernetes.io/instance": run.name,
        "app.kubernetes.io/component": component,
    }


def phase_jobset(
    run: RunRef,
    spec: ClusterRunSpec,
    request: PhaseRequest,
    *,
    store_uri: str,
    tools: tuple[ToolService, ...] = (),
) -> Manifest:
    """The JobSet of one phase attempt (``cluster.admission: jobSet``): Kueue admits it as one Workload, so the
    phase's vLLM server and its workload get their GPUs together or wait together, and an eviction stops both.

    Two replicated Jobs: ``inference`` (the pod of :func:`inference_deployment`: fetch-weights init container,
    vLLM, weight-sync sidecar, starting from ``serving.json``'s target) and ``workload`` (the Job of :func:`job`),
    which JobSet creates only once the server is Ready (``dependsOn``). The JobSet succeeds when the workload does
    (``successPolicy``) and then stops the server; any failure fails it at once (``failurePolicy.maxRestarts`` 0:
    the operator's retry budget decides). Created suspended under a queue. The workload reaches its server by
    JobSet's pod DNS names."""
    name = names.jobset_name(run.name, request.phase, request.attempt)
    workload = job(run, spec, request, store_uri=store_uri, tools=tools)
    labels = workload["metadata"]["labels"]
    wl_spec = workload["spec"]
    wl_spec.pop("suspend", None)  # JobSet suspends and resumes its Jobs
    ttl = wl_spec.pop("ttlSecondsAfterFinished", None)  # on the JobSet: a child Job deleted early is re-created
    wl_pod = wl_spec["template"]["spec"]
    wl_pod.pop("subdomain", None)  # JobSet's headless Service names the pods
    url = f"http://{jobset_host(run, name, names.JOBSET_INFERENCE)}:{VLLM_PORT}/v1"
    master = jobset_host(run, name, names.JOBSET_WORKLOAD)
    for env in wl_pod["containers"][0]["env"]:
        if env["name"] == "WHALE_INFERENCE_URL":
            env["value"] = url
        elif env["name"] == "MASTER_ADDR" and spec.execution.train.num_nodes > 1:
            env["value"] = master
    wl_spec["template"]["metadata"] = _without_queue(wl_spec["template"]["metadata"])

    # no doorbell: the operator never waits for this server's acknowledgement (JobSet starts the workload on Ready)
    server = inference_deployment(run, spec, store_uri=store_uri, doorbell=False)["spec"]["template"]
    server_pod = {**server["spec"], "restartPolicy": "OnFailure"}
    server_job = {
        # one pod, Indexed (JobSet's default, written out): its DNS name <jobset>-inference-0-0 is what the workload
        # calls
        "completionMode": "Indexed",
        "completions": 1,
        "parallelism": 1,
        "backoffLimit": INFERENCE_JOB_RESTARTS,
        "template": {"metadata": _without_queue(server["metadata"]), "spec": server_pod},
    }
    js_spec: dict[str, Any] = {
        "network": {"enableDNSHostnames": True, "publishNotReadyAddresses": True},
        "successPolicy": {"operator": "All", "targetReplicatedJobs": [names.JOBSET_WORKLOAD]},
        "failurePolicy": {"maxRestarts": 0},
        "replicatedJobs": [
            {
                "name": names.JOBSET_INFERENCE,
                "replicas": 1,
                "template": {"metadata": {"labels": _replicated_job_labels(run, INFERENCE)}, "spec": server_job},
            },
            {
                "name": names.JOBSET_WORKLOAD,
                "replicas": 1,
                "dependsOn": [{"name": names.JOBSET_INFERENCE, "status": "Ready"}],
                "template": {
                    "metadata": {"labels": _replicated_job_labels(run, request.kind.workload)},
                    "spec": wl_spec,
                },
            },
        ],
    }
    if spec.cluster.queue_name:
        js_spec["suspend"] = True  # admitted (unsuspended) by Kueue, never running before
    if ttl is not None:
        js_spec["ttlSecondsAfterFinished"] = ttl
    return {
        "apiVersion": JOBSET_API_VERSION,
        "kind": "JobSet",
        "metadata": run.metadata(name, labels, workload["metadata"].get("annotations")),
        "spec": js_spec,
    }


def gang_size(spec: ClusterRunSpec, request: PhaseRequest) -> int:
    """How many pods of this phase must be placed together (``cluster.gangScheduling: podGroup``): the nodes of a
    multi-node train Job; 0 when the phase gets no PodGroup."""
    if spec.cluster.gang_scheduling != "podGroup" or request.kind is not PhaseKind.WEIGHT:
        return 0
    return spec.execution.train.num_nodes if spec.execution.train.num_nodes > 1 else 0


def pod_group(run: RunRef, spec: ClusterRunSpec, request: PhaseRequest, child: str) -> Manifest | None:
    """The coscheduling PodGroup of a multi-node train (scheduler-plugins, ``scheduling.x-k8s.io/v1alpha1``):
    its pods carry :data:`POD_GROUP_LABEL` and the scheduler binds none of them until all ``minMember`` fit.
    Named after the phase's child (Job or JobSet) ``child``; None when :func:`gang_size` is 0."""
    members = gang_size(spec, request)
    if not members:
        return None
    labels = names.child_labels(
        run.name, "gang", cycle=_request_cycle(request), phase=request.phase, attempt=request.attempt
    )
    return {
        "apiVersion": PODGROUP_API_VERSION,
        "kind": "PodGroup",
        "metadata": run.metadata(child, labels),
        "spec": {"minMember": members},
    }


def in_pod_group(manifest: Manifest, group: str) -> Manifest:
    """The phase child with its train pods in PodGroup ``group`` (the Job's pods; a JobSet's workload pods, not
    its server, which JobSet starts first)."""
    if manifest["kind"] == "JobSet":
        template = next(r for r in manifest["spec"]["replicatedJobs"] if r["name"] == names.JOBSET_WORKLOAD)[
            "template"
        ]["spec"]["template"]
    else:
        template = manifest["spec"]["template"]
    template["metadata"]["labels"] = {**template["metadata"]["labels"], POD_GROUP_LABEL: group}
    return manifest


def required_apis(spec: ClusterRunSpec) -> list[tuple[str, str, str]]:
    """(spec field, API group/version, what installs it) of the custom kinds this spec's children need: the run
    cannot start without them, and says so on the field that asks for them."""
    out = []
    if uses_jobset(spec):
        out.append(("spec.cluster.admission", JOBSET_API_VERSION, "JobSet >= 0.8 (kubernetes-sigs/jobset)"))
    if spec.cluster.gang_scheduling == "podGroup" and spec.execution.train.num_nodes > 1:
        out.append(
            ("spec.cluster.gangScheduling", PODGROUP_API_VERSION, "scheduler-plugins' coscheduling PodGroup CRD")
        )
    if uses_vllm(spec) and spec.execution.inference.placement == "colocated":
        out.append(("spec.execution.inference.placement", DRA_API_VERSION, DRA_NEEDS))
    return out


#: how a spec field that needs an API this cluster lacks can do without it (children.check_apis' message)
API_FIXES = {
    "spec.cluster.admission": "set cluster.admission: perChild",
    "spec.cluster.gangScheduling": "set gangScheduling: none",
    "spec.execution.inference.placement": "set inference.placement: separate",
}
