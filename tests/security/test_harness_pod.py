"""The run's harness pod as the operator renders it (issue #16): it holds no credential and no token, reaches
nothing, admits only the run's pods, takes its runtimeClassName from spec.cluster.placement.harness, and is
restricted at ``spec.execution.sandbox.isolation: pod`` — as are then the train and eval Jobs, which no longer start any
sandbox, the code tool, and the harness search, whose proposer's ``run_shell`` commands run on the harness host
(at ``namespaces`` it keeps the sandbox host, for the ``cli`` agent's sandbox; ``cli`` is refused at ``pod``);
``whale run`` refuses ``pod``. Every object validates for every supported Kubernetes (tests/operator/test_pod_security.py)."""

from __future__ import annotations

from typing import Any

import kubernetes_validate
import pytest

from tests.operator.pod_security import pod_spec, violations
from tests.operator.test_builders import make_spec, tools_of, weight_request
from tests.operator.test_packaging import K8S_VERSIONS
from whale.core import layout
from whale.core.protocol import EvalPhaseArgs, HarnessPhaseArgs, PhaseKind, phase_request
from whale.harness import launch
from whale_operator import builders, names
from whale_operator.cluster_spec import ClusterRunSpec

RUN = builders.RunRef("demo", "team-a", "uid-1")
STORE = "s3://whale"


def spec_at(isolation: str, **placement: Any) -> ClusterRunSpec:
    sandbox = {"isolation": isolation, "acknowledgeUnisolated": isolation == "none"}
    spec = make_spec(sandbox=sandbox)
    if placement:
        cluster = spec.cluster.to_wire() | {"placement": {"harness": placement}}
        spec = make_spec(sandbox=sandbox, cluster=cluster)
    return spec


def job_of(spec: ClusterRunSpec, kind: PhaseKind) -> dict[str, Any]:
    wire = spec.to_wire()
    if kind is PhaseKind.WEIGHT:
        req = weight_request(spec)
    elif kind is PhaseKind.HARNESS:
        args = HarnessPhaseArgs(
            cycle=1, incoming_harness=None, checkpoint=None, step=0, iterations=2, archive="runs/demo/archive/c01"
        )
        req = phase_request(wire, run="demo", phase="c01-harness", attempt=1, args=args)
    else:
        at_start = EvalPhaseArgs(cycle=0, step=0, after="start", checkpoint=None, harness=None)
        req = phase_request(wire, run="demo", phase="eval-c00-s000000-start", attempt=1, args=at_start)
    return builders.job(RUN, spec, req, store_uri=STORE, tools=tools_of("math_reasoning"))


def secret_refs(pod: dict[str, Any]) -> list[str]:
    """Every Secret a pod can read: env secretKeyRefs, envFrom secretRefs, secret and projected volumes."""
    out = []
    for c in pod.get("containers", []) + pod.get("initContainers", []):
        out += [
            e["valueFrom"]["secretKeyRef"]["key"] for e in c.get("env", []) if "secretKeyRef" in e.get("valueFrom", {})
        ]
        out += [f"envFrom:{e}" for e in c.get("envFrom", [])]
    for v in pod.get("volumes", []):
        if "secret" in v or "projected" in v:
            out.append(f"volume:{v['name']}")
    return out


@pytest.mark.parametrize("isolation", ["pod", "namespaces"])
def test_the_harness_pod_holds_no_credential_no_token_and_only_a_scratch_volume(isolation: str) -> None:
    spec = spec_at(isolation, runtimeClassName="gvisor")
    dep, svc, policy = builders.harness_children(RUN, spec)
    pod = pod_spec(dep)
    assert pod is not None
    assert pod["automountServiceAccountToken"] is False and "serviceAccountName" not in pod
    assert pod["runtimeClassName"] == "gvisor"
    assert secret_refs(pod) == [builders.AUTH_HARNESS_TOKEN]  # the caller token, nothing else
    (container,) = pod["containers"]
    assert "envFrom" not in container
    assert {e["name"] for e in container["env"]} == {launch.HARNESS_TOKEN_ENV, "PYTHONUNBUFFERED"}
    assert pod["volumes"] == [{"name": "scratch", "emptyDir": {"sizeLimit": "2Gi"}}]
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert container["command"][-2:] == ["--isolation", isolation]
    assert svc["spec"]["selector"] == dep["spec"]["selector"]["matchLabels"]
    assert policy["spec"]["podSelector"]["matchLabels"] == dep["spec"]["selector"]["matchLabels"]
    if isolation == "pod":
        assert violations(dep) == []
    else:  # the launcher builds namespaces there too: the listed exception
        assert container["securityContext"]["capabilities"]["add"] == list(builders.SANDBOX_HOST_CAPABILITIES)


def test_the_harness_pod_reaches_nothing_and_admits_only_the_runs_pods() -> None:
    policy = builders.harness_network_policy(RUN)
    assert policy["spec"]["policyTypes"] == ["Ingress", "Egress"]
    assert policy["spec"]["egress"] == []  # no egress at all, DNS included
    (rule,) = policy["spec"]["ingress"]
    assert rule["from"] == [{"podSelector": {"matchLabels": {names.LABEL_RUN: "demo"}}}]  # no namespaceSelector
    assert rule["ports"] == [{"protocol": "TCP", "port": builders.HARNESS_PORT}]


