"""The real operator (kopf) against the Kubernetes API emulator: the issue's scenarios.

The tests play the cluster's controllers and the workloads (tests/operator/player.py) and assert on
the objects, status, conditions and events through the API.
"""

from __future__ import annotations

import pytest

from tests.fixtures.kube import EmulatedCluster, wait_for
from tests.operator.player import WR, WorkloadPlayer
from whale import layout
from whale_operator import names

pytestmark = pytest.mark.timeout(120)


def conditions(status: dict) -> dict[str, dict]:
    return {c["type"]: c for c in status.get("conditions", [])}


def events(api, namespace: str, run: str) -> list[tuple[str, str]]:
    return [(e["type"], e["reason"]) for e in api.list("v1", "events", namespace)
            if e.get("involvedObject", {}).get("name") == run]


def test_whale_run_two_cycles(start_operator, make_run, kube_cluster: EmulatedCluster, kube_namespace: str):
    api = kube_cluster.api
    with start_operator():
        run = make_run("two-cycles")
        first = run.wait_job()
        # the first child is the (theta0, h0) evaluation, with the inference server next to it
        assert first["metadata"]["name"] == "two-cycles-eval-c00-s000000-start-1"
        dep = wait_for(lambda: api.get("apps/v1", "deployments", kube_namespace, "two-cycles-vllm"),
                       what="the vLLM Deployment")
        owner = dep["metadata"]["ownerReferences"][0]
        assert owner["kind"] == "WhaleRun" and owner["uid"] == run.wr()["metadata"]["uid"]
        assert api.get("v1", "services", kube_namespace, "two-cycles-vllm") is not None
        api.ready_deployment(kube_namespace, "two-cycles-vllm")
        wait_for(lambda: conditions(run.status()).get("InferenceReady", {}).get("status") == "True",
                 what="InferenceReady=True")
        final = run.play_to_end()
        events_seen = events(api, kube_namespace, "two-cycles")

    assert final["phase"] == "Succeeded", final
    assert final["completedPhases"] == ["c01-weight", "c01-harness", "c02-weight"]
    assert final["step"] == 4 and final["checkpointStep"] == 4
    assert final["currentHarness"] == layout.harness_key("two-cycles", "c01-accepted")
    assert final["best"]["meanAtK"] == pytest.approx(0.14) and final["best"]["step"] == 4
    assert final["rolloutsSpent"] == 4 * 8 + 2 * 24
    # one Job per phase, each created exactly once, attempt 1
    assert run.job_names() == sorted([
        "two-cycles-eval-c00-s000000-start-1", "two-cycles-c01-weight-1", "two-cycles-eval-c01-s000002-weight-1",
        "two-cycles-c01-harness-1", "two-cycles-eval-c01-s000002-harness-1", "two-cycles-c02-weight-1",
        "two-cycles-eval-c02-s000004-weight-1"])
    cond = conditions(final)
    assert cond["Succeeded"]["status"] == "True" and cond["Progressing"]["status"] == "False"
    assert cond["Failed"]["status"] == "False"
    assert all(c["observedGeneration"] == 1 for c in cond.values())
    assert ("Normal", "Started") in events_seen and ("Normal", "Succeeded") in events_seen
    assert ("Normal", "PhaseStarted") in events_seen and ("Normal", "NewBest") in events_seen
    # the finished run gives its GPUs back
    dep = api.get("apps/v1", "deployments", kube_namespace, "two-cycles-vllm")
    assert dep["spec"]["replicas"] == 0
