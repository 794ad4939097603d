"""The install packaging (the CRDs in chart/crds; manifests/ base, overlays, monitoring; the Helm chart): what each mode renders,
that it validates, that CRDs come apart from what needs them, that RBAC is what the operator uses and no more,
and that every pod is restricted-compliant."""

from __future__ import annotations

import functools
import json
import re
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml
from prometheus_client import generate_latest

from tests.operator import packaging
from tests.operator.packaging import MANIFESTS, OVERLAYS, key
from tests.operator.pod_security import violations
from whale_operator.metrics import OperatorMetrics

#: the Kubernetes versions every rendered object must validate for (kubernetes-validate ships 1.25-1.37 now).
#: From 1.30: the sandbox hosts' securityContext.appArmorProfile is GA there and unknown to 1.29 (which the
#: upstream project stopped supporting in February 2025); chart/Chart.yaml's kubeVersion says the same
K8S_VERSIONS = [
    v
    for v in dict.fromkeys(kubernetes_validate.utils.all_versions())
    if tuple(int(x) for x in v.split(".")[:2]) >= (1, 30)
]
MONITORING_GROUP = "monitoring.coreos.com/v1"
#: the CRDs: their one copy, which Helm installs and `kubectl apply -f chart/crds` applies
CRDS = packaging.CHART / "crds"


@functools.cache
def rendered(name: str) -> tuple[dict[str, Any], ...]:
    """What the install applies: ``crd`` the CRDs (``kubectl apply -f chart/crds``), else a kustomization."""
    if name == "crd":
        return tuple(d for p in sorted(CRDS.glob("*.yaml")) for d in packaging.load_all(p.read_text()))
    path = MANIFESTS / name if name in ("base", "monitoring") else MANIFESTS / "overlays" / name
    return tuple(packaging.kustomize(path))


@functools.cache
def crd_schemas() -> dict[tuple[str, str], dict[str, Any]]:
    out = {}
    for d in rendered("crd"):
        for v in d["spec"]["versions"]:
            out[(f"{d['spec']['group']}/{v['name']}", d["spec"]["names"]["kind"])] = v["schema"]["openAPIV3Schema"]
    return out


def objects(name: str, kind: str) -> list[dict[str, Any]]:
    return [d for d in rendered(name) if d["kind"] == kind]


def the(name: str, kind: str, obj_name: str) -> dict[str, Any]:
    (found,) = [d for d in objects(name, kind) if d["metadata"]["name"] == obj_name]
    return found


def test_k8s_versions_cover_1_30_to_1_35():
    assert {"1.30.0", "1.35.0"} <= set(K8S_VERSIONS)


@pytest.mark.parametrize("name", ["crd", *OVERLAYS, "monitoring"])
def test_every_rendered_object_validates_strictly(name: str):
    """Built-in kinds against every Kubernetes version's schema (strict: an unknown field fails); kinds from
    our CRDs against those; the Prometheus Operator's kinds are checked by the tests below."""
    docs = rendered(name)
    assert docs, name
    for doc in docs:
        custom = crd_schemas().get((doc["apiVersion"], doc["kind"]))
        if custom is not None:
            jsonschema.Draft4Validator(custom).validate(doc)
        elif doc["apiVersion"] != MONITORING_GROUP:
            for version in K8S_VERSIONS:
                kubernetes_validate.validate(doc, version, strict=True)


@pytest.mark.parametrize("name", [*OVERLAYS, "monitoring"])
def test_crds_are_applied_apart_from_what_needs_them(name: str):
    """`kubectl apply -k` of one directory cannot create a CRD and an object of its kind in one pass (the
    kind is not served yet): CRDs live only in chart/crds, every custom kind an overlay uses is defined there
    (or is the Prometheus Operator's, which monitoring needs installed)."""
    assert all(d["kind"] == "CustomResourceDefinition" for d in rendered("crd"))
    assert {"whaleruns.whale.dev", "clusterkopfpeerings.kopf.dev", "kopfpeerings.kopf.dev"} == {
        d["metadata"]["name"] for d in rendered("crd")
    }
    for doc in rendered(name):
        assert doc["kind"] != "CustomResourceDefinition", f"{name}: {key(doc)}"
        group = doc["apiVersion"].rpartition("/")[0]
        if "." in group and not group.endswith(".k8s.io") and doc["apiVersion"] != MONITORING_GROUP:
            assert (doc["apiVersion"], doc["kind"]) in crd_schemas(), f"{name}: {key(doc)} has no CRD in chart/crds"


