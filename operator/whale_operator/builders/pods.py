"""The pieces every child's pod shares: the run's identity (owner references, metadata), placement and
resources, restricted security contexts, the store's and the workloads' environment, the untrusted-code labels
and the sandbox host's context, and the template hash of a Deployment.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

from whale.control.storage import connection_env
from whale.core.protocol import PhaseKind
from whale.core.spec import API_GROUP, API_VERSION, KIND, Resources, SecretKey
from whale_operator import names
from whale_operator.cluster_spec import ClusterRunSpec, PodPlacement, Toleration

Manifest = dict[str, Any]

WORKER_CONTAINER = "worker"
VLLM_PORT = 8000
RENDEZVOUS_PORT = 29500
GPU_RESOURCE = "nvidia.com/gpu"
MODELS_DIR = "/models"
#: the colocated server's startup probe (it listens on loopback only): its /health answers 200 within 5 s
LOOPBACK_HEALTH_PROBE = (
    f"import urllib.request; urllib.request.urlopen('http://127.0.0.1:{VLLM_PORT}/health', timeout=5)"
)
#: Startup can take many minutes (weights download + load); probes give it 30 min.
VLLM_STARTUP_PERIOD_S = 10
VLLM_STARTUP_FAILURES = 180
#: a tool service may load for this long (a retriever verifying and mapping wiki-18's 80 GB) before
#: its liveness probe counts
TOOL_STARTUP_PERIOD_S = 10
TOOL_STARTUP_TIMEOUT_S = 3600
#: where the prepare Job downloads spec.experiment.data.source full (~1 GB in all: the Lichess .zst, DAPO's parquet,
#: the FlashRAG QA files), and the cap on that scratch volume
PREPARE_DOWNLOADS_DIR = "/downloads"
PREPARE_DOWNLOADS_SIZE = "16Gi"
#: the components of a run, each with its pod template (``spec.cluster.placement.<component>``)
TRAIN, INFERENCE, WORKERS, TOOLS = "train", "inference", "workers", "tools"
#: the run's harness pod's component (spec.cluster.placement.harness)
HARNESS = "harness"
#: the non-root users of the images (images/*/Dockerfile); vLLM's upstream image runs as root, so its pod
#: gets the worker's uid (it writes only to its volumes and HOME=/tmp)
WORKER_UID = 10001
TOOLS_UID = 65534


@dataclass(frozen=True)
class RunRef:
    """The identity of the WhaleRun that owns the children."""

    name: str
    namespace: str
    uid: str

    def owner_reference(self) -> dict[str, Any]:
        return {
            "apiVersion": f"{API_GROUP}/{API_VERSION}",
            "kind": KIND,
            "name": self.name,
            "uid": self.uid,
            "controller": True,
            "blockOwnerDeletion": True,
        }

    def metadata(self, name: str, labels: dict[str, str], annotations: dict[str, str] | None = None) -> dict:
        meta: dict[str, Any] = {
            "name": name,
            "namespace": self.namespace,
            "labels": labels,
            "ownerReferences": [self.owner_reference()],
        }
        if annotations:
            meta["annotations"] = annotations
        return meta


# ----- shared pieces ------------------------------------------------------------------------------


def storage_env(spec: ClusterRunSpec) -> list[dict[str, Any]]:
    """How a workload finds the object store: ``--store`` carries the URI; endpoint and TLS here
    (:func:`whale.control.storage.connection_env`), credentials from the Secret (``envFrom``) named by
    ``spec.execution.storage.credentialsSecret``."""
    return [{"name": k, "value": v} for k, v in connection_env(spec.execution.storage).items()]


def storage_env_from(spec: ClusterRunSpec) -> list[dict[str, Any]]:
    if spec.execution.storage.credentials_secret:
        return [{"secretRef": {"name": spec.execution.storage.credentials_secret}}]
    return []


def resources_dict(res: Resources, gpus: int = 0) -> dict[str, Any]:
    """Requests/limits from the spec; ``gpus`` > 0 sets nvidia.com/gpu in both (GPUs cannot overcommit). A memory
    request without a memory limit gets that request as its limit: memory cannot be taken back from a pod, so on a
    shared node a pod that grows past what the scheduler reserved for it is the one to go (and ``/dev/shm``, which
    counts against it, is bounded too: :func:`shm_volume`). A larger limit is the spec's to give."""
    requests = dict(res.requests)
    limits = dict(res.limits)
    if "memory" in requests and "memory" not in limits:
        limits["memory"] = requests["memory"]
    if gpus > 0:
        requests[GPU_RESOURCE] = str(gpus)
        limits[GPU_RESOURCE] = str(gpus)
    out: dict[str, Any] = {}
    if requests:
        out["requests"] = requests
    if limits:
        out["limits"] = limits
    return out


