"""Pure builders: (run, spec, decision) -> Kubernetes manifest dicts.

No API calls, no clock, no environment reads: every input is an argument, so tests compare whole
dicts and the handlers stay thin. The children of a WhaleRun:

* one Job per phase attempt (train = RSFT weight phase, search = Meta-Harness phase, eval = mean@k),
  Indexed with a headless rendezvous Service when ``spec.train.numNodes`` > 1;
* the vLLM Deployment + Service serving the run's current weights (weights are swapped in place by the
  ``weight-sync`` sidecar, never by recreating the pod);
* the tool services the domain declares (``Domain.tool_services``: retriever, code sandbox) and a
  NetworkPolicy that lets sandboxed pods reach nothing;
* a prepare Job before anything else when the store has no split sizes for the run;
* the harness host (Deployment + Service + a NetworkPolicy with no egress) where the run's harness files run,
  and the run's own Secret (``<run>-auth``: the host's caller token), unless ``spec.sandbox.isolation`` is none.

Every child carries an owner reference to the WhaleRun (garbage-collected with it) and the labels of
:mod:`whale_operator.names`. Every pod meets the restricted Pod Security Standard, except the containers that
start sandboxes at ``spec.sandbox.isolation: namespaces`` (:func:`sandbox_host_security_context`: the
harness-search Job, for the ``cli`` agent's sandbox, the harness host and the code-sandbox tool). At ``pod``
every pod of a run is restricted: harness files and the proposer's ``run_shell`` commands run on the harness
host, the code tool's snippets in its own pod, and the ``cli`` backend is refused. Each component (train, inference,
workers, tools) takes its pod template from ``spec.cluster.placement.<component>`` over the run-wide placement.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

from whale.control.storage import connection_env
from whale.core import layout
from whale.core.layout import PhaseId
from whale.core.protocol import PhaseKind, PhaseRequest
from whale.core.spec import (
    API_GROUP,
    API_VERSION,
    KIND,
    PodPlacement,
    Resources,
    SecretKey,
    Toleration,
    WhaleRunSpec,
)
from whale.domain import ToolService
from whale.harness.launch import HARNESS_HOST_ENV, HARNESS_TOKEN_ENV
from whale.inference.doorbell import ACCOUNT_DIR, CONFIGMAP_ENV
from whale.inference.vllm_control import IPC_WEIGHT_TRANSFER_ARGS, IPC_WEIGHT_TRANSFER_ENV
from whale_operator import names

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
#: where the prepare Job downloads spec.data.source full (~1 GB in all: the Lichess .zst, DAPO's parquet,
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


def storage_env(spec: WhaleRunSpec) -> list[dict[str, Any]]:
    """How a workload finds the object store: ``--store`` carries the URI; endpoint and TLS here
    (:func:`whale.control.storage.connection_env`), credentials from the Secret (``envFrom``) named by
    ``spec.storage.credentialsSecret``."""
    return [{"name": k, "value": v} for k, v in connection_env(spec.storage).items()]


def storage_env_from(spec: WhaleRunSpec) -> list[dict[str, Any]]:
    if spec.storage.credentials_secret:
        return [{"secretRef": {"name": spec.storage.credentials_secret}}]
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


def pod_placement(spec: WhaleRunSpec) -> dict[str, Any]:
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


def component_placement(spec: WhaleRunSpec, component: str) -> PodPlacement:
    placement: PodPlacement = getattr(spec.cluster.placement, component)
    return placement


def pod_template_fields(spec: WhaleRunSpec, component: str, *, gpu: bool) -> dict[str, Any]:
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


def pod_metadata(spec: WhaleRunSpec, component: str, labels: dict[str, str]) -> dict[str, Any]:
    """A pod template's metadata: the component's labels and annotations, the operator's labels winning."""
    pl = component_placement(spec, component)
    meta: dict[str, Any] = {"labels": {**pl.labels, **labels}}
    if pl.annotations:
        meta["annotations"] = dict(pl.annotations)
    return meta


def component_resources(spec: WhaleRunSpec, component: str, default: Resources) -> Resources:
    override = component_placement(spec, component).resources
    return override if override is not None else default


def restricted_container_security_context() -> dict[str, Any]:
    """A container of the restricted Pod Security Standard (with :func:`restricted_pod_security_context`)."""
    return {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}


def restricted_pod_security_context(spec: WhaleRunSpec, component: str, uid: int) -> dict[str, Any]:
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


#: ``/dev/shm``'s size where the container has no memory limit (a spec that gives no memory at all): enough for
#: PyTorch's data loaders and NCCL's shared-memory transport, never the node's whole memory
DEFAULT_SHM_SIZE = "16Gi"


def shm_volume(resources: dict[str, Any]) -> dict[str, Any]:
    """``/dev/shm`` in memory, at most the container's memory limit (its pages count against that limit), else
    :data:`DEFAULT_SHM_SIZE`: never unbounded."""
    memory = resources.get("limits", {}).get("memory") or DEFAULT_SHM_SIZE
    return {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": memory}}


def job_lifecycle(spec: WhaleRunSpec) -> dict[str, Any]:
    """A child Job's deadline (spec.retry.activeDeadlineSeconds, else spec.cluster.lifecycle's default), how
    long it stays once finished, and, under a Kueue queue, ``suspend: true``: the Job is created suspended
    and runs when Kueue admits it (unsuspends it), never before (Kueue's documented way; a Job created
    running could start pods in the moment before Kueue's webhook or controller sees it)."""
    lc = spec.cluster.lifecycle
    out: dict[str, Any] = {"activeDeadlineSeconds": spec.retry.active_deadline_seconds or lc.active_deadline_seconds}
    if lc.ttl_seconds_after_finished is not None:
        out["ttlSecondsAfterFinished"] = lc.ttl_seconds_after_finished
    if spec.cluster.queue_name:
        out["suspend"] = True
    return out


def with_queue(labels: dict[str, str], spec: WhaleRunSpec) -> dict[str, str]:
    """Kueue admits Jobs and Deployments that carry its queue label."""
    if spec.cluster.queue_name:
        return {**labels, names.LABEL_QUEUE: spec.cluster.queue_name}
    return labels


# ----- the run's auth Secret ----------------------------------------------------------------------------

#: keys of the run's auth Secret (``names.auth_secret_name``): the vLLM server's ``--api-key`` and the harness
#: host's caller token; each pod gets only the key it needs, through ``secretKeyRef``
AUTH_VLLM_API_KEY = "vllm-api-key"
AUTH_HARNESS_TOKEN = "harness-token"
AUTH_SECRET_KEYS = (AUTH_VLLM_API_KEY, AUTH_HARNESS_TOKEN)
#: what clients of the run's vLLM server read the key from (``whale.inference.vllm_control.API_KEY_ENV``)
INFERENCE_API_KEY_ENV = "WHALE_INFERENCE_API_KEY"


def auth_secret(run: RunRef, values: dict[str, str]) -> Manifest:
    """The run's own Secret: made once by the operator with freshly generated ``values`` (never rotated, never
    overwritten), owned by the WhaleRun so it goes with it."""
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": run.metadata(names.auth_secret_name(run.name), names.child_labels(run.name, "auth")),
        "type": "Opaque",
        "stringData": dict(values),
    }


def auth_key_env(run: RunRef, env_name: str, key: str) -> dict[str, Any]:
    """One key of the run's auth Secret as an environment variable (the value never enters a manifest)."""
    return {"name": env_name, "valueFrom": {"secretKeyRef": {"name": names.auth_secret_name(run.name), "key": key}}}


def inference_api_key_env(run: RunRef) -> dict[str, Any]:
    """``$WHALE_INFERENCE_API_KEY`` for a client of the run's vLLM server."""
    return auth_key_env(run, INFERENCE_API_KEY_ENV, AUTH_VLLM_API_KEY)


def uses_vllm(spec: WhaleRunSpec) -> bool:
    """``auto`` means vLLM on a cluster; ``transformers`` runs in the worker; ``openai`` is external."""
    return spec.inference.backend in ("auto", "vllm")


def colocated_weight(spec: WhaleRunSpec, kind: PhaseKind) -> bool:
    """A weight phase of ``inference.placement: colocated``: one pod with a vLLM server of its own
    (:func:`colocated_train_job`), so it needs nothing of the run's vLLM Deployment."""
    return kind is PhaseKind.WEIGHT and uses_vllm(spec) and spec.inference.placement == "colocated"


