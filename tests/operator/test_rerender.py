"""Spec edits mid-run: what re-renders and what is refused. The vLLM (and tool) Deployments carry a hash of their
rendered pod template; an edit that changes it (resources, image, vLLM arguments, placement) replaces the template
at the next phase start (a rolling restart), while Jobs keep the spec they started with. An edit of a field that
is part of the experiment (whale.core.mutability: model, schedule, rsft, data, ...) is refused by the CRD
and, where it got through anyway, by the operator, which leaves the run as it was until the field is set back."""

from __future__ import annotations

import time

import pytest

from tests.fixtures.kube import EmulatedCluster, wait_for
from tests.fixtures.specs import flat
from tests.operator.player import WR
from tests.operator.test_builders import RUN, STORE, make_spec
from whale.core.mutability import experiment_changes
from whale_operator import builders, names
from whale_operator.cluster_spec import ClusterRunSpec

pytestmark = pytest.mark.timeout(120)

HASH = names.ANNOTATION_TEMPLATE_HASH


def test_the_template_hash_follows_the_pods_and_nothing_else():
    spec = make_spec()
    first = builders.with_template_hash(builders.inference_deployment(RUN, spec, store_uri=STORE))
    again = builders.with_template_hash(builders.inference_deployment(RUN, make_spec(), store_uri=STORE))
    assert (
        first["metadata"]["annotations"][HASH] == again["metadata"]["annotations"][HASH]
    )  # the same pods, the same hash
    bigger = make_spec(cluster={"inferenceResources": {"requests": {"cpu": "12"}}})
    edited = builders.with_template_hash(builders.inference_deployment(RUN, bigger, store_uri=STORE))
    assert edited["metadata"]["annotations"][HASH] != first["metadata"]["annotations"][HASH]
    args = make_spec(inference={"extraArgs": ["--enforce-eager"]})
    more = builders.with_template_hash(builders.inference_deployment(RUN, args, store_uri=STORE))
    assert more["metadata"]["annotations"][HASH] != first["metadata"]["annotations"][HASH]


def test_experiment_changes_name_the_fields():
    base = make_spec()
    assert experiment_changes(base, make_spec(suspend=True, retry={"maxAttempts": 7})) == []
    moved = ClusterRunSpec.model_validate(
        {**flat(base.to_wire()), "model": {**flat(base.to_wire())["model"], "name": "other", "revision": "r2"}}
    )
    assert [c.path for c in experiment_changes(base, moved)] == [
        "spec.experiment.model.name",
        "spec.experiment.model.revision",
    ]


def vllm_of(api, namespace: str, run: str) -> dict:
    return api.get("apps/v1", "deployments", namespace, f"{run}-vllm")


def test_an_inference_resources_edit_re_renders_the_deployment(
    start_operator, make_run, kube_cluster: EmulatedCluster, kube_namespace: str
):
    api = kube_cluster.api
    with start_operator():
        run = make_run("edit")
        first = run.wait_job()
        dep = vllm_of(api, kube_namespace, "edit")
        old_hash = dep["metadata"]["annotations"][HASH]
        api.patch(
            WR,
            "whaleruns",
            kube_namespace,
            "edit",
            {"spec": {"cluster": {"inferenceResources": {"requests": {"cpu": "3", "memory": "5Gi"}}}}},
        )
        run.finish(first)  # the next phase start ensures the infrastructure with the new spec
        second = run.wait_job()
        patched = wait_for(
            lambda: (d := vllm_of(api, kube_namespace, "edit"))["metadata"]["annotations"][HASH] != old_hash and d,
            what="the vLLM Deployment re-rendered",
        )
        vllm = patched["spec"]["template"]["spec"]["containers"][0]
        assert vllm["name"] == "vllm" and vllm["resources"]["requests"] == {
            "cpu": "3",
            "memory": "5Gi",
            "nvidia.com/gpu": "1",
        }
        # what is served is the run's status's, not the Deployment's (which names no checkpoint)
        assert names.ANNOTATION_CHECKPOINT not in patched["metadata"]["annotations"]
        assert patched["spec"]["replicas"] == 1
        # the Job that was running kept its spec; Jobs are never re-rendered
        assert second["metadata"]["name"] != first["metadata"]["name"]