def pod_placement(spec: ClusterRunSpec) -> dict[str, Any]:
    """Scheduling fields shared by every pod of the run (the run-wide defaults of every component)."""
    cl = spec.cluster
    out: dict[str, Any] = {}
    if cl.service_account_name:
        out["serviceAccountName"] = cl.service_account_name
    if cl.priority_class_name:
        out["priorityClassName"] = cl.priority_class_name
    if cl.node_selector:
        out["nodeSelector"] = dict(cl.node_selector)
    if cl.tolerations:
        out["tolerations"] = [t.to_wire() for t in cl.tolerations]
    if cl.scheduler_name:
        out["schedulerName"] = cl.scheduler_name
    return out


def is_gpu_toleration(toleration: Toleration) -> bool:
    """A toleration of a GPU taint (nvidia.com/gpu, amd.com/gpu, gpu, ...): a key that names a GPU."""
    return "gpu" in (toleration.key or "").lower()


def requests_gpu(resources: dict[str, Any]) -> bool:
    return any("gpu" in name.lower() for part in resources.values() for name in part)


def _compact(node: Any) -> Any:
    """Drop empty lists and maps (the spec's defaults) from a wire dict."""
    if isinstance(node, dict):
        return {k: _compact(v) for k, v in node.items() if v not in ([], {}, None)}
    if isinstance(node, list):
        return [_compact(v) for v in node]
    return node


def component_placement(spec: ClusterRunSpec, component: str) -> PodPlacement:
    placement: PodPlacement = getattr(spec.cluster.placement, component)
    return placement


def pod_template_fields(spec: ClusterRunSpec, component: str, *, gpu: bool) -> dict[str, Any]:
    """A component's scheduling fields: the run-wide ones (:func:`pod_placement`) with the component's pod
    template over them. Maps merge, lists and scalars replace. Run-wide GPU tolerations reach only a pod that
    requests a GPU (``gpu``); a component's own tolerations are taken as given."""
    pl = component_placement(spec, component)
    out = pod_placement(spec)
    if not gpu and spec.cluster.tolerations:
        kept = [t.to_wire() for t in spec.cluster.tolerations if not is_gpu_toleration(t)]
        if kept:
            out["tolerations"] = kept
        else:
            out.pop("tolerations")
    if pl.tolerations is not None:
        out["tolerations"] = [t.to_wire() for t in pl.tolerations]
        if not out["tolerations"]:
            out.pop("tolerations")
    if pl.node_selector:
        out["nodeSelector"] = {**out.get("nodeSelector", {}), **pl.node_selector}
    if pl.priority_class_name:
        out["priorityClassName"] = pl.priority_class_name
    if pl.affinity is not None:
        out["affinity"] = _compact(pl.affinity.to_wire())
    if pl.topology_spread_constraints:
        out["topologySpreadConstraints"] = [_compact(c.to_wire()) for c in pl.topology_spread_constraints]
    if pl.runtime_class_name:
        out["runtimeClassName"] = pl.runtime_class_name
    if pl.image_pull_secrets:
        out["imagePullSecrets"] = [r.to_wire() for r in pl.image_pull_secrets]
    return out


def pod_metadata(spec: ClusterRunSpec, component: str, labels: dict[str, str]) -> dict[str, Any]:
    """A pod template's metadata: the component's labels and annotations, the operator's labels winning."""
    pl = component_placement(spec, component)
    meta: dict[str, Any] = {"labels": {**pl.labels, **labels}}
    if pl.annotations:
        meta["annotations"] = dict(pl.annotations)
    return meta


def component_resources(spec: ClusterRunSpec, component: str, default: Resources) -> Resources:
    override = component_placement(spec, component).resources
    return override if override is not None else default


def restricted_container_security_context() -> dict[str, Any]:
    """A container of the restricted Pod Security Standard (with :func:`restricted_pod_security_context`)."""
    return {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}