def inference_url(run: RunRef, spec: WhaleRunSpec) -> str | None:
    if uses_vllm(spec):
        return f"http://{names.inference_name(run.name)}.{run.namespace}.svc:{VLLM_PORT}/v1"
    return spec.inference.base_url


def served_model_name(spec: WhaleRunSpec) -> str:
    return spec.model.served_model_name or spec.model.name


def tool_url(run: RunRef, tool: ToolService) -> str:
    return f"http://{names.tool_name(run.name, tool.name)}.{run.namespace}.svc:{tool.port}"


def workload_env(
    run: RunRef, spec: WhaleRunSpec, request: PhaseRequest, tools: tuple[ToolService, ...]
) -> list[dict[str, Any]]:
    env: list[dict[str, Any]] = [
        {"name": "WHALE_RUN", "value": run.name},
        {"name": "WHALE_PHASE", "value": request.phase},
        {"name": "WHALE_ATTEMPT", "value": str(request.attempt)},
        {"name": "PYTHONUNBUFFERED", "value": "1"},
        *storage_env(spec),
    ]
    url = inference_url(run, spec)
    if url:
        env.append({"name": "WHALE_INFERENCE_URL", "value": url})
        env.append({"name": "WHALE_SERVED_MODEL_NAME", "value": served_model_name(spec)})
    if uses_vllm(spec):  # the run's own server: its shared secret (an external endpoint gets nothing of ours)
        env.append(inference_api_key_env(run))
    for tool in tools:
        env.append({"name": tool.url_env, "value": tool_url(run, tool)})
    key = spec.harness_search.proposer.api_key_secret
    if request.kind is PhaseKind.HARNESS and key is not None:
        env.append(secret_key_env(key.env or "WHALE_PROPOSER_API_KEY", key))
    env += judge_key_env(spec)
    if request.kind is PhaseKind.WEIGHT:  # the trainer loads spec.model (a Hub id at the first phase)
        env += hf_token_env(spec)
    return env


def secret_key_env(env_name: str, ref: SecretKey) -> dict[str, Any]:
    """One key of a Secret the spec names, as an environment variable (by reference: the value never enters a
    manifest)."""
    return {"name": env_name, "valueFrom": {"secretKeyRef": {"name": ref.name, "key": ref.key}}}


#: the variable huggingface_hub reads its token from
HF_TOKEN_ENV = "HF_TOKEN"


def hf_token_env(spec: WhaleRunSpec) -> list[dict[str, Any]]:
    """``spec.model.hfTokenSecret`` as ``HF_TOKEN`` (by reference), for a container that downloads the policy
    model or its tokenizer from the Hub: the weight fetchers, the weight Job, the retriever's fetch-tokenizer.
    Never a pod or sandbox that runs untrusted code without a wall between (docs/security.md)."""
    ref = spec.model.hf_token_secret
    return [] if ref is None else [secret_key_env(HF_TOKEN_ENV, ref)]


def judge_key_env(spec: WhaleRunSpec) -> list[dict[str, Any]]:
    """The LLM judge's API key (``spec.verifier.judge.apiKeySecret`` under ``apiKeyEnv``) for a pod that scores
    episodes, when the run scores with the judge: the eval, weight and harness-search Jobs (:func:`workload_env`),
    never the harness host, the tool services or the prepare Job. A ``cli`` proposer's sandbox in the search pod
    gets none of the pod's environment (docs/metaharness.md)."""
    judge = spec.verifier.judge
    if spec.verifier.search_answer != "llmJudge" or judge.api_key_secret is None or judge.api_key_env is None:
        return []
    return [secret_key_env(judge.api_key_env, judge.api_key_secret)]


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
    fails closed (the phase fails, naming spec.sandbox.isolation), it never runs untrusted code unwalled."""
    return {
        "runAsUser": 0,
        "runAsNonRoot": False,
        "capabilities": {"drop": ["ALL"], "add": list(SANDBOX_HOST_CAPABILITIES)},
        "seccompProfile": {"type": "RuntimeDefault"},
        "appArmorProfile": {"type": "Unconfined"},
    }


# ----- Jobs ---------------------------------------------------------------------------------------


def pod_failure_policy() -> dict[str, Any]:
    """Preemption/eviction (DisruptionTarget) does not count as a failure: the pod is recreated and
    the workload resumes from its state. A program error (non-zero exit) fails the attempt at once."""
    return {
        "rules": [
            {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]},
            {
                "action": "FailJob",
                "onExitCodes": {"containerName": WORKER_CONTAINER, "operator": "NotIn", "values": [0]},
            },
        ]
    }


def workload_command(spec: WhaleRunSpec, request: PhaseRequest, store_uri: str) -> list[str]:
    """``python -m whale.workloads <kind> ...``; torchrun in front of a multi-GPU / multi-node train."""
    module = [
        "whale.workloads",
        request.kind.workload,
        "--store",
        store_uri,
        "--run",
        request.run,
        "--phase",
        request.phase,
    ]
    tr = spec.train
    if request.kind is PhaseKind.WEIGHT and (tr.num_nodes > 1 or tr.gpus_per_node > 1):
        return [
            "torchrun",
            f"--nnodes={tr.num_nodes}",
            f"--nproc-per-node={max(tr.gpus_per_node, 1)}",
            "--node-rank=$(NODE_RANK)",
            "--master-addr=$(MASTER_ADDR)",
            f"--master-port={RENDEZVOUS_PORT}",
            # NOTE: "--" ends torchrun's options; without it torchrun reads the workload's --run as
            # an abbreviation of its own --run-path and refuses to start
            "-m",
            "--",
            *module,
        ]
    return ["python", "-m", *module]


def job(
    run: RunRef, spec: WhaleRunSpec, request: PhaseRequest, *, store_uri: str, tools: tuple[ToolService, ...] = ()
) -> Manifest:
    """The Job of one phase attempt: train (weight), search (harness) or eval."""
    name = names.job_name(run.name, request.phase, request.attempt)
    kind = request.kind
    cycle = _request_cycle(request)
    labels = with_queue(
        {
            **names.child_labels(run.name, kind.workload, cycle=cycle, phase=request.phase, attempt=request.attempt),
            names.LABEL_KIND: kind.value,
        },
        spec,
    )
    multi_node = kind is PhaseKind.WEIGHT and spec.train.num_nodes > 1
    if kind is PhaseKind.WEIGHT:
        component = TRAIN
        resources = resources_dict(component_resources(spec, TRAIN, spec.train.resources), spec.train.gpus_per_node)
    else:
        component = WORKERS
        resources = resources_dict(component_resources(spec, WORKERS, spec.cluster.worker_resources))

    env = workload_env(run, spec, request, tools) + harness_host_env(run, spec)
    if multi_node:
        env += [
            {"name": "WHALE_NUM_NODES", "value": str(spec.train.num_nodes)},
            {
                "name": "NODE_RANK",
                "valueFrom": {
                    "fieldRef": {"fieldPath": "metadata.annotations['batch.kubernetes.io/job-completion-index']"}
                },
            },
            {"name": "MASTER_ADDR", "value": f"{name}-0.{names.rendezvous_service_name(name)}.{run.namespace}.svc"},
            {"name": "MASTER_PORT", "value": str(RENDEZVOUS_PORT)},
        ]
    elif kind is PhaseKind.WEIGHT and spec.train.gpus_per_node > 1:
        env += [{"name": "NODE_RANK", "value": "0"}, {"name": "MASTER_ADDR", "value": "127.0.0.1"}]

    container: dict[str, Any] = {
        "name": WORKER_CONTAINER,
        "image": spec.cluster.images.worker,
        "imagePullPolicy": spec.cluster.images.pull_policy,
        "command": workload_command(spec, request, store_uri),
        "env": env,
        "terminationMessagePolicy": "FallbackToLogsOnError",
        "volumeMounts": [{"name": "dshm", "mountPath": "/dev/shm"}],
    }
    sandbox_host = workload_needs_sandbox_host(spec, kind)
    if sandbox_host:  # the harness search starts the cli agent's sandbox itself (namespaces): the exception
        container["securityContext"] = sandbox_host_security_context()
        pod_security: dict[str, Any] = {"seccompProfile": {"type": "RuntimeDefault"}}
    else:
        container["securityContext"] = restricted_container_security_context()
        pod_security = restricted_pod_security_context(spec, component, WORKER_UID)
    env_from = storage_env_from(spec)
    if env_from:
        container["envFrom"] = env_from
    if resources:
        container["resources"] = resources
    if multi_node:
        container["ports"] = [{"name": "rendezvous", "containerPort": RENDEZVOUS_PORT}]

    pod_spec: dict[str, Any] = {
        "restartPolicy": "Never",
        **pod_template_fields(spec, component, gpu=requests_gpu(resources)),
        # no workload calls the Kubernetes API: no token (a workload identity's own projected token, which its
        # webhook adds as a volume of its own, is not affected)
        "automountServiceAccountToken": False,
        "securityContext": pod_security,
        "containers": [container],
        "volumes": [shm_volume(resources)],
    }
    if multi_node:
        pod_spec["subdomain"] = names.rendezvous_service_name(name)
    template_labels = untrusted(labels) if runs_cli_agent(spec, kind) else labels

    job_spec: dict[str, Any] = {
        # all-or-nothing: a failed pod fails the attempt; the next attempt resumes from the checkpoint
        "backoffLimit": 0,
        "podFailurePolicy": pod_failure_policy(),
        "template": {"metadata": pod_metadata(spec, component, template_labels), "spec": pod_spec},
        **job_lifecycle(spec),
    }
    if multi_node:
        job_spec.update(completionMode="Indexed", completions=spec.train.num_nodes, parallelism=spec.train.num_nodes)

    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": run.metadata(name, labels, {names.ANNOTATION_REQUEST: layout.request_key(run.name, request.phase)}),
        "spec": job_spec,
    }


def prepare_job(run: RunRef, spec: WhaleRunSpec, attempt: int, *, store_uri: str) -> Manifest:
    """The Job that materialises the run's data splits and writes their sizes
    (``python -m whale.workloads prepare``; reads ``layout.spec_key``, writes
    ``layout.split_sizes_key`` last). The attempt of ``decide()``'s phase ``prepare``: no phase label, its kind
    and ``whale.dev/attempt`` label say which (``observe.current_jobs``)."""
    name = names.prepare_job_name(run.name, attempt)
    labels = with_queue(
        {**names.child_labels(run.name, names.PREPARE, attempt=attempt), names.LABEL_KIND: names.PREPARE}, spec
    )
    container: dict[str, Any] = {
        "name": WORKER_CONTAINER,
        "image": spec.cluster.images.worker,
        "imagePullPolicy": spec.cluster.images.pull_policy,
        "command": [
            "python",
            "-m",
            "whale.workloads",
            names.PREPARE,
            "--store",
            store_uri,
            "--run",
            run.name,
            "--phase",
            names.PREPARE,
        ],
        "env": [
            {"name": "WHALE_RUN", "value": run.name},
            {"name": "WHALE_ATTEMPT", "value": str(attempt)},
            {"name": "PYTHONUNBUFFERED", "value": "1"},
            *storage_env(spec),
        ],
        "terminationMessagePolicy": "FallbackToLogsOnError",
        # it fetches and splits data, it runs no harness: restricted whatever spec.sandbox says
        "securityContext": restricted_container_security_context(),
    }
    env_from = storage_env_from(spec)
    if env_from:
        container["envFrom"] = env_from
    resources = resources_dict(component_resources(spec, WORKERS, spec.cluster.worker_resources))
    if resources:
        container["resources"] = resources
    pod: dict[str, Any] = {
        "restartPolicy": "Never",
        **pod_template_fields(spec, WORKERS, gpu=requests_gpu(resources)),
        "automountServiceAccountToken": False,
        "securityContext": restricted_pod_security_context(spec, WORKERS, WORKER_UID),
        "containers": [container],
    }
    if spec.data.source == "full":
        # the full datasets are downloaded here before they go to the store (whale.data.full): scratch
        # disk for them, not the container's writable layer
        container["volumeMounts"] = [{"name": "downloads", "mountPath": PREPARE_DOWNLOADS_DIR}]
        container["env"].append({"name": "WHALE_DOWNLOADS_DIR", "value": PREPARE_DOWNLOADS_DIR})
        pod["volumes"] = [{"name": "downloads", "emptyDir": {"sizeLimit": PREPARE_DOWNLOADS_SIZE}}]
    job_spec: dict[str, Any] = {
        "backoffLimit": 0,
        "podFailurePolicy": pod_failure_policy(),
        "template": {"metadata": pod_metadata(spec, WORKERS, labels), "spec": pod},
        **job_lifecycle(spec),
    }
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": run.metadata(name, labels, {names.ANNOTATION_REQUEST: layout.spec_key(run.name)}),
        "spec": job_spec,
    }


def rendezvous_service(run: RunRef, spec: WhaleRunSpec, request: PhaseRequest) -> Manifest | None:
    """Headless Service for an Indexed train Job: pod ``<job>-<i>`` resolves as
    ``<job>-<i>.<job>-rdzv``; torchrun's master is index 0. None when the Job is single-node."""
    if request.kind is not PhaseKind.WEIGHT or spec.train.num_nodes <= 1:
        return None
    job_name = names.job_name(run.name, request.phase, request.attempt)
    labels = names.child_labels(
        run.name, "rendezvous", cycle=_request_cycle(request), phase=request.phase, attempt=request.attempt
    )
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": run.metadata(names.rendezvous_service_name(job_name), labels),
        "spec": {
            "clusterIP": "None",
            "publishNotReadyAddresses": True,
            "selector": {"batch.kubernetes.io/job-name": job_name},
            "ports": [{"name": "rendezvous", "port": RENDEZVOUS_PORT, "targetPort": RENDEZVOUS_PORT}],
        },
    }