def test_an_identity_edit_is_refused_by_the_operator_and_undone_by_setting_it_back(
    start_operator, make_run, kube_cluster: EmulatedCluster, kube_namespace: str
):
    api = kube_cluster.api
    with start_operator():
        run = make_run("ident")
        first = run.wait_job()  # the run's children ran with this spec (its store holds it)
        original = run.wr()["spec"]["model"]
        # the emulator evaluates no CEL: as a cluster whose API server skipped the CRD's transition rules
        api.patch(WR, "whaleruns", kube_namespace, "ident", {"spec": {"model": {"revision": "other-weights"}}})
        st = wait_for(lambda: run.status().get("reason") == "ImmutableFieldChanged" and run.status(), what="refusal")
        assert "spec.experiment.model.revision changed mid-run" in st["message"] and "set it back" in st["message"]
        assert st["phase"] == "Running"
        run.finish(first)
        deadline = time.monotonic() + 1.5  # several progress polls (0.2 s) and the Job's own watch event
        while time.monotonic() < deadline:
            assert run.pending_job() is None  # nothing new starts meanwhile
            time.sleep(0.1)
        api.patch(WR, "whaleruns", kube_namespace, "ident", {"spec": {"model": {"revision": None}}})
        assert run.wr()["spec"]["model"] == original
        second = run.wait_job()
        assert second["metadata"]["labels"]["whale.dev/phase"] == "c01-weight"
        assert run.status().get("reason") != "ImmutableFieldChanged"


def test_a_store_that_does_not_hold_the_run_is_refused_until_it_does(
    start_operator, make_run, kube_cluster: EmulatedCluster, kube_namespace: str, tmp_path
):
    """spec.execution.storage is execution (it may change mid-run), but the run lives in its store: once its children have
    run, a store without the run's spec is refused (the run left as it was), and naming the run's store again
    lets it go on."""
    api = kube_cluster.api
    with start_operator():
        run = make_run("moved")
        first = run.wait_job()  # the run's children ran: its store holds its spec
        original = run.wr()["spec"]["storage"]["uri"]
        elsewhere = f"file://{tmp_path / 'elsewhere'}"
        api.patch(WR, "whaleruns", kube_namespace, "moved", {"spec": {"storage": {"uri": elsewhere}}})
        st = wait_for(lambda: run.status().get("reason") == "StoreWithoutRun" and run.status(), what="refusal")
        assert "holds no spec of this run" in st["message"] and "elsewhere" in st["message"]
        assert st["phase"] == "Running"
        api.patch(WR, "whaleruns", kube_namespace, "moved", {"spec": {"storage": {"uri": original}}})
        run.finish(first)
        second = run.wait_job()
        assert second["metadata"]["labels"]["whale.dev/phase"] == "c01-weight"
        assert run.status().get("reason") != "StoreWithoutRun"


def test_a_deployment_without_annotations_is_re_rendered_and_stamped(
    kube_cluster: EmulatedCluster, kube_namespace: str, monkeypatch
):
    """A Deployment made by an older operator (no annotations at all, an old template) is brought to what this
    spec renders; what the new template leaves out goes (a JSON patch ``replace``, not a merge)."""
    from whale.domain import ToolService
    from whale_operator.children import JobLauncher
    from whale_operator.kube import KubeClient
    from whale_operator.metrics import OperatorMetrics

    monkeypatch.setenv("KUBECONFIG", str(kube_cluster.kubeconfig))
    run = builders.RunRef("tools", kube_namespace, "uid-t")
    spec = make_spec()
    tool = ToolService(name="retriever", module="whale.tools.retriever", port=8090, url_env="WHALE_RETRIEVER_URL")
    desired = builders.with_template_hash(builders.tool_deployment(run, spec, tool, store_uri=STORE))
    old = builders.tool_deployment(run, make_spec(cluster={"nodeSelector": {"old": "pool"}}), tool, store_uri=STORE)
    old["spec"]["replicas"] = 0
    kube_cluster.api.create("apps/v1", "deployments", kube_namespace, old)
    kube = KubeClient.from_environment()
    try:
        launcher = JobLauncher(kube, OperatorMetrics())
        existing = kube.get("apps/v1", "Deployment", kube_namespace, "tools-retriever") or {}
        assert launcher.rerender(run, desired, existing) is True
        now = kube.get("apps/v1", "Deployment", kube_namespace, "tools-retriever") or {}
        assert now["metadata"]["annotations"] == {HASH: desired["metadata"]["annotations"][HASH]}
        assert now["spec"]["template"]["spec"].get("nodeSelector") == {"gpu": "h200"}  # "old" is gone
        assert now["spec"]["replicas"] == 1
        assert launcher.rerender(run, desired, now) is False  # the same spec again: nothing to do
    finally:
        kube.close()
