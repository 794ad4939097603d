"""The harness host (Deployment + Service + a NetworkPolicy with no egress) where the run's harness files run,
unless ``spec.execution.sandbox.isolation`` is none.
"""

from __future__ import annotations

from typing import Any

from whale.core.protocol import PhaseKind
from whale.core.spec import (
    Resources,
    WhaleRunSpec,
)
from whale.harness.launch import HARNESS_HOST_ENV, HARNESS_TOKEN_ENV
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
    untrusted,
)
from whale_operator.builders.tools import service_deployment

# ----- the harness host ---------------------------------------------------------------------------

#: the harness host's port (``python -m whale.harness.host``)
HARNESS_PORT = 7070
#: the harness pod's user at level pod (the tools image's nobody, like the tool services)
HARNESS_UID = TOOLS_UID
#: the harness pod's resources unless spec.cluster.placement.harness.resources says otherwise (each harness process
#: may take 1 GiB of address space; the workloads open a few per pool)
HARNESS_DEFAULT_RESOURCES = Resources(requests={"cpu": "2", "memory": "4Gi"}, limits={"cpu": "8", "memory": "16Gi"})


def uses_harness_host(spec: WhaleRunSpec) -> bool:
    """Harness files run in the run's harness pod, not in the workload pods, unless the spec asked for no
    isolation at all (``spec.execution.sandbox.isolation: none``, trusted use)."""
    return spec.execution.sandbox.isolation != "none"


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
    if spec.execution.sandbox.isolation == "none":
        return False
    if not uses_harness_host(spec):
        return True
    return runs_cli_agent(spec, kind)


def runs_cli_agent(spec: WhaleRunSpec, kind: PhaseKind) -> bool:
    """Whether a workload Job runs a ``cli`` proposer's agent (untrusted, in a sandbox of the search pod). At
    ``none`` harness code runs in every workload pod unwalled: trusted use, outside these guarantees."""
    return (
        kind is PhaseKind.HARNESS
        and spec.experiment.harness_search.proposer.backend == "cli"
        and uses_harness_host(spec)
    )


def harness_host_deployment(run: RunRef, spec: WhaleRunSpec, *, replicas: int = 1) -> Manifest:
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