def _request_cycle(request: PhaseRequest) -> int:
    return PhaseId.parse(request.phase).cycle


# ----- inference ----------------------------------------------------------------------------------


def vllm_args(spec: WhaleRunSpec) -> list[str]:
    """``vllm serve`` arguments. The model path is fixed (``/models/current``: a link the weight-sync
    init container and sidecar keep pointing at the served weights, see
    ``whale.inference.weight_sync``), so swapping checkpoints never changes the pod template."""
    inf, model = spec.inference, spec.model
    args = [
        f"{MODELS_DIR}/current",
        "--served-model-name",
        served_model_name(spec),
        "--host",
        "0.0.0.0",
        "--port",
        str(VLLM_PORT),
        "--tensor-parallel-size",
        str(inf.tensor_parallel_size),
        "--max-model-len",
        str(model.max_model_len),
        "--gpu-memory-utilization",
        str(inf.gpu_memory_utilization),
        "--max-num-seqs",
        str(inf.max_concurrency),
    ]
    if inf.tool_call_parser:
        args += ["--enable-auto-tool-choice", "--tool-call-parser", inf.tool_call_parser]
    if inf.reasoning_parser and model.enable_thinking:  # thinking off: nothing to parse out
        args += ["--reasoning-parser", inf.reasoning_parser]
    if model.trust_remote_code:
        args.append("--trust-remote-code")
    return args + list(inf.extra_args)


def _weight_sync_command(run: RunRef, spec: WhaleRunSpec, store_uri: str, once: bool) -> list[str]:
    cmd = [
        "python",
        "-m",
        "whale.inference.weight_sync",
        "--store",
        store_uri,
        "--run",
        run.name,
        "--model",
        spec.model.name,
        "--dest",
        MODELS_DIR,
    ]
    if spec.model.revision:
        cmd += ["--revision", spec.model.revision]
    if once:
        return cmd + ["--once"]
    return cmd + ["--server", f"http://127.0.0.1:{VLLM_PORT}"]


#: the weight-sync and data-fetching helper containers (they stream objects to files; the limit bounds a leak)
HELPER_RESOURCES = {"requests": {"cpu": "250m", "memory": "512Mi"}, "limits": {"memory": "4Gi"}}
#: a sandboxed tool's resources unless spec.cluster.placement.tools says otherwise
SANDBOX_TOOL_RESOURCES = Resources(requests={"cpu": "1", "memory": "2Gi"}, limits={"cpu": "4", "memory": "4Gi"})
#: a tool service's requests when its domain names none
TOOL_REQUESTS = {"cpu": "2", "memory": "8Gi"}

DOORBELL_VOLUME = "doorbell-token"
#: the projected token's lifetime; the kubelet renews it at 80 % (the sidecar reads it anew for each ring)
DOORBELL_TOKEN_S = 3600


def weight_sync_account(run: RunRef, spec: WhaleRunSpec) -> str:
    """The vLLM pod's service account: ``cluster.serviceAccountName`` when set (workload identity for the store),
    else the run's own ``<run>-weight-sync``."""
    return spec.cluster.service_account_name or names.weight_sync_account_name(run.name)


