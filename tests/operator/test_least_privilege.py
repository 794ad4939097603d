"""Issue #29: restricted by default, no credentials near untrusted code, and the hygiene of every pod — checked on
the rendered objects of every example and every variant (isolation level, the phase JobSet under a queue, colocated
placement, a multi-node train, a ``cli`` proposer), as the operator renders them with its defaults
(:class:`whale_operator.sandboxing.SandboxHostPolicy`: no namespace allows privileged sandbox hosts).

* Every pod passes Pod Security *restricted* (tests/operator/pod_security.py): a run that asks for
  ``sandbox.isolation: namespaces`` runs at ``pod`` unless the admin lists its namespace; a ``cli`` proposer, which
  cannot run at ``pod``, is refused there naming the fix. With the admin's opt-in the sandbox hosts of
  tests/operator/test_pod_security.py come back, and the admin's RuntimeClass goes on every pod of untrusted code.
* The pods that run untrusted code (label ``whale.dev/untrusted``: the harness host, the code tool, the search Job of
  a ``cli`` proposer) mount no service-account token and hold no Secret beyond what they must call; the harness host
  and the code tool reach nothing (egress) and admit only the run's pods.
* No pod mounts a service-account token (the vLLM pod's weight-sync container alone gets a projected one); only the
  run's own pods reach its workload pods (torchrun's rendezvous); every container has a memory limit and every
  ``/dev/shm`` a size; a colocated run needs ``resource.k8s.io/v1``.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest

from tests.fixtures.specs import flat
from tests.operator.pod_security import pod_specs, violations
from tests.operator.test_manifests import (
    EXAMPLES,
    children_of,
    colocated_children_of,
    docs,
    weight_request,
    with_built_in_proposer,
)
from tests.operator.test_packaging import K8S_VERSIONS
from whale.metaharness.proposer import AGENT_EXCHANGE_ENV
from whale_operator import builders, names
from whale_operator.cluster_spec import ClusterRunSpec
from whale_operator.config import OperatorConfig, judge_key_problems
from whale_operator.domains import DomainCatalog
from whale_operator.sandboxing import SandboxHostPolicy

RUN = builders.RunRef("example", "whale", "uid")  # children_of's run
DEFAULTS = SandboxHostPolicy()  # the operator's and the chart's defaults: no privileged sandbox host anywhere
OPTED_IN = SandboxHostPolicy(("whale",), "gvisor")
DOMAINS = DomainCatalog(OperatorConfig())
CLI = {"backend": "cli", "command": ["agent", "{prompt}"], "network": "host"}
#: the LLM judge's key (spec.experiment.verifier.judge.apiKeySecret): a Secret of the run's namespace, injected by reference
JUDGE_SECRET = {"name": "judge-key", "key": "api-key"}
JUDGE = {"searchAnswer": "llmJudge", "judge": {"apiKeySecret": JUDGE_SECRET}}
#: a Hugging Face token for a gated model (spec.experiment.model.hfTokenSecret)
HF_SECRET = {"name": "hf", "key": "token"}


def wire_of(path: Path) -> dict[str, Any]:
    return flat(docs(path)[0]["spec"])


def variants(path: Path) -> Iterator[tuple[str, dict[str, Any]]]:
    """The example as written, at each isolation level, under a Kueue queue (the phase JobSet), colocated, and with a
    ``cli`` proposer: each as a spec's wire form."""
    yield "as-written", wire_of(path)  # the examples' Claude Code proposer: refused where no namespace opted in
    wire = with_built_in_proposer(wire_of(path))
    for level in ("namespaces", "pod", "none"):
        yield level, {**wire, "sandbox": {"isolation": level, "acknowledgeUnisolated": level == "none"}}
    vllm = wire.get("inference", {}).get("backend", "auto") in ("auto", "vllm")
    if vllm:
        cluster = {**wire.get("cluster", {}), "queueName": "gpu", "admission": "jobSet"}
        yield "jobset", {**wire, "cluster": cluster}
    if vllm and wire.get("train", {}).get("gpusPerNode", 1) >= 1:
        yield "colocated", {**wire, "inference": {**wire.get("inference", {}), "placement": "colocated"}}
    proposer = {**wire.get("harnessSearch", {}).get("proposer", {}), **CLI}
    for key in ("model", "baseUrl", "apiKeySecret"):
        proposer.pop(key, None)
    cli = {**wire, "harnessSearch": {**wire.get("harnessSearch", {}), "proposer": proposer}}
    yield "cli", cli
    yield "judge", {**wire, "verifier": JUDGE}  # the LLM judge's key: only where episodes are scored
    yield (
        "hf-token",
        {**wire, "model": {**wire["model"], "hfTokenSecret": HF_SECRET}},
    )  # only where spec.experiment.model loads
    yield "cli-judge", {**cli, "verifier": JUDGE}