def test_the_applied_crd_is_the_generated_crd():
    from whale_operator.crd import crd

    (whaleruns,) = [d for d in rendered("crd") if d["metadata"]["name"] == "whaleruns.whale.dev"]
    assert whaleruns == crd()


@pytest.mark.parametrize("name", [*OVERLAYS, "monitoring"])
def test_every_pod_is_restricted(name: str):
    pods = [d for d in rendered(name) if d["kind"] in ("Deployment", "Job", "Pod", "StatefulSet", "DaemonSet")]
    assert pods or name == "monitoring"
    for doc in pods:
        assert violations(doc) == [], key(doc)


def test_the_pod_security_check_catches_what_restricted_refuses():
    """The checker is itself checked: each weakening of the operator's pod is reported."""
    base = the("cluster", "Deployment", "whale-operator")
    assert violations(base) == []

    def weakened(path: str, value: Any) -> dict[str, Any]:
        doc = json.loads(json.dumps(base))
        node = doc["spec"]["template"]["spec"]
        *parents, leaf = path.split(".")
        for p in parents:
            node = node[int(p)] if p.isdigit() else node.setdefault(p, {})
        node[leaf] = value
        return doc

    for path, value, expected in [
        ("containers.0.securityContext.allowPrivilegeEscalation", True, "allowPrivilegeEscalation"),
        ("containers.0.securityContext.capabilities", {"drop": ["NET_RAW"]}, "drop ALL"),
        ("containers.0.securityContext.capabilities", {"drop": ["ALL"], "add": ["SYS_ADMIN"]}, "SYS_ADMIN"),
        ("securityContext.runAsNonRoot", False, "runAsNonRoot"),
        ("securityContext.runAsUser", 0, "runAsUser 0"),
        ("securityContext.seccompProfile", {"type": "Unconfined"}, "seccompProfile"),
        ("hostNetwork", True, "hostNetwork"),
        ("volumes", [{"name": "h", "hostPath": {"path": "/"}}], "hostPath"),
        ("containers.0.securityContext.appArmorProfile", {"type": "Unconfined"}, "appArmorProfile"),
    ]:
        found = violations(weakened(path, value))
        assert any(expected in v for v in found), (path, found)


def test_only_the_dev_overlay_writes_down_credentials():
    for name in ("cluster", "namespaced"):
        assert objects(name, "Secret") == [], name
        assert not any(d["metadata"]["name"] == "minio" for d in rendered(name))
    secrets = objects("dev", "Secret")
    assert {s["metadata"]["namespace"] for s in secrets} == {"whale", "whale-system"}
    assert the("dev", "Deployment", "minio")


# ----- RBAC -----------------------------------------------------------------------------------------


def rules_of(role: dict[str, Any]) -> set[tuple[str, str, str]]:
    return {
        (g, r, v) for rule in role["rules"] for g in rule["apiGroups"] for r in rule["resources"] for v in rule["verbs"]
    }


def bound_to_operator(name: str) -> set[tuple[str, str, str]]:
    """Every (group, resource, verb) the operator's ServiceAccount holds in this overlay."""
    roles = {(d["kind"], d["metadata"]["name"]): d for d in rendered(name) if d["kind"] in ("Role", "ClusterRole")}
    out: set[tuple[str, str, str]] = set()
    for b in rendered(name):
        if b["kind"] in ("RoleBinding", "ClusterRoleBinding") and any(
            s["kind"] == "ServiceAccount" and s["name"] == "whale-operator" for s in b["subjects"]
        ):
            out |= rules_of(roles[(b["roleRef"]["kind"], b["roleRef"]["name"])])
    return out