def served_doorbell(run: RunRef, spec: WhaleRunSpec) -> list[Manifest]:
    """The weight-sync sidecar's doorbell (:mod:`whale.inference.doorbell`): the ConfigMap ``<run>-served`` whose
    watch event wakes a run waiting for the served-weights acknowledgement, and the right to stamp it and nothing
    else (``get``/``patch`` on that one ConfigMap), bound to the vLLM pod's service account (the run's own,
    made here with no token of its own, unless ``cluster.serviceAccountName`` names one)."""
    cm = names.served_doorbell_name(run.name)
    access = names.weight_sync_account_name(run.name)
    labels = names.child_labels(run.name, INFERENCE)
    out: list[Manifest] = [{"apiVersion": "v1", "kind": "ConfigMap", "metadata": run.metadata(cm, labels)}]
    if not spec.cluster.service_account_name:
        out.append(
            {
                "apiVersion": "v1",
                "kind": "ServiceAccount",
                "metadata": run.metadata(access, labels),
                "automountServiceAccountToken": False,
            }
        )
    rbac = "rbac.authorization.k8s.io"
    out.append(
        {
            "apiVersion": f"{rbac}/v1",
            "kind": "Role",
            "metadata": run.metadata(access, labels),
            "rules": [
                {"apiGroups": [""], "resources": ["configmaps"], "resourceNames": [cm], "verbs": ["get", "patch"]}
            ],
        }
    )
    out.append(
        {
            "apiVersion": f"{rbac}/v1",
            "kind": "RoleBinding",
            "metadata": run.metadata(access, labels),
            "roleRef": {"apiGroup": rbac, "kind": "Role", "name": access},
            "subjects": [
                {"kind": "ServiceAccount", "name": weight_sync_account(run, spec), "namespace": run.namespace}
            ],
        }
    )
    return out


def doorbell_token_volume() -> dict[str, Any]:
    """What in-cluster clients read under :data:`~whale.inference.doorbell.ACCOUNT_DIR` (token, CA, namespace),
    as a projected volume mounted into the weight-sync sidecar alone (the pod itself mounts no token)."""
    return {
        "name": DOORBELL_VOLUME,
        "projected": {
            "sources": [
                {"serviceAccountToken": {"path": "token", "expirationSeconds": DOORBELL_TOKEN_S}},
                {"configMap": {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
                {"downwardAPI": {"items": [{"path": "namespace", "fieldRef": {"fieldPath": "metadata.namespace"}}]}},
            ]
        },
    }


def inference_deployment(
    run: RunRef,
    spec: WhaleRunSpec,
    *,
    store_uri: str,
    checkpoint: str | None,
    replicas: int = 1,
    doorbell: bool = True,
) -> Manifest:
    """vLLM serving the run's current weights. ``checkpoint`` is recorded as an annotation on the
    Deployment (not the pod template: changing it must not restart the pod); the weight-sync
    sidecar reads the serving target from the store (``control/serving.json``) and reloads vLLM, and with
    ``doorbell`` stamps each acknowledgement on :func:`served_doorbell`'s ConfigMap (its token is the sidecar's
    alone: the pod mounts none)."""
    name = names.inference_name(run.name)
    selector = {names.LABEL_RUN: run.name, "app.kubernetes.io/component": "inference"}
    labels = with_queue(names.child_labels(run.name, "inference"), spec)
    img = spec.cluster.images
    shared_env = [
        {"name": "HF_HOME", "value": f"{MODELS_DIR}/hf"},
        {"name": "HOME", "value": "/tmp"},
        {"name": "WHALE_RUN", "value": run.name},
        *storage_env(spec),
        *hf_token_env(spec),  # they download spec.model from the Hub
    ]
    env_from = storage_env_from(spec)
    mounts = [{"name": "models", "mountPath": MODELS_DIR}]

    def helper(name_: str, once: bool) -> dict[str, Any]:
        rings = doorbell and not once
        c: dict[str, Any] = {
            "name": name_,
            "image": img.worker,
            "imagePullPolicy": img.pull_policy,
            "command": _weight_sync_command(run, spec, store_uri, once),
            # the sidecar calls vLLM's reload endpoints: the key; the init container (before vLLM) needs none
            "env": shared_env
            if once
            else [
                *shared_env,
                inference_api_key_env(run),
                *([{"name": CONFIGMAP_ENV, "value": names.served_doorbell_name(run.name)}] if rings else []),
            ],
            "volumeMounts": mounts
            + ([{"name": DOORBELL_VOLUME, "mountPath": str(ACCOUNT_DIR), "readOnly": True}] if rings else []),
            "resources": HELPER_RESOURCES,
            "securityContext": restricted_container_security_context(),
        }
        if env_from:
            c["envFrom"] = env_from
        return c

    vllm = {
        "name": "vllm",
        "image": img.vllm,
        "imagePullPolicy": img.pull_policy,
        "command": ["vllm", "serve"],
        "args": vllm_args(spec),
        # dev mode exposes the weight reload / cache reset endpoints the sidecar calls
        "env": [
            {"name": "HF_HOME", "value": f"{MODELS_DIR}/hf"},
            {"name": "VLLM_SERVER_DEV_MODE", "value": "1"},
            # a non-root user without a home in the image: caches (torch compile, triton) go to /tmp
            {"name": "HOME", "value": "/tmp"},
            # `vllm serve --api-key` from its environment: the run's shared secret, checked on /v1 (docs/security.md)
            auth_key_env(run, "VLLM_API_KEY", AUTH_VLLM_API_KEY),
        ],
        "ports": [{"name": "http", "containerPort": VLLM_PORT}],
        "volumeMounts": [*mounts, {"name": "dshm", "mountPath": "/dev/shm"}, {"name": "tmp", "mountPath": "/tmp"}],
        "securityContext": restricted_container_security_context(),
        "startupProbe": {
            "httpGet": {"path": "/health", "port": VLLM_PORT},
            "periodSeconds": VLLM_STARTUP_PERIOD_S,
            "failureThreshold": VLLM_STARTUP_FAILURES,
        },
        "readinessProbe": {
            "httpGet": {"path": "/health", "port": VLLM_PORT},
            "periodSeconds": 5,
            "failureThreshold": 3,
        },
        "livenessProbe": {
            "httpGet": {"path": "/health", "port": VLLM_PORT},
            "periodSeconds": 15,
            "failureThreshold": 4,
        },
    }
    res = resources_dict(
        component_resources(spec, INFERENCE, spec.cluster.inference_resources), spec.inference.tensor_parallel_size
    )
    if res:
        vllm["resources"] = res
    if spec.cluster.model_cache_claim_name:
        models: dict[str, Any] = {
            "name": "models",
            "persistentVolumeClaim": {"claimName": spec.cluster.model_cache_claim_name},
        }
    else:
        models = {"name": "models", "emptyDir": {"sizeLimit": spec.cluster.model_cache_size}}

    annotations = {names.ANNOTATION_CHECKPOINT: checkpoint or "base"}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": run.metadata(name, labels, annotations),
        "spec": {
            "replicas": replicas,
            "strategy": {"type": "Recreate"},  # one GPU set: never two servers at once
            "selector": {"matchLabels": selector},
            "template": {
                "metadata": pod_metadata(spec, INFERENCE, {**labels, **selector}),
                "spec": {
                    **pod_template_fields(spec, INFERENCE, gpu=requests_gpu(res)),
                    # no token for the pod: the weight-sync sidecar alone gets one, projected (doorbell_token_volume)
                    **({"serviceAccountName": weight_sync_account(run, spec)} if doorbell else {}),
                    "automountServiceAccountToken": False,
                    "securityContext": restricted_pod_security_context(spec, INFERENCE, WORKER_UID),
                    "initContainers": [helper("fetch-weights", once=True)],
                    "containers": [vllm, helper("weight-sync", once=False)],
                    "volumes": [
                        models,
                        shm_volume(res),
                        {"name": "tmp", "emptyDir": {}},
                        *([doorbell_token_volume()] if doorbell else []),
                    ],
                },
            },
        },
    }


def inference_service(run: RunRef, spec: WhaleRunSpec) -> Manifest:
    name = names.inference_name(run.name)
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": run.metadata(name, names.child_labels(run.name, "inference")),
        "spec": {
            "selector": {names.LABEL_RUN: run.name, "app.kubernetes.io/component": "inference"},
            "ports": [{"name": "http", "port": VLLM_PORT, "targetPort": VLLM_PORT}],
        },
    }


# ----- tool services ------------------------------------------------------------------------------