def rendered(spec: ClusterRunSpec, policy: SandboxHostPolicy = DEFAULTS) -> list[dict[str, Any]]:
    """Every object the operator renders for ``spec`` (its children of every kind of phase, its services, the phase
    JobSet where the spec asks for it, the colocated train pod where it asks for that)."""
    out = children_of(spec) + [builders.workload_network_policy(RUN)]
    req = weight_request(spec)
    if builders.uses_jobset(spec):
        out.append(builders.phase_jobset(RUN, spec, req, store_uri=spec.execution.storage.uri or "s3://whale"))
    if builders.colocated_weight(spec, req.kind):
        out += colocated_children_of(spec)
    return [builders.with_sandbox_runtime(m, policy.runtime_class) for m in out]


def effective(wire: dict[str, Any], policy: SandboxHostPolicy = DEFAULTS) -> ClusterRunSpec | None:
    """The spec the operator renders from (None: refused, as a cli proposer is without sandbox hosts): its domain's
    options applied (whale_operator.domains.DomainCatalog.effective), then the sandbox host policy."""
    spec, _ = DOMAINS.effective(ClusterRunSpec.model_validate(wire))
    spec, problems = policy.effective(spec, RUN.namespace)
    return None if problems else spec


CASES = [(p, name, wire) for p in EXAMPLES for name, wire in variants(p)]
IDS = [f"{p.stem}-{name}" for p, name, _ in CASES]


def untrusted(obj: dict[str, Any]) -> bool:
    if obj["kind"] not in ("Deployment", "Job"):
        return False
    return obj["spec"]["template"]["metadata"]["labels"].get(names.LABEL_UNTRUSTED) == "true"


def secrets_held(pod: dict[str, Any]) -> set[str]:
    """Every Secret (key) a pod can read: env secretKeyRefs, envFrom secretRefs, secret and projected volumes."""
    out: set[str] = set()
    for c in pod.get("initContainers", []) + pod["containers"]:
        for e in c.get("env", []):
            ref = e.get("valueFrom", {}).get("secretKeyRef")
            if ref:
                out.add(f"{ref['name']}/{ref['key']}")
        out |= {f"envFrom:{e['secretRef']['name']}" for e in c.get("envFrom", []) if "secretRef" in e}
    for v in pod.get("volumes", []):
        if "secret" in v:
            out.add(f"volume:{v['secret']['secretName']}")
        for source in v.get("projected", {}).get("sources", []):
            if "secret" in source or "serviceAccountToken" in source:
                out.add(f"projected:{v['name']}")
    return out


def selected_by(policy: dict[str, Any], labels: dict[str, str]) -> bool:
    sel = policy["spec"]["podSelector"]
    if not sel.get("matchLabels", {}).items() <= labels.items():
        return False
    for expr in sel.get("matchExpressions", []):
        assert expr["operator"] == "In"
        if labels.get(expr["key"]) not in expr["values"]:
            return False
    return True


# ----- item 1: restricted by default ----------------------------------------------------------------------------