def children_kinds() -> set[tuple[str, str]]:
    """(group, resource) of every child the builders make, from one run of each domain's shape."""
    from tests.operator.test_manifests import EXAMPLES, children_of, colocated_children_of, docs
    from whale_operator.cluster_spec import ClusterRunSpec

    plural = {
        "Job": "jobs",
        "Deployment": "deployments",
        "Service": "services",
        "NetworkPolicy": "networkpolicies",
        "ResourceClaimTemplate": "resourceclaimtemplates",
        "Secret": "secrets",
        "ConfigMap": "configmaps",
        "ServiceAccount": "serviceaccounts",
        "Role": "roles",
        "RoleBinding": "rolebindings",
    }
    out = set()
    for p in EXAMPLES:
        spec = ClusterRunSpec.model_validate(docs(p)[0]["spec"])
        colocated = spec.with_sections(
            **{
                "inference": spec.execution.inference.model_copy(update={"placement": "colocated"}),
                "train": spec.execution.train.model_copy(update={"num_nodes": 1}),
            }
        )
        can_colocate = spec.execution.inference.backend in ("auto", "vllm") and spec.execution.train.gpus_per_node >= 1
        for child in children_of(spec) + (colocated_children_of(colocated) if can_colocate else []):
            out.add((child["apiVersion"].rpartition("/")[0], plural[child["kind"]]))
    return out


@pytest.mark.parametrize("name", ["cluster", "namespaced"])
def test_the_operator_may_create_every_child_and_update_owner_finalizers(name: str):
    held = bound_to_operator(name)
    for group, resource in children_kinds():
        assert (group, resource, "create") in held, (name, group, resource)
    assert ("whale.dev", "whaleruns/finalizers", "update") in held
    assert ("whale.dev", "whaleruns/status", "patch") in held
    assert not any(v in ("*", "escalate", "bind", "impersonate") or r == "*" for _, r, v in held), held
    # Secrets: read (a run's own store keys) and created (the run's auth Secret), never listed, watched or changed
    assert {v for _, r, v in held if r == "secrets"} == {"get", "create"}


