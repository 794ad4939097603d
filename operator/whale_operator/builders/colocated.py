"""Colocated placement (``inference.placement: colocated``): trainer and vLLM server in one pod sharing its GPUs
through a DRA ResourceClaim.
"""

from __future__ import annotations

from typing import Any

from whale.core.protocol import PhaseKind, PhaseRequest
from whale.domain import ToolService
from whale.inference.vllm_control import IPC_WEIGHT_TRANSFER_ARGS, IPC_WEIGHT_TRANSFER_ENV
from whale_operator import names
from whale_operator.builders.auth import AUTH_VLLM_API_KEY, INFERENCE_API_KEY_ENV, auth_key_env, inference_api_key_env
from whale_operator.builders.inference import _weight_sync_command, vllm_args
from whale_operator.builders.jobs import _request_cycle, job
from whale_operator.builders.pods import (
    GPU_RESOURCE,
    HELPER_RESOURCES,
    LOOPBACK_HEALTH_PROBE,
    MODELS_DIR,
    VLLM_PORT,
    VLLM_STARTUP_FAILURES,
    VLLM_STARTUP_PERIOD_S,
    Manifest,
    RunRef,
    compile_cache_env,
    hf_token_env,
    models_volume,
    resources_dict,
    restricted_container_security_context,
    storage_env,
    storage_env_from,
    with_queue,
)
from whale_operator.cluster_spec import ClusterRunSpec

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


def colocated_vllm_args(spec: ClusterRunSpec) -> list[str]:
    """``vllm serve`` arguments of the colocated server: its share of the GPUs, sleep mode (unless
    ``sleepLevel: 0``: it never sleeps), and with ``weightSync: cudaIpc`` vLLM's IPC weight-transfer engine
    (``whale.rsft.sync.VLLMIpcSync``)."""
    args = vllm_args(spec)
    at = args.index("--gpu-memory-utilization")
    args[at + 1] = str(spec.execution.inference.colocated_gpu_memory_utilization)
    # only the trainer beside it calls this server (its dev-mode endpoints included): loopback, no other pod
    args[args.index("--host") + 1] = "127.0.0.1"
    if spec.execution.inference.sleep_level:
        args.append("--enable-sleep-mode")
    if spec.execution.inference.weight_sync == "cudaIpc":
        args += IPC_WEIGHT_TRANSFER_ARGS
    return args


def _check_colocated(spec: ClusterRunSpec, request: PhaseRequest) -> None:
    inf, train = spec.execution.inference, spec.execution.train
    problems = []
    if request.kind is not PhaseKind.WEIGHT:
        problems.append(f"phase {request.phase} is a {request.kind.value} phase; only a weight phase trains")
    if inf.placement != "colocated":
        problems.append("spec.execution.inference.placement is not colocated: use job() and inference_deployment()")
    if train.num_nodes != 1:
        problems.append(
            f"spec.execution.train.numNodes is {train.num_nodes}: a colocated train pod is one pod; set 1, or "
            "inference.placement separate"
        )
    if train.gpus_per_node < 1:
        problems.append("spec.execution.train.gpusPerNode is 0: colocated shares GPUs; set it to 1 or more")
    elif inf.tensor_parallel_size > train.gpus_per_node:
        problems.append(
            f"spec.execution.inference.tensorParallelSize ({inf.tensor_parallel_size}) is more than the pod's "
            f"GPUs (train.gpusPerNode {train.gpus_per_node}); lower it"
        )
    if problems:
        raise ColocatedPlacementError("; ".join(problems))


def colocated_gpu_claim_template(run: RunRef, spec: ClusterRunSpec, request: PhaseRequest) -> Manifest:
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
                                "count": spec.execution.train.gpus_per_node,
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
    run: RunRef, spec: ClusterRunSpec, request: PhaseRequest, *, store_uri: str, tools: tuple[ToolService, ...] = ()
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
    ipc = spec.execution.inference.weight_sync == "cudaIpc"
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
            # the pod's non-root user has no home in vLLM's image: HOME is /tmp, the compile caches on the model volume
            {"name": "HOME", "value": "/tmp"},
            *compile_cache_env(),
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
        models_volume(spec),  # the claim, as the run's vLLM Deployment has it: weights and compile caches kept
        {"name": "sync", "emptyDir": {}},
    ]
    return manifest