@pytest.mark.parametrize(("path", "variant", "wire"), CASES, ids=IDS)
def test_with_the_defaults_every_rendered_pod_is_restricted(path: Path, variant: str, wire: dict[str, Any]):
    spec = effective(wire)
    if spec is None:  # a cli proposer needs a sandbox host: refused, nothing rendered
        assert wire["harnessSearch"]["proposer"]["backend"] == "cli" and variant in ("cli", "cli-judge", "as-written")
        return
    assert spec.execution.sandbox.isolation != "namespaces", "namespaces only where the admin allows sandbox hosts"
    pods = 0
    for obj in rendered(spec):
        pods += len(pod_specs(obj))
        assert violations(obj) == [], (variant, obj["kind"], obj["metadata"]["name"])
    assert pods >= 6  # three phases, prepare, a multi-node train, vLLM or the harness host or tools


def test_a_cli_proposer_without_sandbox_hosts_is_refused_naming_the_field_and_the_fix():
    (wire,) = [w for n, w in variants(EXAMPLES[0]) if n == "cli"]
    _, problems = DEFAULTS.effective(ClusterRunSpec.model_validate(wire), "team-a")
    ((field, message),) = problems
    assert field == "spec.experiment.harnessSearch.proposer.backend"
    assert "team-a" in message and "sandboxHosts.namespaces" in message and "openai or anthropic" in message
    spec, problems = OPTED_IN.effective(ClusterRunSpec.model_validate(wire), "whale")
    assert problems == [] and spec.execution.sandbox.isolation == "namespaces"


def test_the_admins_opt_in_is_per_namespace_and_brings_the_sandbox_hosts_back_under_its_runtime_class():
    wire = with_built_in_proposer(wire_of(next(p for p in EXAMPLES if p.stem == "math-whale")))
    spec = ClusterRunSpec.model_validate(wire)
    assert OPTED_IN.effective(spec, "team-b")[0].execution.sandbox.isolation == "pod", "another namespace: not opted in"
    assert SandboxHostPolicy(("*",)).effective(spec, "team-b")[0].execution.sandbox.isolation == "namespaces"
    at_namespaces = OPTED_IN.effective(spec, "whale")[0]
    assert at_namespaces.execution.sandbox.isolation == "namespaces"
    hosts = []
    for obj in rendered(at_namespaces, OPTED_IN):
        for pod in pod_specs(obj):
            if any(c.get("securityContext", {}).get("capabilities", {}).get("add") for c in pod["containers"]):
                hosts.append(obj["metadata"]["name"])
                assert untrusted(obj) and pod["runtimeClassName"] == "gvisor", obj["metadata"]["name"]
            elif not untrusted(obj):
                assert pod.get("runtimeClassName") != "gvisor", "the admin's class is for untrusted code only"
    assert sorted(hosts) == ["example-harness", "example-sandbox"]
    # the admin's class wins over the spec's
    tenant = ClusterRunSpec.model_validate(
        {**wire, "cluster": {**wire.get("cluster", {}), "placement": {"harness": {"runtimeClassName": "runc"}}}}
    )
    (harness,) = [
        m
        for m in rendered(tenant, OPTED_IN)
        if m["kind"] == "Deployment" and untrusted(m) and "harness" in m["metadata"]["name"]
    ]
    assert harness["spec"]["template"]["spec"]["runtimeClassName"] == "gvisor"


def test_from_the_environment():
    assert SandboxHostPolicy.from_env({}) == SandboxHostPolicy((), None)
    env = {"WHALE_SANDBOX_HOST_NAMESPACES": " team-a, team-b ,", "WHALE_SANDBOX_RUNTIME_CLASS": "kata"}
    assert SandboxHostPolicy.from_env(env) == SandboxHostPolicy(("team-a", "team-b"), "kata")


# ----- item 2: no credentials near untrusted code ----------------------------------------------------------------