def restricted_pod_security_context(spec: ClusterRunSpec, component: str, uid: int) -> dict[str, Any]:
    """Non-root (the image's user unless the component's podSecurity says otherwise), seccomp RuntimeDefault;
    fsGroup makes the pod's volumes writable for that user."""
    ps = component_placement(spec, component).pod_security
    user = ps.run_as_user or uid
    return {
        "runAsNonRoot": True,
        "runAsUser": user,
        "runAsGroup": ps.run_as_group or user,
        "fsGroup": ps.fs_group or ps.run_as_group or user,
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def models_volume(spec: ClusterRunSpec) -> dict[str, Any]:
    """The vLLM server's model volume (/models): the run's model-cache claim when it names one (weights, and the
    server's compile caches, outlive the pod), else an emptyDir of ``modelCacheSize``."""
    if spec.cluster.model_cache_claim_name:
        return {"name": "models", "persistentVolumeClaim": {"claimName": spec.cluster.model_cache_claim_name}}
    return {"name": "models", "emptyDir": {"sizeLimit": spec.cluster.model_cache_size}}


def compile_cache_env() -> list[dict[str, str]]:
    """vLLM's torch.compile cache and Triton's kernels, with their autotuning results, on the model volume. On a
    model-cache claim a server that starts again (the next phase's scale-up, a colocated weight phase) finds them
    instead of compiling and autotuning again: on an H100 a second server with the compile cache warm started in
    half the time of the first (docs/operator.md). FlashInfer's JIT-built kernels too (it puts them under
    ``$FLASHINFER_WORKSPACE_BASE/.cache/flashinfer``; by default under HOME, which is ``/tmp`` in these containers).
    Only the server and its trusted helpers mount the volume; no harness or tool pod does."""
    return [
        {"name": "VLLM_CACHE_ROOT", "value": f"{MODELS_DIR}/cache/vllm"},
        {"name": "TRITON_CACHE_DIR", "value": f"{MODELS_DIR}/cache/triton"},
        {"name": "TRITON_CACHE_AUTOTUNING", "value": "1"},
        {"name": "FLASHINFER_WORKSPACE_BASE", "value": f"{MODELS_DIR}/cache/flashinfer"},
    ]


#: ``/dev/shm``'s size where the container has no memory limit (a spec that gives no memory at all): enough for
#: PyTorch's data loaders and NCCL's shared-memory transport, never the node's whole memory
DEFAULT_SHM_SIZE = "16Gi"


def shm_volume(resources: dict[str, Any]) -> dict[str, Any]:
    """``/dev/shm`` in memory, at most the container's memory limit (its pages count against that limit), else
    :data:`DEFAULT_SHM_SIZE`: never unbounded."""
    memory = resources.get("limits", {}).get("memory") or DEFAULT_SHM_SIZE
    return {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": memory}}


def job_lifecycle(spec: ClusterRunSpec) -> dict[str, Any]:
    """A child Job's deadline (spec.execution.retry.activeDeadlineSeconds, else spec.cluster.lifecycle's default), how
    long it stays once finished, and, under a Kueue queue, ``suspend: true``: the Job is created suspended
    and runs when Kueue admits it (unsuspends it), never before (Kueue's documented way; a Job created
    running could start pods in the moment before Kueue's webhook or controller sees it)."""
    lc = spec.cluster.lifecycle
    out: dict[str, Any] = {
        "activeDeadlineSeconds": spec.execution.retry.active_deadline_seconds or lc.active_deadline_seconds
    }
    if lc.ttl_seconds_after_finished is not None:
        out["ttlSecondsAfterFinished"] = lc.ttl_seconds_after_finished
    if spec.cluster.queue_name:
        out["suspend"] = True
    return out


def with_queue(labels: dict[str, str], spec: ClusterRunSpec) -> dict[str, str]:
    """Kueue admits Jobs and Deployments that carry its queue label."""
    if spec.cluster.queue_name:
        return {**labels, names.LABEL_QUEUE: spec.cluster.queue_name}
    return labels


def uses_vllm(spec: ClusterRunSpec) -> bool:
    """``auto`` means vLLM on a cluster; ``transformers`` runs in the worker; ``openai`` is external."""
    return spec.execution.inference.backend in ("auto", "vllm")


def colocated_weight(spec: ClusterRunSpec, kind: PhaseKind) -> bool:
    """A weight phase of ``inference.placement: colocated``: one pod with a vLLM server of its own
    (:func:`colocated_train_job`), so it needs nothing of the run's vLLM Deployment."""
    return kind is PhaseKind.WEIGHT and uses_vllm(spec) and spec.execution.inference.placement == "colocated"


def inference_url(run: RunRef, spec: ClusterRunSpec) -> str | None:
    if uses_vllm(spec):
        return f"http://{names.inference_name(run.name)}.{run.namespace}.svc:{VLLM_PORT}/v1"
    return spec.execution.inference.base_url


def served_model_name(spec: ClusterRunSpec) -> str:
    return spec.experiment.model.served_model_name or spec.experiment.model.name


#: capabilities whale.sandbox's launcher needs as root in a container (measured with setpriv's bounding set:
#: without any one of them a sandbox cannot be set up): namespaces, mounts and pivot_root (SYS_ADMIN), a fresh uid
#: per sandbox (SETUID, SETGID), an empty bounding set for the program (SETPCAP), its scratch files handed to that
#: uid (CHOWN, DAC_OVERRIDE), and killing what is left of it (KILL)
SANDBOX_HOST_CAPABILITIES = ("CHOWN", "DAC_OVERRIDE", "KILL", "SETGID", "SETPCAP", "SETUID", "SYS_ADMIN")


#: on the pod template of every pod that runs untrusted code (a candidate harness, model-written code, a ``cli``
#: proposer's agent): what the admin's sandbox RuntimeClass is put on (:func:`with_sandbox_runtime`), what a cluster
#: policy can select, and what tests/operator/test_least_privilege.py checks for credentials, tokens and egress
LABEL_UNTRUSTED = names.LABEL_UNTRUSTED


def untrusted(labels: dict[str, str]) -> dict[str, str]:
    return {**labels, LABEL_UNTRUSTED: "true"}


def with_sandbox_runtime(manifest: Manifest, runtime_class: str | None) -> Manifest:
    """``manifest`` with the admin's sandboxed RuntimeClass (gVisor, Kata: ``WHALE_SANDBOX_RUNTIME_CLASS``, the
    chart's ``sandboxHosts.runtimeClassName``) on its pod when that pod runs untrusted code (:data:`LABEL_UNTRUSTED`);
    the admin's class wins over a spec's. Other objects, or no class: unchanged."""
    if not runtime_class or manifest.get("kind") not in ("Deployment", "Job"):
        return manifest
    template = manifest["spec"]["template"]
    if template["metadata"].get("labels", {}).get(LABEL_UNTRUSTED) != "true":
        return manifest
    template["spec"]["runtimeClassName"] = runtime_class
    return manifest


def sandbox_host_security_context() -> dict[str, Any]:
    """The securityContext of a container that starts ``whale.sandbox`` sandboxes (harness processes, the code
    tool): root with only :data:`SANDBOX_HOST_CAPABILITIES`, so the launcher can build each sandbox's own
    namespaces and fresh root; the untrusted program inside has no capability at all (docs/security.md).
    AppArmor's default container profile refuses every mount, so it is unconfined here; seccomp stays at the
    runtime's default, which allows the namespace calls to a holder of SYS_ADMIN. Without these the sandbox
    fails closed (the phase fails, naming spec.execution.sandbox.isolation), it never runs untrusted code unwalled."""
    return {
        "runAsUser": 0,
        "runAsNonRoot": False,
        "capabilities": {"drop": ["ALL"], "add": list(SANDBOX_HOST_CAPABILITIES)},
        "seccompProfile": {"type": "RuntimeDefault"},
        "appArmorProfile": {"type": "Unconfined"},
    }


#: the weight-sync and data-fetching helper containers (they stream objects to files; the limit bounds a leak)
HELPER_RESOURCES = {"requests": {"cpu": "250m", "memory": "512Mi"}, "limits": {"memory": "4Gi"}}


def template_hash(deployment: Manifest) -> str:
    """A short hash of a Deployment's rendered pod template (canonical JSON): what changes it changes the pods."""
    canonical = json.dumps(deployment["spec"]["template"], sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()[:16]


def with_template_hash(deployment: Manifest) -> Manifest:
    """The Deployment stamped with :func:`template_hash` (annotation ``whale.dev/template-hash``), so the operator
    can tell a spec edit that changes its pods from the API server's defaults (never compared field by field)."""
    meta = {**deployment["metadata"]}
    meta["annotations"] = {**meta.get("annotations", {}), names.ANNOTATION_TEMPLATE_HASH: template_hash(deployment)}
    return {**deployment, "metadata": meta}


def secret_key_env(env_name: str, ref: SecretKey) -> dict[str, Any]:
    """One key of a Secret the spec names, as an environment variable (by reference: the value never enters a
    manifest)."""
    return {"name": env_name, "valueFrom": {"secretKeyRef": {"name": ref.name, "key": ref.key}}}


#: the variable huggingface_hub reads its token from
HF_TOKEN_ENV = "HF_TOKEN"


def hf_token_env(spec: ClusterRunSpec) -> list[dict[str, Any]]:
    """``spec.experiment.model.hfTokenSecret`` as ``HF_TOKEN`` (by reference), for a container that downloads the policy
    model or its tokenizer from the Hub: the weight fetchers, the weight Job, the retriever's fetch-tokenizer.
    Never a pod or sandbox that runs untrusted code without a wall between (docs/security.md)."""
    ref = spec.experiment.model.hf_token_secret
    return [] if ref is None else [secret_key_env(HF_TOKEN_ENV, ref)]
