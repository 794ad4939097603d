"""The harness host (Deployment + Service + a NetworkPolicy with no egress) where the run's harness files run,
unless ``spec.execution.sandbox.isolation`` is none.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from whale.core.protocol import PhaseKind
from whale.core.spec import Resources
from whale.harness.launch import HARNESS_HOST_ENV, HARNESS_TOKEN_ENV
from whale.metaharness.proposer import DEFAULT_KEY_ENV
from whale_operator import names
from whale_operator.builders.auth import AUTH_HARNESS_TOKEN, auth_key_env
from whale_operator.builders.pods import (
    HARNESS,
    TOOLS_UID,
    Manifest,
    RunRef,
    component_resources,
    pod_template_fields,
    resources_dict,
    restricted_container_security_context,
    restricted_pod_security_context,
    sandbox_host_security_context,
    secret_key_env,
    untrusted,
)
from whale_operator.builders.tools import service_deployment
from whale_operator.cluster_spec import ClusterRunSpec

#: the proposer-agent container's program (whale.metaharness.proposer.agent_exchange, not imported here: it pulls the
#: sandbox in)
AGENT_RUNNER_MODULE = "whale.metaharness.proposer.agent_exchange"

# ----- the harness host ---------------------------------------------------------------------------

#: the harness host's port (``python -m whale.harness.host``)
HARNESS_PORT = 7070
#: the harness pod's user at level pod (the tools image's nobody, like the tool services)
HARNESS_UID = TOOLS_UID
#: the harness pod's resources unless spec.cluster.placement.harness.resources says otherwise (each harness process
#: may take 1 GiB of address space; the workloads open a few per pool)
HARNESS_DEFAULT_RESOURCES = Resources(requests={"cpu": "2", "memory": "4Gi"}, limits={"cpu": "8", "memory": "16Gi"})


def uses_harness_host(spec: ClusterRunSpec) -> bool:
    """Harness files run in the run's harness pod, not in the workload pods, unless the spec asked for no
    isolation at all (``spec.execution.sandbox.isolation: none``, trusted use)."""
    return spec.execution.sandbox.isolation != "none"


def harness_token_env(run: RunRef) -> dict[str, Any]:
    """``$WHALE_HARNESS_TOKEN``: the harness host's caller token, for the host and its callers only."""
    return auth_key_env(run, HARNESS_TOKEN_ENV, AUTH_HARNESS_TOKEN)


def harness_host_env(run: RunRef, spec: ClusterRunSpec) -> list[dict[str, Any]]:
    """What tells a workload to start its harness processes on the run's harness host (``$WHALE_HARNESS_HOST``)
    and the caller token; empty when the run has no harness host."""
    if not uses_harness_host(spec):
        return []
    address = f"{names.harness_name(run.name)}.{run.namespace}.svc:{HARNESS_PORT}"
    return [{"name": HARNESS_HOST_ENV, "value": address}, harness_token_env(run)]


def runs_cli_agent(spec: ClusterRunSpec, kind: PhaseKind) -> bool:
    """Whether a workload Job runs a ``cli`` proposer's agent (untrusted): the harness search at ``namespaces`` (it is
    refused at ``pod``, spec.CLI_AT_POD). Its pod then has the :func:`proposer_agent_container` beside the search. At
    ``none`` harness code runs in every workload pod unwalled: trusted use, outside these guarantees."""
    return (
        kind is PhaseKind.HARNESS
        and spec.experiment.harness_search.proposer.backend == "cli"
        and uses_harness_host(spec)
    )


# ----- a cli proposer's agent: a container of its own in the search pod ---------------------------------------------

#: the search Job's container that starts the ``cli`` agent's sandboxes (a native sidecar: an init container with
#: ``restartPolicy: Always``, so it is up before the search and ended when the search ends)
PROPOSER_AGENT_CONTAINER = "proposer-agent"
#: the one volume it shares with the search container, at the same path in both (the archive copy's path is the
#: agent's too): :mod:`whale.metaharness.proposer.agent_exchange`'s directory
AGENT_EXCHANGE_VOLUME = "agent-exchange"
AGENT_EXCHANGE_DIR = "/whale-agent"
#: the search's scratch (the archive copy, each iteration's candidates) lives there too: bounded
AGENT_EXCHANGE_SIZE = "16Gi"
#: the agent container's resources: a Node.js agent CLI and its tools (the sandbox allows 8 GiB of address space per
#: process and a 512 MiB in-memory workspace; resident use of Claude Code is about 1 GiB)
AGENT_RESOURCES = {"requests": {"cpu": "1", "memory": "2Gi"}, "limits": {"memory": "4Gi"}}