@pytest.mark.parametrize(("path", "variant", "wire"), CASES, ids=IDS)
@pytest.mark.parametrize("policy", [DEFAULTS, OPTED_IN], ids=["defaults", "opted-in"])
def test_untrusted_code_holds_no_credential_no_token_and_reaches_nothing_it_does_not_call(
    path: Path, variant: str, wire: dict[str, Any], policy: SandboxHostPolicy
):
    spec = effective(wire, policy)
    if spec is None:
        return
    objects = rendered(spec, policy)
    policies = [o for o in objects if o["kind"] == "NetworkPolicy"]
    auth = names.auth_secret_name(RUN.name)
    seen = set()
    for obj in filter(untrusted, objects):
        pod = obj["spec"]["template"]["spec"]
        component = obj["spec"]["template"]["metadata"]["labels"]["app.kubernetes.io/component"]
        seen.add(component)
        assert pod["automountServiceAccountToken"] is False, component
        held = secrets_held(pod)
        if component == builders.HARNESS:  # the caller token its callers present, nothing else
            assert held == {f"{auth}/{builders.AUTH_HARNESS_TOKEN}"}
        elif component == "search":  # a cli agent's search pod: the agent's own container holds its key, no more
            assert (
                spec.experiment.harness_search.proposer.backend == "cli"
                and spec.execution.sandbox.isolation == "namespaces"
            )
            assert not any(h.startswith("projected") for h in held) and not pod.get("shareProcessNamespace")
            (agent,) = pod["initContainers"]
            key = spec.experiment.harness_search.proposer.api_key_secret
            assert container_secrets(agent) == ({f"{key.name}/{key.key}"} if key else set()), variant
            assert "envFrom" not in agent
            assert violations({"kind": "Pod", "spec": {**pod, "initContainers": []}}) == [], "the search: restricted"
            continue  # the pod's egress is open: the agent's model API (docs/security.md, known limits)
        else:  # the code tool: nothing at all
            assert held == set(), component
            assert "envFrom" not in pod["containers"][0]
        labels = obj["spec"]["template"]["metadata"]["labels"]
        (walls,) = [p for p in policies if selected_by(p, labels) and "Egress" in p["spec"]["policyTypes"]]
        assert walls["spec"]["egress"] == [], f"{component}: no egress at all, DNS included"
        for rule in walls["spec"]["ingress"]:
            assert rule["from"] == [{"podSelector": {"matchLabels": {names.LABEL_RUN: RUN.name}}}]
    if spec.execution.sandbox.isolation != "none":
        assert builders.HARNESS in seen
    if spec.experiment.harness_search.proposer.backend == "cli" and spec.execution.sandbox.isolation == "namespaces":
        assert "search" in seen


def test_the_search_job_of_a_built_in_proposer_is_not_untrusted_and_a_cli_ones_is():
    wire = with_built_in_proposer(wire_of(next(p for p in EXAMPLES if p.stem == "math-whale")))
    (cli,) = [w for n, w in variants(EXAMPLES[0]) if n == "cli"]
    for w, expected in ((wire, []), (cli, ["example-c01-harness-1"])):
        spec = effective(w, OPTED_IN)
        assert spec is not None
        jobs = [o["metadata"]["name"] for o in rendered(spec, OPTED_IN) if o["kind"] == "Job" and untrusted(o)]
        assert jobs == expected


def container_secrets(container: dict[str, Any]) -> set[str]:
    return secrets_held({"containers": [container]})


