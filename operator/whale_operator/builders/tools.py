"""The tool services a domain declares (``Domain.tool_services``: retriever, code sandbox): Deployment, Service,
the sandboxed tools' NetworkPolicy, and the policy tokenizer some of them need.
"""

from __future__ import annotations

import json
from typing import Any

from whale.core import layout
from whale.core.spec import Resources
from whale.domain import DOMAIN_OPTIONS_FLAG, ToolService
from whale_operator import names
from whale_operator.builders.pods import (
    HELPER_RESOURCES,
    TOOL_STARTUP_PERIOD_S,
    TOOL_STARTUP_TIMEOUT_S,
    TOOLS,
    TOOLS_UID,
    Manifest,
    RunRef,
    component_placement,
    hf_token_env,
    pod_metadata,
    pod_template_fields,
    resources_dict,
    restricted_container_security_context,
    restricted_pod_security_context,
    sandbox_host_security_context,
    storage_env,
    storage_env_from,
    untrusted,
)
from whale_operator.cluster_spec import ClusterRunSpec

#: a sandboxed tool's resources unless spec.cluster.placement.tools says otherwise
SANDBOX_TOOL_RESOURCES = Resources(requests={"cpu": "1", "memory": "2Gi"}, limits={"cpu": "4", "memory": "4Gi"})
#: a tool service's requests when its domain names none
TOOL_REQUESTS = {"cpu": "2", "memory": "8Gi"}
# ----- tool services ------------------------------------------------------------------------------


def tool_deployment(
    run: RunRef, spec: ClusterRunSpec, tool: ToolService, *, store_uri: str, replicas: int = 1
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
    if tool.verifier_flag:  # the environment service judges as the run's episodes do: the verifier and the options
        cmd += [
            tool.verifier_flag,
            json.dumps(spec.experiment.verifier.to_wire(), sort_keys=True, separators=(",", ":")),
            DOMAIN_OPTIONS_FLAG,
            json.dumps(spec.experiment.domain_options, sort_keys=True, separators=(",", ":")),
        ]
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


def policy_tokenizer_container(spec: ClusterRunSpec, tool: ToolService) -> dict[str, Any] | None:
    """The init container that places ``spec.experiment.model``'s tokenizer (only its tokenizer files) in the tool's pod
    (``python -m whale.tools.passage_cut``): the worker image, which holds the image-baked models and resolves a
    Hugging Face id as the vLLM pod's ``fetch-weights`` does. None when the tool counts no tokens, or for a GGUF
    model (its tokenizer is inside the GGUF file: the service is started without one and the search tool cuts
    passages at words)."""
    if not tool.tokenizer_flag or spec.experiment.model.gguf_file:
        return None
    cmd = ["python", "-m", "whale.tools.passage_cut", "--model", spec.experiment.model.name, "--dest", TOKENIZER_PATH]
    if spec.experiment.model.revision:
        cmd += ["--revision", spec.experiment.model.revision]
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
    may call them, on the service port. A ``run_pods_only`` tool (the environment service) gets the same
    ingress rule with its egress left open: its init container fetches its files from the store."""
    name = (
        names.sandbox_policy_name(run.name)
        if tool.name == "sandbox"
        else names.tool_name(run.name, f"{tool.name}-isolation")
    )
    policy: Manifest = {
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
    if not tool.sandboxed:
        policy["spec"] = {**policy["spec"], "policyTypes": ["Ingress"]}
        del policy["spec"]["egress"]
    return policy


def pod_walled(deployment: Manifest, spec: ClusterRunSpec, tool: ToolService) -> Manifest:
    """A sandboxed tool at ``spec.execution.sandbox.isolation: pod`` or ``none``: its pod (no credentials, no token, no egress)
    is the wall, so its container is restricted and its server runs each snippet without kernel namespaces
    (``--isolation pod``; it refuses to serve where it sees a credential). Only at ``namespaces`` (where the admin
    allows sandbox hosts, :mod:`whale_operator.sandboxing`) is it a privileged sandbox host. Other tools: unchanged."""
    if not tool.sandboxed or spec.execution.sandbox.isolation == "namespaces":
        return deployment
    pod = deployment["spec"]["template"]["spec"]
    for container in pod["containers"]:
        container["command"] = [*container["command"], "--isolation", "pod"]
        container["securityContext"] = {**restricted_container_security_context(), "readOnlyRootFilesystem": True}
    pod["securityContext"] = restricted_pod_security_context(spec, TOOLS, TOOLS_UID)
    return deployment


def service_deployment(
    run: RunRef,
    spec: ClusterRunSpec,
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
    run: RunRef, spec: ClusterRunSpec, tools: tuple[ToolService, ...], *, store_uri: str, replicas: int = 1
) -> list[Manifest]:
    out: list[Manifest] = []
    for tool in tools:
        out.append(pod_walled(tool_deployment(run, spec, tool, store_uri=store_uri, replicas=replicas), spec, tool))
        out.append(tool_service(run, tool))
        if tool.sandboxed or tool.run_pods_only:
            out.append(sandbox_network_policy(run, tool))
    return out