def tool_deployment(
    run: RunRef, spec: WhaleRunSpec, tool: ToolService, *, store_uri: str, replicas: int = 1
) -> Manifest:
    """A tool service of the run, as the domain describes it (``Domain.tool_services_for``). Files and
    folders it needs (a retriever's corpus, a prepared index) are streamed from the store by an init
    container (``python -m whale.tools.fetch``) into the pod's ``/data`` volume, after the run's prepare
    Job put them there; a startup probe gives a service that loads a large index up to
    :data:`TOOL_STARTUP_TIMEOUT_S` before the liveness probe counts. A sandboxed service runs untrusted
    model-written code, so it gets no credentials, no service-account token, no privileges, and (see
    :func:`sandbox_network_policy`) no network."""
    name = names.tool_name(run.name, tool.name)
    selector = {names.LABEL_RUN: run.name, "app.kubernetes.io/component": tool.name}
    labels = names.child_labels(run.name, tool.name)
    cmd = ["python", "-m", tool.module, "--host", "0.0.0.0", "--port", str(tool.port), *tool.args]
    container: dict[str, Any] = {
        "name": tool.name,
        "image": spec.cluster.images.tools,
        "imagePullPolicy": spec.cluster.images.pull_policy,
        "ports": [{"name": "http", "containerPort": tool.port}],
        "readinessProbe": {"httpGet": {"path": "/healthz", "port": tool.port}, "periodSeconds": 5},
        "livenessProbe": {
            "httpGet": {"path": "/healthz", "port": tool.port},
            "periodSeconds": 20,
            "failureThreshold": 3,
        },
    }
    pod: dict[str, Any] = {**pod_template_fields(spec, TOOLS, gpu=False)}
    pod.pop("serviceAccountName", None)
    pod["automountServiceAccountToken"] = False  # no tool calls the Kubernetes API
    volumes: list[dict[str, Any]] = []
    if tool.fetch:
        keys = [f"{layout.data_prefix(spec.domain)}/{rel}" for rel, _ in tool.fetch]
        local = [f"/data/{rel.rstrip('/').rsplit('/', 1)[-1]}" for rel, _ in tool.fetch]
        fetch: dict[str, Any] = {
            "name": "fetch-data",
            "image": spec.cluster.images.tools,
            "imagePullPolicy": spec.cluster.images.pull_policy,
            "command": [
                "python",
                "-m",
                "whale.tools.fetch",
                store_uri,
                *[x for pair in zip(keys, local, strict=True) for x in pair],
            ],
            "env": storage_env(spec),
            "volumeMounts": [{"name": "data", "mountPath": "/data"}],
            "resources": HELPER_RESOURCES,
            "securityContext": restricted_container_security_context(),
        }
        env_from = storage_env_from(spec)
        if env_from:
            fetch["envFrom"] = env_from
        pod["initContainers"] = [fetch]
        cmd += [x for (_, flag), path in zip(tool.fetch, local, strict=True) for x in (flag, path)]
        volumes.append({"name": "data", "emptyDir": {}})
    tokenizer = policy_tokenizer_container(spec, tool)
    if tokenizer is not None:
        pod["initContainers"] = [*pod.get("initContainers", []), tokenizer]
        cmd += [str(tool.tokenizer_flag), TOKENIZER_PATH]
        volumes.append({"name": TOKENIZER_VOLUME, "emptyDir": {"sizeLimit": TOKENIZER_SIZE}})
    container["command"] = cmd
    pl = component_placement(spec, TOOLS)
    if tool.sandboxed:
        container["resources"] = resources_dict(pl.resources if pl.resources is not None else SANDBOX_TOOL_RESOURCES)
        # each run of model-written code gets its own sandbox (namespaces, fresh root, unprivileged uid);
        # the pod holds no credentials, no token and (NetworkPolicy) no network: the exception to restricted
        container["securityContext"] = {**sandbox_host_security_context(), "readOnlyRootFilesystem": True}
        pod["securityContext"] = {"seccompProfile": {"type": "RuntimeDefault"}}
        container["volumeMounts"] = [{"name": "scratch", "mountPath": "/tmp"}]
        pod["enableServiceLinks"] = False
        volumes.append({"name": "scratch", "emptyDir": {"sizeLimit": "2Gi"}})
        labels = untrusted(labels)
    else:
        container["env"] = [{"name": "WHALE_CACHE_DIR", "value": "/data/cache"}]
        container["volumeMounts"] = [{"name": "data", "mountPath": "/data"}]
        container["resources"] = resources_dict(
            pl.resources if pl.resources is not None else Resources(requests=dict(tool.requests) or TOOL_REQUESTS)
        )
        container["securityContext"] = restricted_container_security_context()
        pod["securityContext"] = restricted_pod_security_context(spec, TOOLS, TOOLS_UID)
        container["startupProbe"] = {
            "httpGet": {"path": "/healthz", "port": tool.port},
            "periodSeconds": TOOL_STARTUP_PERIOD_S,
            "failureThreshold": TOOL_STARTUP_TIMEOUT_S // TOOL_STARTUP_PERIOD_S,
        }
        if not tool.fetch:
            volumes.append({"name": "data", "emptyDir": {}})
    if tokenizer is not None:
        container["volumeMounts"] = [
            *container["volumeMounts"],
            {"name": TOKENIZER_VOLUME, "mountPath": TOKENIZER_DIR, "readOnly": True},
        ]
    pod["volumes"] = volumes
    pod["containers"] = [container]
    return service_deployment(run, spec, TOOLS, name, labels, selector, pod, replicas)


#: where a tool service that counts the policy's tokens (``ToolService.tokenizer_flag``) finds its tokenizer
TOKENIZER_VOLUME = "tokenizer"
TOKENIZER_DIR = "/tokenizer"
TOKENIZER_PATH = f"{TOKENIZER_DIR}/policy"
#: a tokenizer's files (Qwen3.5's: ~20 MB) and the hub's download metadata, with room to spare
TOKENIZER_SIZE = "1Gi"


def policy_tokenizer_container(spec: WhaleRunSpec, tool: ToolService) -> dict[str, Any] | None:
    """The init container that places ``spec.model``'s tokenizer (only its tokenizer files) in the tool's pod
    (``python -m whale.tools.passage_cut``): the worker image, which holds the image-baked models and resolves a
    Hugging Face id as the vLLM pod's ``fetch-weights`` does. None when the tool counts no tokens, or for a GGUF
    model (its tokenizer is inside the GGUF file: the service is started without one and the search tool cuts
    passages at words)."""
    if not tool.tokenizer_flag or spec.model.gguf_file:
        return None
    cmd = ["python", "-m", "whale.tools.passage_cut", "--model", spec.model.name, "--dest", TOKENIZER_PATH]
    if spec.model.revision:
        cmd += ["--revision", spec.model.revision]
    return {
        "name": "fetch-tokenizer",
        "image": spec.cluster.images.worker,
        "imagePullPolicy": spec.cluster.images.pull_policy,
        "command": cmd,
        # the hub's metadata and caches on the pod's volume: the image's home is not this user's
        "env": [
            {"name": "HF_HOME", "value": f"{TOKENIZER_DIR}/hf"},
            {"name": "HOME", "value": "/tmp"},
            *hf_token_env(spec),  # a gated model's tokenizer; the service container itself gets none
        ],
        "volumeMounts": [{"name": TOKENIZER_VOLUME, "mountPath": TOKENIZER_DIR}],
        "resources": HELPER_RESOURCES,
        "securityContext": restricted_container_security_context(),
    }


def tool_service(run: RunRef, tool: ToolService) -> Manifest:
    name = names.tool_name(run.name, tool.name)
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": run.metadata(name, names.child_labels(run.name, tool.name)),
        "spec": {
            "selector": {names.LABEL_RUN: run.name, "app.kubernetes.io/component": tool.name},
            "ports": [{"name": "http", "port": tool.port, "targetPort": tool.port}],
        },
    }


def sandbox_network_policy(run: RunRef, tool: ToolService) -> Manifest:
    """Sandbox pods reach nothing (no egress at all, DNS included); only the run's own workload pods
    may call them, on the service port."""
    name = (
        names.sandbox_policy_name(run.name)
        if tool.name == "sandbox"
        else names.tool_name(run.name, f"{tool.name}-isolation")
    )
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": run.metadata(name, names.child_labels(run.name, tool.name)),
        "spec": {
            "podSelector": {"matchLabels": {names.LABEL_RUN: run.name, "app.kubernetes.io/component": tool.name}},
            "policyTypes": ["Ingress", "Egress"],
            "ingress": [
                {
                    "from": [{"podSelector": {"matchLabels": {names.LABEL_RUN: run.name}}}],
                    "ports": [{"protocol": "TCP", "port": tool.port}],
                }
            ],
            "egress": [],
        },
    }