@pytest.mark.parametrize("isolation", ["pod", "namespaces"])
def test_the_workers_call_the_harness_host_and_start_no_sandbox_of_their_own(isolation: str) -> None:
    """A built-in proposer's search runs its ``run_shell`` on the harness host: at either level no workload pod starts
    a sandbox (only a ``cli`` agent's search does, at namespaces: tests/operator/test_least_privilege.py)."""
    spec = spec_at(isolation)
    for kind in (PhaseKind.WEIGHT, PhaseKind.EVAL, PhaseKind.HARNESS):
        job = job_of(spec, kind)
        (container,) = pod_spec(job)["containers"]
        env = {e["name"]: e for e in container["env"]}
        assert env[launch.HARNESS_HOST_ENV]["value"] == f"demo-harness.team-a.svc:{builders.HARNESS_PORT}"
        ref = env[launch.HARNESS_TOKEN_ENV]["valueFrom"]["secretKeyRef"]
        assert ref == {"name": names.auth_secret_name("demo"), "key": builders.AUTH_HARNESS_TOKEN}
        assert violations(job) == [], kind  # no workload pod starts a sandbox itself: the search too is restricted
        ctx = container["securityContext"]
        assert ctx["allowPrivilegeEscalation"] is False and ctx["capabilities"] == {"drop": ["ALL"]}
        pod = pod_spec(job)["securityContext"]
        assert pod["runAsNonRoot"] is True and pod["seccompProfile"] == {"type": "RuntimeDefault"}


def test_the_cli_backend_is_refused_at_pod_with_the_field_and_the_fix() -> None:
    """The cli agent needs egress to its model's API, which the harness pod, where sandboxes run at pod, has not."""
    proposer = {"backend": "cli", "command": ["agent", "{prompt}"]}
    with pytest.raises(
        ValueError, match="harnessSearch.proposer.backend: cli cannot run at execution.sandbox.isolation pod"
    ) as err:
        make_spec(sandbox={"isolation": "pod"}, harnessSearch={"proposer": proposer})
    assert "openai or anthropic" in str(err.value) and "sandbox.isolation namespaces" in str(err.value)
    at_namespaces = make_spec(sandbox={"isolation": "namespaces"}, harnessSearch={"proposer": proposer})
    assert builders.runs_cli_agent(at_namespaces, PhaseKind.HARNESS)


def test_isolation_none_has_no_harness_host() -> None:
    spec = spec_at("none")
    assert builders.harness_children(RUN, spec) == []
    job = job_of(spec, PhaseKind.WEIGHT)
    (container,) = pod_spec(job)["containers"]
    assert launch.HARNESS_HOST_ENV not in {e["name"] for e in container["env"]}


def test_at_pod_the_code_tool_is_restricted_and_walled_by_its_pod() -> None:
    spec = spec_at("pod")
    (dep,) = [
        m
        for m in builders.tool_children(RUN, spec, tools_of("math_reasoning"), store_uri=STORE)
        if m["kind"] == "Deployment"
    ]
    pod = pod_spec(dep)
    assert pod is not None and violations(dep) == []
    assert pod["automountServiceAccountToken"] is False and secret_refs(pod) == []
    assert pod["containers"][0]["command"][-2:] == ["--isolation", "pod"]
    # at namespaces it stays the sandbox host
    (dep,) = [
        m
        for m in builders.tool_children(RUN, spec_at("namespaces"), tools_of("math_reasoning"), store_uri=STORE)
        if m["kind"] == "Deployment"
    ]
    assert "--isolation" not in pod_spec(dep)["containers"][0]["command"]


def test_the_runs_secret_has_the_agreed_shape_and_validates() -> None:
    secret = builders.auth_secret(RUN, {builders.AUTH_HARNESS_TOKEN: "t", builders.AUTH_VLLM_API_KEY: "k"})
    assert secret["metadata"]["name"] == "demo-auth" and secret["type"] == "Opaque"
    assert secret["stringData"] == {"harness-token": "t", "vllm-api-key": "k"}
    assert secret["metadata"]["ownerReferences"][0]["uid"] == "uid-1"
    for obj in [secret, *builders.harness_children(RUN, spec_at("pod", runtimeClassName="gvisor"))]:
        for version in K8S_VERSIONS:
            kubernetes_validate.validate(obj, version, strict=True)


def test_the_harness_children_keep_the_longest_run_name_whole() -> None:
    run = "r" * layout.RUN_NAME_MAX_LEN
    assert names.harness_name(run) == f"{run}-harness"
    assert names.harness_policy_name(run) == f"{run}-harness-isolation"
    assert names.auth_secret_name(run) == f"{run}-auth"


def test_the_code_tool_at_pod_refuses_to_serve_while_it_sees_a_credential() -> None:
    """``--isolation pod`` drops the kernel namespaces (its pod is the wall), so, like the harness host, it refuses
    to start where a credential is in reach."""
    import subprocess
    import sys

    from tests.fixtures.harness_host import ROOT, free_port, host_env

    done = subprocess.run(
        [sys.executable, "-m", "whale.tools.code_interpreter", "--port", str(free_port()), "--isolation", "pod"],
        env=host_env("unused", {"AWS_SECRET_ACCESS_KEY": "fake"}),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode != 0
    assert "refuses to serve at isolation pod" in done.stderr and "$AWS_SECRET_ACCESS_KEY" in done.stderr


def test_the_code_tool_at_pod_runs_code_without_namespaces_but_with_its_limits() -> None:
    from fastapi.testclient import TestClient

    from whale.sandbox import Isolation
    from whale.tools.code import CodeLimits
    from whale.tools.code_interpreter import create_app

    client = TestClient(create_app(CodeLimits(timeout_s=2.0), 1, isolation=Isolation.none()))
    ok = client.post("/run", json={"code": "print(6 * 7)"}).json()
    assert ok["error"] is None and ok["output"] == "42\n"
    hung = client.post("/run", json={"code": "while True: pass"}).json()
    assert hung["outcome"] == "timeout" and hung["error"]
