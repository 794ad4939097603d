"""Issue #29 through the real operator against the API emulator: with its defaults every pod it creates passes Pod
Security restricted (a run at the default ``sandbox.isolation: namespaces`` gets its harness host at ``pod``, and its
workloads read that level from the spec the operator wrote), no pod mounts a service-account token, and the
workloads' ingress NetworkPolicy exists; where the admin lists the namespace, the sandbox host comes back under the
admin's RuntimeClass; a ``cli`` proposer without that opt-in is refused on its field."""

from __future__ import annotations

from typing import Any

import pytest

from tests.fixtures.kube import EmulatedCluster, wait_for
from tests.operator.conftest import BASE_SPEC, deep_merge, prepared_run
from tests.operator.player import WorkloadPlayer
from tests.operator.pod_security import pod_specs, violations
from whale.core import layout
from whale.store import Store
from whale_operator import builders, names

pytestmark = pytest.mark.timeout(120)


def new_run(api: Any, store: Store, namespace: str, name: str, spec: dict[str, Any] | None = None) -> WorkloadPlayer:
    full = deep_merge(deep_merge(BASE_SPEC, {"storage": {"uri": store.uri}}), spec or {})
    return prepared_run(api, store, namespace, name, full)


def created(api: Any, namespace: str, run: str) -> list[dict[str, Any]]:
    selector = f"{names.LABEL_RUN}={run}"
    return [
        *api.list("apps/v1", "deployments", namespace, selector),
        *api.list("batch/v1", "jobs", namespace, selector),
    ]


def harness_of(api: Any, namespace: str, run: str) -> dict[str, Any]:
    return wait_for(
        lambda: api.get("apps/v1", "deployments", namespace, names.harness_name(run)), what="the harness host"
    )


def test_with_the_defaults_every_pod_the_operator_creates_is_restricted(
    start_operator, kube_cluster: EmulatedCluster, kube_namespace: str, store: Store
):
    api, ns = kube_cluster.api, kube_namespace
    with start_operator():
        run = new_run(api, store, ns, "plain")  # sandbox.isolation: namespaces, the default
        run.finish(run.wait_job())  # the start evaluation
        run.wait_job()  # the first weight phase: the vLLM server, the harness host and the policies exist
        harness = harness_of(api, ns, "plain")
        objects = created(api, ns, "plain")
        assert {o["kind"] for o in objects} == {"Deployment", "Job"} and len(objects) >= 4
        for obj in objects:
            assert violations(obj) == [], obj["metadata"]["name"]
            for pod in pod_specs(obj):
                assert pod["automountServiceAccountToken"] is False, obj["metadata"]["name"]
        command = harness["spec"]["template"]["spec"]["containers"][0]["command"]
        assert command[-2:] == ["--isolation", "pod"]
        assert "runtimeClassName" not in harness["spec"]["template"]["spec"]
        # the workloads run at the level the operator renders: the spec it wrote for them says pod
        assert run.store.read_json(layout.spec_key("plain"))["execution"]["sandbox"]["isolation"] == "pod"
        policy = api.get("networking.k8s.io/v1", "networkpolicies", ns, names.workload_policy_name("plain"))
        assert policy is not None and policy["spec"]["policyTypes"] == ["Ingress"]
        # and the tenant is told, once
        told = wait_for(
            lambda: [e for e in api.list("v1", "events", ns) if e.get("reason") == "SandboxIsolation"],
            what="the SandboxIsolation event",
        )
        assert len(told) == 1 and "sandboxHosts.namespaces" in told[0]["message"]