@pytest.mark.parametrize("stem", ["math-whale", "searchqa-whale", "chess-adaptive"])
def test_a_cli_agent_runs_in_a_container_of_its_own_that_holds_only_its_api_key(stem: str):
    """Issue #29 item 2 for a ``cli`` proposer: the process tree that runs the coding agent holds no store key, no
    vLLM key, no caller token, no judge key and no service-account token, only the proposer's API key; the search
    itself runs in a restricted container beside it, which holds what the search calls but not the proposer key. The
    two share no PID namespace (the agent's container cannot read the search's ``/proc/<pid>/environ``) and meet only
    on one ``emptyDir``. Before the wall, the search pod's one container held all of them next to the agent."""
    wire = {**wire_of(next(p for p in EXAMPLES if p.stem == stem)), "verifier": JUDGE}  # the paper's Claude Code
    spec = effective(wire, OPTED_IN)
    assert spec is not None and spec.experiment.harness_search.proposer.backend == "cli"
    (search,) = [o for o in rendered(spec, OPTED_IN) if o["kind"] == "Job" and untrusted(o)]
    pod = search["spec"]["template"]["spec"]
    assert pod["automountServiceAccountToken"] is False and not pod.get("shareProcessNamespace")
    (agent,) = [c for c in pod.get("initContainers", []) if c["name"] == builders.PROPOSER_AGENT_CONTAINER]
    assert agent["restartPolicy"] == "Always"  # a native sidecar: the Job ends when the search does
    key = spec.experiment.harness_search.proposer.api_key_secret
    assert key is not None
    assert container_secrets(agent) == {f"{key.name}/{key.key}"}, "the agent's container: its API key, nothing else"
    assert "envFrom" not in agent
    assert {e["name"] for e in agent["env"]} <= {key.env or "WHALE_PROPOSER_API_KEY", "PYTHONUNBUFFERED"}
    assert set(agent["securityContext"]["capabilities"]["add"]) == set(builders.SANDBOX_HOST_CAPABILITIES)
    assert agent["securityContext"]["readOnlyRootFilesystem"] is True
    (worker,) = pod["containers"]
    assert worker["name"] == builders.WORKER_CONTAINER
    held = container_secrets(worker)
    assert f"{key.name}/{key.key}" not in held, "the search does not call the agent's API"
    assert f"envFrom:{spec.execution.storage.credentials_secret}" in held
    assert (JUDGE_REF in held) is (spec.domain == "search_qa"), "a judge's key where the domain scores with the judge"
    assert violations({"kind": "Pod", "spec": {**pod, "initContainers": []}}) == [], "the search container: restricted"
    # they meet on the exchange volume only
    shared = {m["name"] for m in agent["volumeMounts"]} & {m["name"] for m in worker["volumeMounts"]}
    assert shared == {builders.AGENT_EXCHANGE_VOLUME}
    (mount,) = [m for m in agent["volumeMounts"] if m["name"] == builders.AGENT_EXCHANGE_VOLUME]
    assert {"name": AGENT_EXCHANGE_ENV, "value": mount["mountPath"]} in worker["env"]
    assert mount in worker["volumeMounts"], "the same path in both: the archive copy's path is the agent's too"
    assert agent["command"][:3] == ["python", "-m", builders.AGENT_RUNNER_MODULE]
    for version in K8S_VERSIONS:  # a native sidecar (restartPolicy on an init container) is in every supported version
        kubernetes_validate.validate(search, version, strict=True)


JUDGE_REF = f"{JUDGE_SECRET['name']}/{JUDGE_SECRET['key']}"


def holds_judge_key(pod: dict[str, Any]) -> bool:
    return JUDGE_REF in secrets_held(pod)


@pytest.mark.parametrize("variant", ["judge", "jobset", "colocated", "cli-judge"])
def test_the_judges_key_reaches_the_pods_that_score_and_no_other(variant: str):
    path = next(p for p in EXAMPLES if p.stem == "searchqa-whale")
    wire = dict(variants(path))[variant]
    if variant in ("jobset", "colocated"):
        wire = {**wire, "verifier": JUDGE}
    spec = effective(wire, OPTED_IN)
    assert spec is not None
    holders: set[str] = set()
    others: set[str] = set()
    for obj in rendered(spec, OPTED_IN):
        for pod in pod_specs(obj):
            component = obj["metadata"]["labels"].get("app.kubernetes.io/component", obj["kind"])
            if holds_judge_key(pod):
                holders.add(component)
                (worker,) = [c for c in pod["containers"] if c["name"] == builders.WORKER_CONTAINER]
                (entry,) = [e for e in worker["env"] if e["name"] == "OPENAI_API_KEY"]  # judge.apiKeyEnv's default
                assert entry == {"name": "OPENAI_API_KEY", "valueFrom": {"secretKeyRef": JUDGE_SECRET}}
                assert not any(holds_judge_key({"containers": [c]}) for c in pod.get("initContainers", []))
            else:
                others.add(component)
    assert holders == {"train", "search", "eval"}  # the eval, weight and harness-search Jobs (and JobSet)
    assert {builders.HARNESS, "retriever", names.PREPARE, "inference"} <= others
    # without the judge, or with exact match, no pod holds it
    for verifier in ({}, {**JUDGE, "searchAnswer": "exactMatch"}):
        plain = effective({**wire, "verifier": verifier}, OPTED_IN)
        assert plain is not None
        assert not any(holds_judge_key(pod) for obj in rendered(plain, OPTED_IN) for pod in pod_specs(obj))


