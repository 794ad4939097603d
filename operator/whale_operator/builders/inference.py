"""The vLLM Deployment and Service serving the run's current weights (swapped in place by the ``weight-sync``
sidecar, never by recreating the pod), its doorbell RBAC and its NetworkPolicy.
"""

from __future__ import annotations

from typing import Any

from whale.inference.doorbell import ACCOUNT_DIR, CONFIGMAP_ENV
from whale_operator import names
from whale_operator.builders.auth import AUTH_VLLM_API_KEY, auth_key_env, inference_api_key_env
from whale_operator.builders.pods import (
    HELPER_RESOURCES,
    INFERENCE,
    MODELS_DIR,
    VLLM_PORT,
    VLLM_STARTUP_FAILURES,
    VLLM_STARTUP_PERIOD_S,
    WORKER_UID,
    Manifest,
    RunRef,
    compile_cache_env,
    component_resources,
    hf_token_env,
    models_volume,
    pod_metadata,
    pod_template_fields,
    requests_gpu,
    resources_dict,
    restricted_container_security_context,
    restricted_pod_security_context,
    served_model_name,
    shm_volume,
    storage_env,
    storage_env_from,
    with_queue,
)
from whale_operator.cluster_spec import ClusterRunSpec

# ----- inference ----------------------------------------------------------------------------------


def vllm_args(spec: ClusterRunSpec) -> list[str]:
    """``vllm serve`` arguments. The model path is fixed (``/models/current``: a link the weight-sync
    init container and sidecar keep pointing at the served weights, see
    ``whale.inference.weight_sync``), so swapping checkpoints never changes the pod template."""
    inf, model = spec.execution.inference, spec.experiment.model
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


def _weight_sync_command(run: RunRef, spec: ClusterRunSpec, store_uri: str, once: bool) -> list[str]:
    cmd = [
        "python",
        "-m",
        "whale.inference.weight_sync",
        "--store",
        store_uri,
        "--run",
        run.name,
        "--model",
        spec.experiment.model.name,
        "--dest",
        MODELS_DIR,
    ]
    if spec.experiment.model.revision:
        cmd += ["--revision", spec.experiment.model.revision]
    if once:
        return cmd + ["--once"]
    return cmd + ["--server", f"http://127.0.0.1:{VLLM_PORT}"]


DOORBELL_VOLUME = "doorbell-token"
#: the projected token's lifetime; the kubelet renews it at 80 % (the sidecar reads it anew for each ring)
DOORBELL_TOKEN_S = 3600


def weight_sync_account(run: RunRef, spec: ClusterRunSpec) -> str:
    """The vLLM pod's service account: ``cluster.serviceAccountName`` when set (workload identity for the store),
    else the run's own ``<run>-weight-sync``."""
    return spec.cluster.service_account_name or names.weight_sync_account_name(run.name)


def served_doorbell(run: RunRef, spec: ClusterRunSpec) -> list[Manifest]:
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
    spec: ClusterRunSpec,
    *,
    store_uri: str,
    replicas: int = 1,
    doorbell: bool = True,
) -> Manifest:
    """vLLM serving the run's current weights: its ``fetch-weights`` init container loads the serving target from the
    store (``control/serving.json``) at the pod's start, and the weight-sync sidecar reloads vLLM on each new one (what
    is served is the WhaleRun's ``status.currentCheckpoint``: the Deployment does not name it, so a new checkpoint
    writes nothing to it), and with
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
        *hf_token_env(spec),  # they download spec.experiment.model from the Hub
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
            # a non-root user without a home in the image: HOME is /tmp; the compile caches go to the model volume
            {"name": "HOME", "value": "/tmp"},
            *compile_cache_env(),
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
        component_resources(spec, INFERENCE, spec.cluster.inference_resources),
        spec.execution.inference.tensor_parallel_size,
    )
    if res:
        vllm["resources"] = res
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": run.metadata(name, labels),
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
                        models_volume(spec),
                        shm_volume(res),
                        {"name": "tmp", "emptyDir": {}},
                        *([doorbell_token_volume()] if doorbell else []),
                    ],
                },
            },
        },
    }


def inference_service(run: RunRef, spec: ClusterRunSpec) -> Manifest:
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