def test_where_the_admin_lists_the_namespace_the_sandbox_host_comes_back_under_its_runtime_class(
    start_operator, kube_cluster: EmulatedCluster, kube_namespace: str, store: Store, monkeypatch
):
    monkeypatch.setenv("WHALE_SANDBOX_HOST_NAMESPACES", f"other,{kube_namespace}")
    monkeypatch.setenv("WHALE_SANDBOX_RUNTIME_CLASS", "gvisor")
    api, ns = kube_cluster.api, kube_namespace
    with start_operator():
        run = new_run(api, store, ns, "hosted")
        run.wait_job()
        pod = harness_of(api, ns, "hosted")["spec"]["template"]["spec"]
        (container,) = pod["containers"]
        assert container["command"][-2:] == ["--isolation", "namespaces"]
        assert container["securityContext"]["capabilities"]["add"] == list(builders.SANDBOX_HOST_CAPABILITIES)
        assert pod["runtimeClassName"] == "gvisor"
        assert not [e for e in api.list("v1", "events", ns) if e.get("reason") == "SandboxIsolation"]
        for obj in created(api, ns, "hosted"):  # the admin's class is for untrusted code only
            if obj["metadata"]["name"] != names.harness_name("hosted"):
                assert all("runtimeClassName" not in p for p in pod_specs(obj)), obj["metadata"]["name"]


def test_a_cli_proposer_without_the_admins_opt_in_is_refused_on_its_field(
    start_operator, kube_cluster: EmulatedCluster, kube_namespace: str, store: Store
):
    api, ns = kube_cluster.api, kube_namespace
    cli = {"harnessSearch": {"proposer": {"backend": "cli", "command": ["agent", "{prompt}"], "network": "host"}}}
    spec = deep_merge(BASE_SPEC, cli)
    spec["harnessSearch"]["proposer"] = cli["harnessSearch"]["proposer"]
    with start_operator():
        run = prepared_run(api, store, ns, "agent", deep_merge(spec, {"storage": {"uri": store.uri}}))
        st = wait_for(lambda: run.status().get("reason") == "InvalidSpec" and run.status(), what="InvalidSpec")
        assert st["message"].startswith("spec.experiment.harnessSearch.proposer.backend: a cli proposer's agent needs")
        assert "sandboxHosts.namespaces" in st["message"] and run.jobs() == []


def test_where_the_admin_opted_in_a_cli_agent_gets_a_container_of_its_own_holding_only_its_key(
    start_operator, kube_cluster: EmulatedCluster, kube_namespace: str, store: Store, monkeypatch
):
    """The harness-search Job the operator creates for a ``cli`` proposer (over HTTP, as the API server holds it):
    the search container is restricted and holds no proposer key; the ``proposer-agent`` sidecar alone is the sandbox
    host and holds that key and nothing else; no shared PID namespace, no token."""
    monkeypatch.setenv("WHALE_SANDBOX_HOST_NAMESPACES", kube_namespace)
    api, ns = kube_cluster.api, kube_namespace
    key = {"name": "whale-proposer", "key": "api-key"}
    cli = {"backend": "cli", "command": ["agent", "{prompt}"], "network": "host", "apiKeySecret": key}
    spec = deep_merge(BASE_SPEC, {"storage": {"uri": store.uri}})
    spec["harnessSearch"]["proposer"] = cli
    with start_operator():
        run = new_run(api, store, ns, "agent", spec)
        search: dict[str, Any] | None = None
        for _ in range(4):  # the start evaluation, the weight phase, then the harness phase
            job = run.wait_job()
            if job["metadata"]["labels"].get(names.LABEL_KIND) == "harness":
                search = job
                break
            run.finish(job)
    assert search is not None
    pod = search["spec"]["template"]["spec"]
    assert pod["automountServiceAccountToken"] is False and pod["shareProcessNamespace"] is False
    (agent,) = pod["initContainers"]
    assert agent["name"] == builders.PROPOSER_AGENT_CONTAINER and agent["restartPolicy"] == "Always"
    refs = [e["valueFrom"]["secretKeyRef"] for e in agent["env"] if "valueFrom" in e]
    assert refs == [key] and "envFrom" not in agent
    assert agent["securityContext"]["capabilities"]["add"] == list(builders.SANDBOX_HOST_CAPABILITIES)
    (worker,) = pod["containers"]
    assert key not in [e.get("valueFrom", {}).get("secretKeyRef") for e in worker["env"]]
    assert violations({"kind": "Pod", "spec": {**pod, "initContainers": []}}) == []