def inference_network_policy(run: RunRef) -> Manifest:
    """vLLM's port (its OpenAI API and, in dev mode, the weight-reload and cache-reset admin endpoints the
    weight-sync sidecar calls over localhost) is reachable only from the run's own pods. The sidecar shares the
    pod's network namespace, so it needs no rule. Egress is left open: vLLM may download weights."""
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": run.metadata(
            names.tool_name(run.name, "inference-ingress"), names.child_labels(run.name, "inference")
        ),
        "spec": {
            "podSelector": {"matchLabels": {names.LABEL_RUN: run.name, "app.kubernetes.io/component": "inference"}},
            "policyTypes": ["Ingress"],
            "ingress": [
                {
                    "from": [{"podSelector": {"matchLabels": {names.LABEL_RUN: run.name}}}],
                    "ports": [{"protocol": "TCP", "port": VLLM_PORT}],
                }
            ],
        },
    }


#: the components whose pods are a run's workloads (Jobs, or a phase JobSet's workload Job)
WORKLOAD_COMPONENTS = ("train", "search", "eval", names.PREPARE)


def workload_network_policy(run: RunRef) -> Manifest:
    """Nothing but the run's own pods reaches a workload pod: torchrun's rendezvous (:data:`RENDEZVOUS_PORT`, which
    authenticates no one) and the ports NCCL and the process group open between a multi-node train's ranks, which
    are random, hence every port. The workloads serve nothing else; egress is left open (the store, vLLM, the tools,
    a proposer's API)."""
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": run.metadata(names.workload_policy_name(run.name), names.child_labels(run.name, "workloads")),
        "spec": {
            "podSelector": {
                "matchLabels": {names.LABEL_RUN: run.name},
                "matchExpressions": [
                    {"key": "app.kubernetes.io/component", "operator": "In", "values": list(WORKLOAD_COMPONENTS)}
                ],
            },
            "policyTypes": ["Ingress"],
            "ingress": [{"from": [{"podSelector": {"matchLabels": {names.LABEL_RUN: run.name}}}]}],
        },
    }


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


def pod_walled(deployment: Manifest, spec: WhaleRunSpec, tool: ToolService) -> Manifest:
    """A sandboxed tool at ``spec.sandbox.isolation: pod`` or ``none``: its pod (no credentials, no token, no egress)
    is the wall, so its container is restricted and its server runs each snippet without kernel namespaces
    (``--isolation pod``; it refuses to serve where it sees a credential). Only at ``namespaces`` (where the admin
    allows sandbox hosts, :mod:`whale_operator.sandboxing`) is it a privileged sandbox host. Other tools: unchanged."""
    if not tool.sandboxed or spec.sandbox.isolation == "namespaces":
        return deployment
    pod = deployment["spec"]["template"]["spec"]
    for container in pod["containers"]:
        container["command"] = [*container["command"], "--isolation", "pod"]
        container["securityContext"] = {**restricted_container_security_context(), "readOnlyRootFilesystem": True}
    pod["securityContext"] = restricted_pod_security_context(spec, TOOLS, TOOLS_UID)
    return deployment


def service_deployment(
    run: RunRef,
    spec: WhaleRunSpec,
    component: str,
    name: str,
    labels: dict[str, str],
    selector: dict[str, str],
    pod: dict[str, Any],
    replicas: int,
) -> Manifest:
    """A Deployment of one of the run's services (a tool, the harness host) around its pod spec."""
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": run.metadata(name, labels),
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": selector},
            "template": {"metadata": pod_metadata(spec, component, {**labels, **selector}), "spec": pod},
        },
    }


def tool_children(
    run: RunRef, spec: WhaleRunSpec, tools: tuple[ToolService, ...], *, store_uri: str, replicas: int = 1
) -> list[Manifest]:
    out: list[Manifest] = []
    for tool in tools:
        out.append(pod_walled(tool_deployment(run, spec, tool, store_uri=store_uri, replicas=replicas), spec, tool))
        out.append(tool_service(run, tool))
        if tool.sandboxed:
            out.append(sandbox_network_policy(run, tool))
    return out


# ----- the run's own Secret and the harness host ---------------------------------------------------------

#: the harness host's port (``python -m whale.harness.host``)
HARNESS_PORT = 7070
#: the harness pod's user at level pod (the tools image's nobody, like the tool services)
HARNESS_UID = TOOLS_UID
#: the harness pod's resources unless spec.cluster.placement.harness.resources says otherwise (each harness process
#: may take 1 GiB of address space; the workloads open a few per pool)
HARNESS_DEFAULT_RESOURCES = Resources(requests={"cpu": "2", "memory": "4Gi"}, limits={"cpu": "8", "memory": "16Gi"})


def uses_harness_host(spec: WhaleRunSpec) -> bool:
    """Harness files run in the run's harness pod, not in the workload pods, unless the spec asked for no
    isolation at all (``spec.sandbox.isolation: none``, trusted use)."""
    return spec.sandbox.isolation != "none"


def harness_token_env(run: RunRef) -> dict[str, Any]:
    """``$WHALE_HARNESS_TOKEN``: the harness host's caller token, for the host and its callers only."""
    return auth_key_env(run, HARNESS_TOKEN_ENV, AUTH_HARNESS_TOKEN)


def harness_host_env(run: RunRef, spec: WhaleRunSpec) -> list[dict[str, Any]]:
    """What tells a workload to start its harness processes on the run's harness host (``$WHALE_HARNESS_HOST``)
    and the caller token; empty when the run has no harness host."""
    if not uses_harness_host(spec):
        return []
    address = f"{names.harness_name(run.name)}.{run.namespace}.svc:{HARNESS_PORT}"
    return [{"name": HARNESS_HOST_ENV, "value": address}, harness_token_env(run)]


def workload_needs_sandbox_host(spec: WhaleRunSpec, kind: PhaseKind) -> bool:
    """Whether a workload Job's container must start ``whale.sandbox`` sandboxes itself. With a harness host the
    train and eval Jobs run no untrusted code, and neither does a harness search with a built-in proposer: harness
    processes and the proposer's ``run_shell`` commands run on the harness host (:mod:`whale.harness.shell`). Only a
    ``cli`` proposer's agent starts its sandbox in the search pod (at ``namespaces``: it is refused at ``pod``,
    spec.CLI_AT_POD, and kept a sandbox host here should a spec reach this without that check)."""
    if spec.sandbox.isolation == "none":
        return False
    if not uses_harness_host(spec):
        return True
    return runs_cli_agent(spec, kind)


def runs_cli_agent(spec: WhaleRunSpec, kind: PhaseKind) -> bool:
    """Whether a workload Job runs a ``cli`` proposer's agent (untrusted, in a sandbox of the search pod). At
    ``none`` harness code runs in every workload pod unwalled: trusted use, outside these guarantees."""
    return kind is PhaseKind.HARNESS and spec.harness_search.proposer.backend == "cli" and uses_harness_host(spec)


def harness_host_deployment(run: RunRef, spec: WhaleRunSpec, *, replicas: int = 1) -> Manifest:
    """The run's harness host: one small server (``python -m whale.harness.host``) that starts one harness process
    per connection from the run's workload pods and relays its stdio. The pod holds nothing worth taking: no
    service-account token, no store credentials (its only secret is the run's caller token), no volume but an
    emptyDir scratch, a read-only root; no egress (:func:`harness_network_policy`); ``runtimeClassName`` from
    ``spec.cluster.placement.harness``. At ``spec.sandbox.isolation: pod`` it is restricted (the pod is the wall);
    at ``namespaces`` it is the sandbox host (each process gets its own namespaces as well)."""
    name = names.harness_name(run.name)
    selector = {names.LABEL_RUN: run.name, "app.kubernetes.io/component": HARNESS}
    labels = names.child_labels(run.name, HARNESS)
    level = spec.sandbox.isolation
    resources = resources_dict(component_resources(spec, HARNESS, HARNESS_DEFAULT_RESOURCES))
    probe = {"tcpSocket": {"port": HARNESS_PORT}}
    container: dict[str, Any] = {
        "name": HARNESS,
        "image": spec.cluster.images.tools,
        "imagePullPolicy": spec.cluster.images.pull_policy,
        "command": ["python", "-m", "whale.harness.host", "--port", str(HARNESS_PORT), "--isolation", level],
        "env": [harness_token_env(run), {"name": "PYTHONUNBUFFERED", "value": "1"}],
        "ports": [{"name": "harness", "containerPort": HARNESS_PORT}],
        "readinessProbe": {**probe, "periodSeconds": 5},
        "livenessProbe": {**probe, "periodSeconds": 20, "failureThreshold": 3},
        "resources": resources,
        "volumeMounts": [{"name": "scratch", "mountPath": "/tmp"}],
    }
    pod: dict[str, Any] = {**pod_template_fields(spec, HARNESS, gpu=False)}
    pod.pop("serviceAccountName", None)
    if level == "pod":
        container["securityContext"] = {**restricted_container_security_context(), "readOnlyRootFilesystem": True}
        pod["securityContext"] = restricted_pod_security_context(spec, HARNESS, HARNESS_UID)
    else:  # namespaces: the launcher builds each process's namespaces (the exception to restricted)
        container["securityContext"] = {**sandbox_host_security_context(), "readOnlyRootFilesystem": True}
        pod["securityContext"] = {"seccompProfile": {"type": "RuntimeDefault"}}
    pod["automountServiceAccountToken"] = False
    pod["enableServiceLinks"] = False
    pod["containers"] = [container]
    pod["volumes"] = [{"name": "scratch", "emptyDir": {"sizeLimit": "2Gi"}}]
    return service_deployment(run, spec, HARNESS, name, untrusted(labels), selector, pod, replicas)


