"""inference.placement colocated through the real operator: the weight phase runs as one pod with the vLLM
server beside the trainer (a native sidecar) and the GPUs as one DRA claim; the other phases are unchanged."""

from __future__ import annotations

import pytest

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