HF_REF = f"{HF_SECRET['name']}/{HF_SECRET['key']}"


@pytest.mark.parametrize("variant", ["hf-token", "hf-colocated"])
def test_the_hf_token_reaches_the_containers_that_download_the_model_and_no_other(variant: str):
    path = next(p for p in EXAMPLES if p.stem == "searchqa-whale")
    cases = dict(variants(path))
    wire = cases["hf-token"]
    if variant == "hf-colocated":
        wire = {**cases["colocated"], "model": wire["model"]}
    spec = effective(wire, OPTED_IN)
    assert spec is not None
    holders: set[tuple[str, str]] = set()
    for obj in rendered(spec, OPTED_IN):
        for pod in pod_specs(obj):
            component = obj["metadata"]["labels"].get("app.kubernetes.io/component", obj["kind"])
            for c in [*pod.get("initContainers", []), *pod["containers"]]:
                if HF_REF in secrets_held({"containers": [c]}):
                    assert {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": HF_SECRET}} in c["env"]
                    holders.add((component, c["name"]))
            if untrusted(obj):
                assert HF_REF not in secrets_held(pod), component
    downloads = {
        ("retriever", "fetch-tokenizer"),
        ("train", builders.WORKER_CONTAINER),
        ("inference", "fetch-weights"),  # the vLLM Deployment (the search and eval phases')
        ("inference", "weight-sync"),
    }
    if variant == "hf-colocated":  # the colocated train pod fetches the weights itself; vLLM reads them from disk
        downloads |= {("train", "fetch-weights")}
    assert holders == downloads
    # without the field no pod holds it
    plain = effective({**wire, "model": {k: v for k, v in wire["model"].items() if k != "hfTokenSecret"}}, OPTED_IN)
    assert plain is not None
    assert not any(HF_REF in secrets_held(pod) for obj in rendered(plain, OPTED_IN) for pod in pod_specs(obj))


def test_a_judge_that_needs_a_key_needs_its_secret_on_a_cluster():
    wire = wire_of(next(p for p in EXAMPLES if p.stem == "searchqa-whale"))
    keyed = ClusterRunSpec.model_validate({**wire, "verifier": {"searchAnswer": "llmJudge"}})
    ((field, message),) = judge_key_problems(*DOMAINS.effective(keyed))
    assert (
        field == "spec.experiment.verifier.judge.apiKeySecret"
        and "$OPENAI_API_KEY" in message
        and "apiKeyEnv: null" in message
    )
    for fine in (JUDGE, {"searchAnswer": "llmJudge", "judge": {"apiKeyEnv": None}}, {"searchAnswer": "exactMatch"}):
        assert judge_key_problems(*DOMAINS.effective(ClusterRunSpec.model_validate({**wire, "verifier": fine}))) == []
    with pytest.raises(ValueError, match="apiKeySecret is injected under apiKeyEnv"):
        ClusterRunSpec.model_validate(
            {
                **wire,
                "verifier": {"searchAnswer": "llmJudge", "judge": {"apiKeyEnv": None, "apiKeySecret": JUDGE_SECRET}},
            }
        )


# ----- item 8: hygiene --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("path", "variant", "wire"), CASES, ids=IDS)
def test_no_token_memory_bounded_and_the_workloads_reachable_from_the_run_only(
    path: Path, variant: str, wire: dict[str, Any]
):
    spec = effective(wire)
    if spec is None:
        return
    objects = rendered(spec)
    (ingress,) = [o for o in objects if o["metadata"]["name"] == names.workload_policy_name(RUN.name)]
    workloads = 0
    for obj in objects:
        created = runs_create(spec, obj)
        for pod in pod_specs(obj):
            where = (variant, obj["kind"], obj["metadata"]["name"])
            assert pod["automountServiceAccountToken"] is False, where
            tokens = {v["name"] for v in pod.get("volumes", []) if "serviceAccountToken" in str(v.get("projected", {}))}
            for c in pod.get("initContainers", []) + pod["containers"]:
                mounted = {m["name"] for m in c.get("volumeMounts", [])} & tokens
                assert not mounted or c["name"] == "weight-sync", (where, c["name"])
                if created:  # every example names the memory of what it runs: each container has a limit
                    assert "memory" in c.get("resources", {}).get("limits", {}), (where, c["name"], "a memory limit")
            for v in pod.get("volumes", []):
                if v.get("emptyDir", {}).get("medium") == "Memory":
                    assert v["emptyDir"].get("sizeLimit"), (where, v["name"])
        if obj["kind"] in ("Job", "JobSet"):
            templates = (
                [r["template"]["spec"]["template"] for r in obj["spec"]["replicatedJobs"]]
                if obj["kind"] == "JobSet"
                else [obj["spec"]["template"]]
            )
            for template in templates:
                labels = template["metadata"]["labels"]
                if labels["app.kubernetes.io/component"] in builders.WORKLOAD_COMPONENTS:
                    workloads += 1
                    assert selected_by(ingress, labels), where
                else:  # a JobSet's server: vLLM's own policy
                    assert labels["app.kubernetes.io/component"] == "inference"
    assert workloads >= 5
    assert ingress["spec"]["policyTypes"] == ["Ingress"]
    assert ingress["spec"]["ingress"] == [{"from": [{"podSelector": {"matchLabels": {names.LABEL_RUN: RUN.name}}}]}]
    # the services have policies of their own: this one selects none of them
    for obj in objects:
        if obj["kind"] == "Deployment":
            assert not selected_by(ingress, obj["spec"]["template"]["metadata"]["labels"])


def runs_create(spec: ClusterRunSpec, obj: dict[str, Any]) -> bool:
    """Whether the run really creates ``obj`` (children_of renders every kind of phase and the vLLM server for every
    spec: an mh_only run trains nothing, a transformers run starts no vLLM)."""
    component = obj["metadata"]["labels"].get("app.kubernetes.io/component")
    if component == "train" and spec.condition.value == "mh_only":
        return False
    return component != "inference" or builders.uses_vllm(spec)


def test_the_workload_policy_validates_and_admits_no_other_run():
    policy = builders.workload_network_policy(builders.RunRef("other", "team-a", "u2"))
    for version in K8S_VERSIONS:
        kubernetes_validate.validate(policy, version, strict=True)
    assert policy["spec"]["ingress"][0]["from"] == [{"podSelector": {"matchLabels": {names.LABEL_RUN: "other"}}}]
    assert names.workload_policy_name("x" * 45) == "x" * 45 + "-workload-ingress"


def test_a_memory_request_is_the_limit_unless_the_spec_gives_one_and_shm_is_never_unbounded():
    from whale.core.spec import Resources

    assert builders.resources_dict(Resources(requests={"memory": "8Gi"})) == {
        "requests": {"memory": "8Gi"},
        "limits": {"memory": "8Gi"},
    }
    given = builders.resources_dict(Resources(requests={"memory": "8Gi"}, limits={"memory": "16Gi"}))
    assert given["limits"] == {"memory": "16Gi"}
    assert builders.shm_volume({}) == {
        "name": "dshm",
        "emptyDir": {"medium": "Memory", "sizeLimit": builders.DEFAULT_SHM_SIZE},
    }


def test_colocated_placement_needs_dra_v1_and_says_how_to_do_without():
    wire = wire_of(next(p for p in EXAMPLES if p.stem == "math-whale"))
    colocated = ClusterRunSpec.model_validate(
        {**wire, "inference": {**wire.get("inference", {}), "placement": "colocated"}}
    )
    assert ("spec.execution.inference.placement", "resource.k8s.io/v1", builders.DRA_NEEDS) in builders.required_apis(
        colocated
    )
    assert builders.API_FIXES["spec.execution.inference.placement"] == "set inference.placement: separate"
    assert "1.34" in builders.DRA_NEEDS
    assert all(
        f != "spec.execution.inference.placement"
        for f, _, _ in builders.required_apis(ClusterRunSpec.model_validate(wire))
    )