def harness_host_service(run: RunRef) -> Manifest:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": run.metadata(names.harness_name(run.name), names.child_labels(run.name, HARNESS)),
        "spec": {
            "selector": {names.LABEL_RUN: run.name, "app.kubernetes.io/component": HARNESS},
            "ports": [{"name": "harness", "port": HARNESS_PORT, "targetPort": HARNESS_PORT}],
        },
    }


def harness_network_policy(run: RunRef) -> Manifest:
    """The harness pod reaches nothing (no egress at all, DNS included); only the run's own pods may connect, on
    the harness port."""
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": run.metadata(names.harness_policy_name(run.name), names.child_labels(run.name, HARNESS)),
        "spec": {
            "podSelector": {"matchLabels": {names.LABEL_RUN: run.name, "app.kubernetes.io/component": HARNESS}},
            "policyTypes": ["Ingress", "Egress"],
            "ingress": [
                {
                    "from": [{"podSelector": {"matchLabels": {names.LABEL_RUN: run.name}}}],
                    "ports": [{"protocol": "TCP", "port": HARNESS_PORT}],
                }
            ],
            "egress": [],
        },
    }


def harness_children(run: RunRef, spec: WhaleRunSpec, *, replicas: int = 1) -> list[Manifest]:
    """The harness host's Deployment, Service and NetworkPolicy (none when the run has no harness host). The run's
    Secret it needs is created apart (:func:`auth_secret`, with generated values)."""
    if not uses_harness_host(spec):
        return []
    return [
        harness_host_deployment(run, spec, replicas=replicas),
        harness_host_service(run),
        harness_network_policy(run),
    ]


# ----- colocated placement (inference.placement: colocated) ---------------------------------------------

#: the DRA DeviceClass of NVIDIA's DRA driver: one claim of the pod's GPUs, shared by trainer and server
DRA_GPU_DEVICE_CLASS = "gpu.nvidia.com"
#: DRA's GA API (Kubernetes >= 1.34): the colocated pod's GPU claim; a cluster that does not serve it cannot run one
DRA_API_VERSION = "resource.k8s.io/v1"
DRA_NEEDS = "Kubernetes >= 1.34 (resource.k8s.io/v1, DRA) and NVIDIA's DRA driver"
GPU_CLAIM = "gpus"
#: the folder the trainer writes each step's bf16 weights to and the server reloads from
#: (``whale.rsft.sync.VLLMReloadSync``; ``$WHALE_SYNC_DIR`` / ``$WHALE_SYNC_SERVER_DIR`` of whale.workloads.train)
COLOCATED_SYNC_DIR = "/sync"


class ColocatedPlacementError(ValueError):
    """A spec the colocated train pod cannot be rendered for; the message names the field and the fix."""


def colocated_claim_name(run: RunRef, request: PhaseRequest) -> str:
    return f"{names.job_name(run.name, request.phase, request.attempt)}-gpus"


def colocated_vllm_args(spec: WhaleRunSpec) -> list[str]:
    """``vllm serve`` arguments of the colocated server: its share of the GPUs, sleep mode (unless
    ``sleepLevel: 0``: it never sleeps), and with ``weightSync: cudaIpc`` vLLM's IPC weight-transfer engine
    (``whale.rsft.sync.VLLMIpcSync``)."""
    args = vllm_args(spec)
    at = args.index("--gpu-memory-utilization")
    args[at + 1] = str(spec.inference.colocated_gpu_memory_utilization)
    # only the trainer beside it calls this server (its dev-mode endpoints included): loopback, no other pod
    args[args.index("--host") + 1] = "127.0.0.1"
    if spec.inference.sleep_level:
        args.append("--enable-sleep-mode")
    if spec.inference.weight_sync == "cudaIpc":
        args += IPC_WEIGHT_TRANSFER_ARGS
    return args


def _check_colocated(spec: WhaleRunSpec, request: PhaseRequest) -> None:
    inf, train = spec.inference, spec.train
    problems = []
    if request.kind is not PhaseKind.WEIGHT:
        problems.append(f"phase {request.phase} is a {request.kind.value} phase; only a weight phase trains")
    if inf.placement != "colocated":
        problems.append("spec.inference.placement is not colocated: use job() and inference_deployment()")
    if train.num_nodes != 1:
        problems.append(
            f"spec.train.numNodes is {train.num_nodes}: a colocated train pod is one pod; set 1, or "
            "inference.placement separate"
        )
    if train.gpus_per_node < 1:
        problems.append("spec.train.gpusPerNode is 0: colocated shares GPUs; set it to 1 or more")
    elif inf.tensor_parallel_size > train.gpus_per_node:
        problems.append(
            f"spec.inference.tensorParallelSize ({inf.tensor_parallel_size}) is more than the pod's "
            f"GPUs (train.gpusPerNode {train.gpus_per_node}); lower it"
        )
    if problems:
        raise ColocatedPlacementError("; ".join(problems))


def colocated_gpu_claim_template(run: RunRef, spec: WhaleRunSpec, request: PhaseRequest) -> Manifest:
    """The ResourceClaimTemplate of the colocated train pod's GPUs (``resource.k8s.io/v1``, DRA).

    Two containers cannot share devices through the device plugin (``nvidia.com/gpu`` gives each
    container its own); a DRA claim referenced by both can. Needs Kubernetes >= 1.34 and NVIDIA's DRA
    driver (DeviceClass ``gpu.nvidia.com``)."""
    _check_colocated(spec, request)
    labels = with_queue(
        {
            **names.child_labels(
                run.name,
                request.kind.workload,
                cycle=_request_cycle(request),
                phase=request.phase,
                attempt=request.attempt,
            ),
            names.LABEL_KIND: request.kind.value,
        },
        spec,
    )
    return {
        "apiVersion": DRA_API_VERSION,
        "kind": "ResourceClaimTemplate",
        "metadata": run.metadata(colocated_claim_name(run, request), labels),
        "spec": {
            "spec": {
                "devices": {
                    "requests": [
                        {
                            "name": GPU_CLAIM,
                            "exactly": {
                                "deviceClassName": DRA_GPU_DEVICE_CLASS,
                                "allocationMode": "ExactCount",
                                "count": spec.train.gpus_per_node,
                            },
                        }
                    ]
                }
            }
        },
    }


def _without_gpus(resources: dict[str, Any]) -> dict[str, Any]:
    out = {
        key: {k: v for k, v in values.items() if k != GPU_RESOURCE}
        for key, values in resources.items()
        if key in ("requests", "limits")
    }
    return {key: values for key, values in out.items() if values}


