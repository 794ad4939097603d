"""inference.placement colocated through the real operator: the weight phase runs as one pod with the vLLM
server beside the trainer (a native sidecar) and the GPUs as one DRA claim; the other phases are unchanged."""

from __future__ import annotations

import pytest

from tests.fixtures.kube import wait_for

pytestmark = pytest.mark.timeout(120)


def test_a_colocated_weight_phase_is_one_pod_with_its_server(start_operator, make_run, kube_cluster, kube_namespace):
    api = kube_cluster.api
    spec = {"inference": {"backend": "vllm", "placement": "colocated"}, "train": {"gpusPerNode": 1}}
    with start_operator():
        run = make_run("colo", spec)
        start = run.wait_job()
        assert start["metadata"]["name"] == "colo-eval-c00-s000000-start-1"
        assert "initContainers" not in start["spec"]["template"]["spec"]  # evaluations use the Deployment
        run.finish(start)
        weight = run.wait_job()
        assert weight["metadata"]["name"] == "colo-c01-weight-1"
        pod = weight["spec"]["template"]["spec"]
        vllm = next(c for c in pod["initContainers"] if c["name"] == "vllm")
        assert vllm["restartPolicy"] == "Always" and "--enable-sleep-mode" in vllm["args"]
        claim = pod["resourceClaims"][0]["resourceClaimTemplateName"]
        assert api.get("resource.k8s.io/v1", "resourceclaimtemplates", kube_namespace, claim) is not None
        run.finish(weight)
        assert run.play_to_end()["phase"] == "Succeeded"


def test_the_runs_vllm_deployment_is_scaled_to_zero_while_a_colocated_weight_phase_runs(
    start_operator, make_run, kube_cluster, kube_namespace
):
    """The weight pod has its own server: the run's Deployment would hold its GPUs idle for the whole phase. It is
    scaled to 0, the weight phase does not wait for it to acknowledge weights, and the next phase that samples from
    it scales it up again and waits for it to serve."""
    api = kube_cluster.api
    spec = {"inference": {"backend": "vllm", "placement": "colocated"}, "train": {"gpusPerNode": 1}}

    def replicas() -> int:
        dep = api.get("apps/v1", "deployments", kube_namespace, "colo-vllm")
        assert dep is not None
        return dep["spec"]["replicas"]

    def inference_condition(run) -> dict:
        return next(c for c in run.status().get("conditions", []) if c["type"] == "InferenceReady")

    with start_operator():
        run = make_run("colo", spec)
        start = run.wait_job()
        assert replicas() == 1  # the start evaluation samples from the Deployment
        run.play_sidecar = False  # nothing acknowledges weights from here on: the weight phase must not wait
        run.finish(start)
        weight = run.wait_job()
        assert weight["metadata"]["name"] == "colo-c01-weight-1"
        assert replicas() == 0
        cond = wait_for(
            lambda: (c := inference_condition(run))["reason"] == "ScaledDown" and c,
            20,
            what="InferenceReady ScaledDown",
        )
        assert cond["status"] == "False" and "c01-weight samples" in cond["message"] and "colocated" in cond["message"]
        run.play_sidecar = True
        run.finish(weight)
        after = run.wait_job()  # the evaluation after the weight phase: back on the Deployment
        assert "initContainers" not in after["spec"]["template"]["spec"]
        assert replicas() == 1
        run.finish(after)
        assert run.play_to_end()["phase"] == "Succeeded"