#: the agent container's own scratch (/tmp: where the sandbox launcher stages each sandbox; its root is read-only)
AGENT_TMP_VOLUME = "agent-tmp"
AGENT_TMP_SIZE = "2Gi"


def agent_exchange_volume() -> dict[str, Any]:
    return {"name": AGENT_EXCHANGE_VOLUME, "emptyDir": {"sizeLimit": AGENT_EXCHANGE_SIZE}}


def agent_volumes() -> list[dict[str, Any]]:
    """The search pod's volumes for a cli agent: the exchange (both containers) and the agent's /tmp (its own)."""
    return [agent_exchange_volume(), {"name": AGENT_TMP_VOLUME, "emptyDir": {"sizeLimit": AGENT_TMP_SIZE}}]


def agent_exchange_mount() -> dict[str, Any]:
    return {"name": AGENT_EXCHANGE_VOLUME, "mountPath": AGENT_EXCHANGE_DIR}


def proposer_agent_container(spec: ClusterRunSpec, services: Sequence[str] = ()) -> dict[str, Any]:
    """The container that runs a ``cli`` proposer's agent (``python -m whale.metaharness.proposer.agent_exchange``):
    it alone is a sandbox host (:func:`sandbox_host_security_context`) and holds the agent's API key (by reference),
    and nothing else: no store credentials, no vLLM key, no caller token, no judge key; the pod mounts no
    service-account token and shares no PID namespace. The runner refuses to serve if it sees any of them.
    ``services``: the URLs of the run's tool services the search reaches (its prototyping kit lists them), which the
    agent reaches through its egress proxy at ``network: proxy`` besides ``allowHosts``."""
    proposer = spec.experiment.harness_search.proposer
    command = ["python", "-m", AGENT_RUNNER_MODULE, "--exchange", AGENT_EXCHANGE_DIR, "--isolation", "namespaces"]
    command += ["--network", proposer.network]
    if proposer.network == "proxy":  # the egress proxy's allow-list: the runner serves it for each session
        for host in proposer.allow_hosts:
            command += ["--allow-host", host]
        for host in proposer.allow_private_hosts:
            command += ["--allow-private-host", host]
        for url in services:
            command += ["--allow-service", url]
    for path in proposer.read_paths:
        command += ["--read-path", path]
    env: list[dict[str, Any]] = [{"name": "PYTHONUNBUFFERED", "value": "1"}]
    key = proposer.api_key_secret
    if key is not None:
        name = key.env or DEFAULT_KEY_ENV
        command += ["--key-env", name]
        env.append(secret_key_env(name, key))
    return {
        "name": PROPOSER_AGENT_CONTAINER,
        "image": spec.cluster.images.worker,
        "imagePullPolicy": spec.cluster.images.pull_policy,
        "restartPolicy": "Always",
        "command": command,
        "env": env,
        "resources": AGENT_RESOURCES,
        "securityContext": {**sandbox_host_security_context(), "readOnlyRootFilesystem": True},
        "volumeMounts": [agent_exchange_mount(), {"name": AGENT_TMP_VOLUME, "mountPath": "/tmp"}],
    }


def harness_host_deployment(run: RunRef, spec: ClusterRunSpec, *, replicas: int = 1) -> Manifest:
    """The run's harness host: one small server (``python -m whale.harness.host``) that starts one harness process
    per connection from the run's workload pods and relays its stdio. The pod holds nothing worth taking: no
    service-account token, no store credentials (its only secret is the run's caller token), no volume but an
    emptyDir scratch, a read-only root; no egress (:func:`harness_network_policy`); ``runtimeClassName`` from
    ``spec.cluster.placement.harness``. At ``spec.execution.sandbox.isolation: pod`` it is restricted (the pod is the wall);
    at ``namespaces`` it is the sandbox host (each process gets its own namespaces as well)."""
    name = names.harness_name(run.name)
    selector = {names.LABEL_RUN: run.name, "app.kubernetes.io/component": HARNESS}
    labels = names.child_labels(run.name, HARNESS)
    level = spec.execution.sandbox.isolation
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


def harness_children(run: RunRef, spec: ClusterRunSpec, *, replicas: int = 1) -> list[Manifest]:
    """The harness host's Deployment, Service and NetworkPolicy (none when the run has no harness host). The run's
    Secret it needs is created apart (:func:`auth_secret`, with generated values)."""
    if not uses_harness_host(spec):
        return []
    return [
        harness_host_deployment(run, spec, replicas=replicas),
        harness_host_service(run),
        harness_network_policy(run),
    ]