def colocated_train_job(
    run: RunRef, spec: WhaleRunSpec, request: PhaseRequest, *, store_uri: str, tools: tuple[ToolService, ...] = ()
) -> Manifest:
    """The train Job of a weight phase with ``inference.placement: colocated``: one pod, the trainer and a
    vLLM server on the same GPUs (verl's hybrid engine). The server is a native sidecar (an init
    container with ``restartPolicy: Always``: it is up, healthy and serving the phase's start weights,
    fetched by ``fetch-weights`` from the serving target, before the trainer starts, and the Job completes
    when the trainer exits). It runs with ``--enable-sleep-mode`` (not at ``sleepLevel: 0``) and
    ``colocatedGpuMemoryUtilization``; the trainer (``whale.rsft.colocated``) puts it to sleep during each SFT
    update and wakes it before the next generation, and syncs weights through a shared folder
    (``VLLMReloadSync``) or CUDA IPC (``VLLMIpcSync``), not the store. Both
    containers take the GPUs through one DRA claim (:func:`colocated_gpu_claim_template`, created with
    the Job). Pure, like every builder here; raises :class:`ColocatedPlacementError` naming the field."""
    _check_colocated(spec, request)
    manifest = job(run, spec, request, store_uri=store_uri, tools=tools)
    pod = manifest["spec"]["template"]["spec"]
    worker = pod["containers"][0]
    local_url = f"http://127.0.0.1:{VLLM_PORT}/v1"
    worker["env"] = [e for e in worker["env"] if e["name"] not in ("WHALE_INFERENCE_URL", INFERENCE_API_KEY_ENV)] + [
        {"name": "WHALE_INFERENCE_URL", "value": local_url},
        inference_api_key_env(run),  # the sidecar server below checks it
        {"name": "WHALE_SYNC_DIR", "value": COLOCATED_SYNC_DIR},
        {"name": "WHALE_SYNC_SERVER_DIR", "value": COLOCATED_SYNC_DIR},
    ]
    worker["resources"] = {**_without_gpus(worker.get("resources", {})), "claims": [{"name": GPU_CLAIM}]}
    worker["volumeMounts"] = [*worker["volumeMounts"], {"name": "sync", "mountPath": COLOCATED_SYNC_DIR}]

    img = spec.cluster.images
    mounts = [{"name": "models", "mountPath": MODELS_DIR}]
    fetch: dict[str, Any] = {
        "name": "fetch-weights",
        "image": img.worker,
        "imagePullPolicy": img.pull_policy,
        "command": _weight_sync_command(run, spec, store_uri, once=True),
        "env": [
            {"name": "HF_HOME", "value": f"{MODELS_DIR}/hf"},
            {"name": "WHALE_RUN", "value": run.name},
            *storage_env(spec),
            *hf_token_env(spec),
        ],
        "volumeMounts": mounts,
        "resources": HELPER_RESOURCES,
        "securityContext": restricted_container_security_context(),
    }
    env_from = storage_env_from(spec)
    if env_from:
        fetch["envFrom"] = env_from
    server_resources = _without_gpus(resources_dict(spec.cluster.inference_resources))
    # weightSync cudaIpc: the server unpickles the trainer's CUDA IPC handles (vLLM's HTTP transport of them);
    # only this pod reaches its port (the trainer on loopback: the server is no Service's endpoint)
    ipc = spec.inference.weight_sync == "cudaIpc"
    ipc_env = [{"name": k, "value": v} for k, v in IPC_WEIGHT_TRANSFER_ENV.items()] if ipc else []
    vllm: dict[str, Any] = {
        "name": "vllm",
        "image": img.vllm,
        "imagePullPolicy": img.pull_policy,
        "restartPolicy": "Always",  # a native sidecar: started first, stopped after the trainer exits
        "command": ["vllm", "serve"],
        "args": colocated_vllm_args(spec),
        # dev mode: /sleep, /wake_up, /collective_rpc reload_weights, /reset_prefix_cache
        "env": [
            {"name": "HF_HOME", "value": f"{MODELS_DIR}/hf"},
            {"name": "VLLM_SERVER_DEV_MODE", "value": "1"},
            # the pod's non-root user has no home in vLLM's image: caches go to /tmp (as in the vLLM Deployment)
            {"name": "HOME", "value": "/tmp"},
            auth_key_env(run, "VLLM_API_KEY", AUTH_VLLM_API_KEY),  # the trainer sends it ($WHALE_INFERENCE_API_KEY)
            *ipc_env,
        ],
        "volumeMounts": [
            *mounts,
            {"name": "sync", "mountPath": COLOCATED_SYNC_DIR},
            {"name": "dshm", "mountPath": "/dev/shm"},
        ],
        # the server listens on loopback, which the kubelet's HTTP probe (to the pod IP) cannot reach
        "startupProbe": {
            "exec": {"command": ["python3", "-c", LOOPBACK_HEALTH_PROBE]},
            "periodSeconds": VLLM_STARTUP_PERIOD_S,
            "failureThreshold": VLLM_STARTUP_FAILURES,
        },
        "resources": {**server_resources, "claims": [{"name": GPU_CLAIM}]},
        # restricted like every container of the pod (the pod's securityContext: non-root, RuntimeDefault seccomp)
        "securityContext": restricted_container_security_context(),
    }
    pod["initContainers"] = [fetch, vllm]
    if ipc:  # CUDA IPC opens another process's memory only within one PID namespace
        pod["shareProcessNamespace"] = True
    pod["resourceClaims"] = [{"name": GPU_CLAIM, "resourceClaimTemplateName": colocated_claim_name(run, request)}]
    pod["volumes"] = [
        *pod["volumes"],
        {"name": "models", "emptyDir": {"sizeLimit": spec.cluster.model_cache_size}},
        {"name": "sync", "emptyDir": {}},
    ]
    return manifest


# ----- one admission unit per phase (cluster.admission: jobSet) and gang scheduling -----------------

#: JobSet >= 0.8 (``dependsOn``); Kueue admits a JobSet as one Workload, a pod set per replicated Job
JOBSET_API_VERSION = names.JOBSET_API_VERSION
#: scheduler-plugins' coscheduling: the PodGroup and the pod label that puts a pod in it
PODGROUP_API_VERSION = "scheduling.x-k8s.io/v1alpha1"
POD_GROUP_LABEL = "scheduling.x-k8s.io/pod-group"
#: the phase's vLLM server restarts in place (its container) this often before the JobSet fails
INFERENCE_JOB_RESTARTS = 3


def uses_jobset(spec: WhaleRunSpec) -> bool:
    """``cluster.admission`` resolved: each phase a JobSet holding its own vLLM server and its workload. ``auto``
    means yes under a Kueue queue when vLLM runs on GPUs of its own (colocated already puts both in one pod)."""
    admission = spec.cluster.admission
    if admission == "auto":
        return bool(spec.cluster.queue_name) and uses_vllm(spec) and spec.inference.placement == "separate"
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
    spec: WhaleRunSpec,
    request: PhaseRequest,
    *,
    store_uri: str,
    checkpoint: str | None,
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
        elif env["name"] == "MASTER_ADDR" and spec.train.num_nodes > 1:
            env["value"] = master
    wl_spec["template"]["metadata"] = _without_queue(wl_spec["template"]["metadata"])

    # no doorbell: the operator never waits for this server's acknowledgement (JobSet starts the workload on Ready)
    server = inference_deployment(run, spec, store_uri=store_uri, checkpoint=checkpoint, doorbell=False)["spec"][
        "template"
    ]
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


def gang_size(spec: WhaleRunSpec, request: PhaseRequest) -> int:
    """How many pods of this phase must be placed together (``cluster.gangScheduling: podGroup``): the nodes of a
    multi-node train Job; 0 when the phase gets no PodGroup."""
    if spec.cluster.gang_scheduling != "podGroup" or request.kind is not PhaseKind.WEIGHT:
        return 0
    return spec.train.num_nodes if spec.train.num_nodes > 1 else 0


def pod_group(run: RunRef, spec: WhaleRunSpec, request: PhaseRequest, child: str) -> Manifest | None:
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


def required_apis(spec: WhaleRunSpec) -> list[tuple[str, str, str]]:
    """(spec field, API group/version, what installs it) of the custom kinds this spec's children need: the run
    cannot start without them, and says so on the field that asks for them."""
    out = []
    if uses_jobset(spec):
        out.append(("spec.cluster.admission", JOBSET_API_VERSION, "JobSet >= 0.8 (kubernetes-sigs/jobset)"))
    if spec.cluster.gang_scheduling == "podGroup" and spec.train.num_nodes > 1:
        out.append(
            ("spec.cluster.gangScheduling", PODGROUP_API_VERSION, "scheduler-plugins' coscheduling PodGroup CRD")
        )
    if uses_vllm(spec) and spec.inference.placement == "colocated":
        out.append(("spec.inference.placement", DRA_API_VERSION, DRA_NEEDS))
    return out


#: how a spec field that needs an API this cluster lacks can do without it (children.check_apis' message)
API_FIXES = {
    "spec.cluster.admission": "set cluster.admission: perChild",
    "spec.cluster.gangScheduling": "set gangScheduling: none",
    "spec.inference.placement": "set inference.placement: separate",
}