def test_namespaced_mode_holds_namespaced_rights_only_in_the_served_namespace():
    deployment = the("namespaced", "Deployment", "whale-operator")
    command = deployment["spec"]["template"]["spec"]["containers"][0]["command"]
    assert "--all-namespaces" not in command
    served = [c.split("=", 1)[1] for c in command if c.startswith("--namespace=")]
    assert served == ["whale"]
    env = {e["name"]: e.get("value") for e in deployment["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["WHALE_OPERATOR_NAMESPACES"] == "whale"  # the children's watches: kopf's scope, from one value
    assert the("namespaced", "KopfPeering", "whale-operator")["metadata"]["namespace"] == "whale"
    assert not objects("namespaced", "ClusterKopfPeering")
    assert the("namespaced", "Role", "whale-operator")["metadata"]["namespace"] == "whale"
    cluster_wide = {
        (d["kind"], d["metadata"]["name"]) for d in rendered("namespaced") if d["kind"] == "ClusterRoleBinding"
    }
    assert cluster_wide == {("ClusterRoleBinding", "whale-operator-crds")}
    assert rules_of(the("namespaced", "ClusterRole", "whale-operator-crds")) == {
        ("apiextensions.k8s.io", "customresourcedefinitions", "list"),
        ("apiextensions.k8s.io", "customresourcedefinitions", "watch"),
    }


def test_both_modes_grant_the_same_rights_on_runs_and_children():
    """The Role of namespaced mode and the ClusterRole of cluster mode must not drift apart."""
    cluster = rules_of(the("cluster", "ClusterRole", "whale-operator"))
    namespaced = rules_of(the("namespaced", "Role", "whale-operator"))
    cluster_only = {
        ("apiextensions.k8s.io", "customresourcedefinitions"),
        ("", "namespaces"),
        ("kopf.dev", "clusterkopfpeerings"),
    }
    assert {r for r in cluster if r[:2] not in cluster_only} == {
        r for r in namespaced if r[:2] != ("kopf.dev", "kopfpeerings")
    }


def test_tenant_roles_aggregate_into_the_builtin_roles():
    for name in ("cluster", "namespaced"):
        edit = the(name, "ClusterRole", "whalerun-edit")
        view = the(name, "ClusterRole", "whalerun-view")
        assert edit["metadata"]["labels"]["rbac.authorization.k8s.io/aggregate-to-edit"] == "true"
        assert edit["metadata"]["labels"]["rbac.authorization.k8s.io/aggregate-to-admin"] == "true"
        assert view["metadata"]["labels"]["rbac.authorization.k8s.io/aggregate-to-view"] == "true"
        assert ("whale.dev", "whaleruns", "create") in rules_of(edit)
        assert ("whale.dev", "whaleruns", "delete") in rules_of(edit)
        assert {v for _, _, v in rules_of(view)} == {"get", "list", "watch"}
        # only the operator writes a run's status
        assert not any(r == "whaleruns/status" and v not in ("get", "list", "watch") for _, r, v in rules_of(edit))


# ----- monitoring -----------------------------------------------------------------------------------


def exported_metric_names() -> set[str]:
    """What /metrics really shows, every labelled series touched once."""
    m = OperatorMetrics()
    m.handler_duration.labels(handler="reconcile").observe(0.1)
    m.reconcile_errors.labels(error="E").inc()
    m.phase_duration.labels(kind="weight", outcome="Failed").observe(1)
    m.rollouts.labels(namespace="n", run="r").set(1)
    m.stalled.labels(namespace="n", run="r").set(1)
    m.children_created.labels(kind="Job").inc()
    m.actions.labels(action="Fail").inc()
    m.evictions.labels(kind="weight").inc()
    from whale.core.status import RunPhase

    m.set_run_phase("u", RunPhase.RUNNING)
    text = generate_latest(m.registry).decode()
    return {line.split("{")[0].split(" ")[0] for line in text.splitlines() if line and not line.startswith("#")}


def used_metric_names(expr: str) -> set[str]:
    return set(re.findall(r"\bwhale_operator_[a-z_]+", expr))


def test_alerts_and_dashboard_use_metrics_the_operator_exports():
    exported = exported_metric_names()
    rule = the("monitoring", "PrometheusRule", "whale-operator")
    alerts = {r["alert"]: r["expr"] for g in rule["spec"]["groups"] for r in g["rules"]}
    assert {"WhaleRunFailed", "WhaleRunStalled", "WhalePhaseRetried", "WhalePhaseEvicted"} <= set(alerts)
    dashboard = json.loads(
        the("monitoring", "ConfigMap", "whale-operator-dashboard")["data"]["whale-operator-dashboard.json"]
    )
    exprs = [*alerts.values(), *(t["expr"] for p in dashboard["panels"] for t in p["targets"])]
    for expr in exprs:
        names = used_metric_names(expr)
        assert names, expr
        assert names <= exported, (expr, names - exported)
    # the actions' label values are decide()'s action classes; the outcomes are ChildState values
    from whale.core.alternation import ChildState, Fail

    assert f'action="{Fail.__name__}"' in alerts["WhaleRunFailed"]
    assert all(
        s in {c.value for c in ChildState}
        for s in re.findall(r"outcome=~\"([^\"]+)\"", alerts["WhalePhaseRetried"])[0].split("|")
    )


def test_service_monitor_selects_the_operator_metrics_service():
    sm = the("monitoring", "ServiceMonitor", "whale-operator")
    svc = the("cluster", "Service", "whale-operator-metrics")
    assert sm["spec"]["selector"]["matchLabels"].items() <= svc["metadata"]["labels"].items()
    assert sm["spec"]["endpoints"][0]["port"] in {p["name"] for p in svc["spec"]["ports"]}
    assert svc["metadata"]["namespace"] in sm["spec"]["namespaceSelector"]["matchNames"]


# ----- the fallback renderer ------------------------------------------------------------------------


@pytest.mark.skipif(packaging.kubectl() is None, reason="no kubectl here to compare the fallback renderer with")
@pytest.mark.parametrize("name", [*OVERLAYS, "monitoring"])
def test_the_fallback_renderer_agrees_with_kustomize(name: str):
    path = MANIFESTS / name if name == "monitoring" else MANIFESTS / "overlays" / name
    ours = {key(d): d for d in packaging.render_kustomization(path)}
    theirs = {key(d): d for d in rendered(name)}
    assert ours == theirs


def test_the_fallback_renderer_refuses_what_it_does_not_implement(tmp_path):
    (tmp_path / "kustomization.yaml").write_text(yaml.safe_dump({"resources": [], "namePrefix": "x-"}))
    with pytest.raises(NotImplementedError, match="namePrefix"):
        packaging.render_kustomization(tmp_path)


# ----- the Helm chart -------------------------------------------------------------------------------

CHART_CASES: dict[str, tuple[dict[str, Any], tuple[str, ...], bool]] = {
    # values -> what kustomize renders for the same install (the release namespace aside, unless createNamespace)
    "defaults": ({}, ("cluster",), False),
    "namespace-created": ({"createNamespace": True}, ("cluster",), True),
    "namespaced": ({"mode": "namespaced"}, ("namespaced",), False),
    "monitoring": (
        {"monitoring": {"serviceMonitor": True, "prometheusRule": True, "dashboard": True}},
        ("cluster", "monitoring"),
        False,
    ),
}


def without_release_namespace(docs: Any) -> dict[tuple[str, str, str, str], dict[str, Any]]:
    return {key(d): d for d in docs if not (d["kind"] == "Namespace" and d["metadata"]["name"] == "whale-system")}


@pytest.mark.parametrize("case", CHART_CASES, ids=list(CHART_CASES))
def test_the_chart_renders_what_kustomize_renders(case: str):
    """Helm's own renderer (helm-python-sdk: Helm's Go SDK) against kubectl kustomize, object by object."""
    values, overlays, with_namespace = CHART_CASES[case]
    crds, templates = packaging.helm_render(values)
    ours = {key(d): d for d in templates} if with_namespace else without_release_namespace(templates)
    expected_docs = [d for name in overlays for d in rendered(name)]
    theirs = {key(d): d for d in expected_docs} if with_namespace else without_release_namespace(expected_docs)
    assert set(ours) == set(theirs)
    for k in ours:
        assert ours[k] == theirs[k], k
    assert crds == list(rendered("crd"))


def test_the_chart_files_are_the_manifests_files():
    """Helm reads only files inside the chart: its copies must be byte-for-byte the ones kustomize applies. (The
    CRDs have one copy, in the chart, which both installs apply.)"""
    chart = packaging.CHART
    assert not (MANIFESTS / "crd").exists(), "the CRDs live in chart/crds only"
    for rel, src in [
        ("files/prometheusrule.yaml", "monitoring/prometheusrule.yaml"),
        ("files/whale-operator-dashboard.json", "monitoring/whale-operator-dashboard.json"),
    ]:
        assert (chart / rel).read_bytes() == (MANIFESTS / src).read_bytes(), f"cp manifests/{src} chart/{rel}"


def test_the_chart_moves_with_its_values():
    _, templates = packaging.helm_render(
        {
            "mode": "namespaced",
            "watchNamespace": "team-a",
            "replicas": 2,
            "peering": {"name": "whale-a"},
            "image": {"repository": "registry.example.com/whale-operator", "tag": "0.1.0-rc1", "pullPolicy": "Always"},
            "imagePullSecrets": [{"name": "pull"}],
            "resources": {"requests": {"cpu": "1"}},
        },
        namespace="ops",
    )
    by_key = {key(d): d for d in templates}
    dep = by_key[("apps/v1", "Deployment", "ops", "whale-operator")]
    pod = dep["spec"]["template"]["spec"]
    assert dep["spec"]["replicas"] == 2 and pod["imagePullSecrets"] == [{"name": "pull"}]
    assert pod["containers"][0]["image"] == "registry.example.com/whale-operator:0.1.0-rc1"
    # Helm merges values into the defaults, key by key
    assert pod["containers"][0]["resources"] == {
        "requests": {"cpu": "1", "memory": "256Mi"},
        "limits": {"memory": "512Mi"},
    }
    assert "--namespace=team-a" in pod["containers"][0]["command"]
    assert "--peering=whale-a" in pod["containers"][0]["command"]
    assert ("kopf.dev/v1", "KopfPeering", "team-a", "whale-a") in by_key
    assert ("rbac.authorization.k8s.io/v1", "Role", "team-a", "whale-operator") in by_key
    assert (
        by_key[("rbac.authorization.k8s.io/v1", "RoleBinding", "team-a", "whale-operator")]["subjects"][0]["namespace"]
        == "ops"
    )
    for doc in templates:
        assert violations(doc) == []
        if doc["apiVersion"] not in (MONITORING_GROUP, "kopf.dev/v1"):
            kubernetes_validate.validate(doc, K8S_VERSIONS[-1], strict=True)


def test_the_docs_whole_core_for_the_operator_is_a_guaranteed_pod():
    """docs/operator.md's ``--set`` flags that give the operator a whole core (for hundreds of runs), as written there:
    requests equal to limits for CPU and memory, so the pod is Guaranteed (a core of its own under the static CPU
    manager policy)."""
    text = (packaging.ROOT / "docs" / "operator.md").read_text(encoding="utf-8")
    [snippet] = re.findall(r"`(--set resources\.requests\.cpu=1[^`]*)`", text)
    values: dict[str, Any] = {}
    flags = snippet.split()
    assert flags[::2] == ["--set"] * (len(flags) // 2), snippet
    for flag in flags[1::2]:
        path, value = flag.split("=", 1)
        *parents, leaf = path.split(".")
        node = values
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
    _, templates = packaging.helm_render(values)
    [dep] = [d for d in templates if d["kind"] == "Deployment" and d["metadata"]["name"] == "whale-operator"]
    resources = dep["spec"]["template"]["spec"]["containers"][0]["resources"]
    assert resources["requests"] == resources["limits"] == {"cpu": "1", "memory": "512Mi"}


def test_sandbox_hosts_are_the_admins_opt_in_per_namespace():
    """Off by default (no environment, the run namespace enforces restricted); listed, the operator learns the
    namespaces and the RuntimeClass, and a created watch namespace that is listed lets privileged pods in."""

    def operator_env(templates: Any) -> dict[str, str]:
        (dep,) = [d for d in templates if d["kind"] == "Deployment"]
        return {e["name"]: e.get("value") for e in dep["spec"]["template"]["spec"]["containers"][0]["env"]}

    def run_namespace(templates: Any) -> dict[str, str]:
        (ns,) = [d for d in templates if d["kind"] == "Namespace" and d["metadata"]["name"] == "team-a"]
        return ns["metadata"]["labels"]

    _, templates = packaging.helm_render({"mode": "namespaced", "watchNamespace": "team-a"})
    assert not {"WHALE_SANDBOX_HOST_NAMESPACES", "WHALE_SANDBOX_RUNTIME_CLASS"} & set(operator_env(templates))
    assert run_namespace(templates)["pod-security.kubernetes.io/enforce"] == "restricted"
    values = {"namespaces": ["team-a", "team-b"], "runtimeClassName": "gvisor"}
    _, templates = packaging.helm_render({"mode": "namespaced", "watchNamespace": "team-a", "sandboxHosts": values})
    env = operator_env(templates)
    assert env["WHALE_SANDBOX_HOST_NAMESPACES"] == "team-a,team-b" and env["WHALE_SANDBOX_RUNTIME_CLASS"] == "gvisor"
    assert run_namespace(templates)["pod-security.kubernetes.io/enforce"] == "privileged"
    with pytest.raises(Exception, match="sandboxHosts"):
        packaging.helm_render({"sandboxHosts": {"namespaces": ["Not A Namespace"]}})


def test_the_store_allow_lists_are_helm_values():
    _, templates = packaging.helm_render(
        {"allowedStores": ["s3://runs/team"], "allowedS3Endpoints": ["s3.internal:9000"]}
    )
    (dep,) = [d for d in templates if d["kind"] == "Deployment"]
    env = {e["name"]: e.get("value") for e in dep["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["WHALE_ALLOWED_STORES"] == "s3://runs/team" and env["WHALE_ALLOWED_S3_ENDPOINTS"] == "s3.internal:9000"
    with pytest.raises(Exception, match="allowedStores"):
        packaging.helm_render({"allowedStores": ["http://not-a-store"]})


def test_the_chart_refuses_an_unknown_mode():
    with pytest.raises(Exception, match="mode"):
        packaging.helm_render({"mode": "both"})


def test_the_crd_fits_client_side_apply():
    """`kubectl apply` (client-side) keeps the whole object in an annotation, at most 256 KiB: the doc's
    `kubectl apply -f chart/crds` works only while the CRD's JSON stays under it."""
    (whaleruns,) = [d for d in rendered("crd") if d["metadata"]["name"] == "whaleruns.whale.dev"]
    size = len(json.dumps(whaleruns, separators=(",", ":")))
    assert size < 200 * 1024, f"{size} bytes: shrink the schema or document `kubectl apply --server-side`"


def test_helm_lint_passes():
    import helm_python as helm

    findings = helm.lint(str(packaging.CHART))
    assert findings["total_charts_linted"] == 1 and findings["errors"] == [], findings
    # severities: 1 info (e.g. "icon is recommended"), 2 warning, 4 error
    assert all(m["severity"] <= 1 for m in findings["messages"]), findings["messages"]
