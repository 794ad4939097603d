"""Data preparation on a cluster: the operator has no data, so a run without split sizes in the store
first gets a prepare Job. The real operator against the API emulator; the test plays the Job
controller and runs the real prepare workload in-process where the Job's pod would."""

from __future__ import annotations

import pytest

from tests.fixtures.kube import EmulatedCluster, wait_for
from tests.operator.conftest import BASE_SPEC, deep_merge
from tests.operator.player import WR, WorkloadPlayer, create_run
from whale import plugins
from whale.core import layout
from whale.core.spec import WhaleRunSpec
from whale.workloads import prepare

pytestmark = pytest.mark.timeout(120)


def create_unprepared(api, namespace: str, store, name: str, spec: dict | None = None) -> WorkloadPlayer:
    full = deep_merge(deep_merge(BASE_SPEC, {"storage": {"uri": store.uri}}), spec or {})
    run_store, _uid = create_run(api, store, namespace, name, full)
    return WorkloadPlayer(api, run_store, namespace, name, play_prepare=False)


def reasons(api, namespace: str, run: str) -> list[str]:
    return [e["reason"] for e in api.list("v1", "events", namespace) if e.get("involvedObject", {}).get("name") == run]


def test_a_run_without_split_sizes_is_prepared_first(
    start_operator, kube_cluster: EmulatedCluster, kube_namespace: str, store
):
    api = kube_cluster.api
    with start_operator():
        run = create_unprepared(api, kube_namespace, store, "prep")
        job = wait_for(lambda: api.get("batch/v1", "jobs", kube_namespace, "prep-prepare-1"), what="the prepare Job")
        assert job["spec"]["template"]["spec"]["containers"][0]["command"][2:4] == ["whale.workloads", "prepare"]
        # decide() names the Job once it sees it run (the reconcile that creates it knows no Job yet): the Job
        # controller starts its pod, and that watch event wakes the run
        api.start_job(kube_namespace, "prep-prepare-1")
        status = wait_for(
            lambda: "prep-prepare-1" in ((st := run.status()).get("message") or "") and st, what="PreparingData"
        )
        assert status["reason"] == "PreparingData" and status["attempts"] == {"prepare": 1}
        # the spec the workload reads was written before the Job
        assert WhaleRunSpec.model_validate(run.store.read_json(layout.spec_key("prep"))).domain == "synthetic"
        assert run.job_names() == ["prep-prepare-1"]  # nothing else starts without the sizes
        # the Job's pod: the real workload, then the Job controller marks it complete
        sizes = prepare.main(run.store, "prep", "prepare")
        run.complete(job)
        first = run.wait_job()
        assert first["metadata"]["name"] == "prep-eval-c00-s000000-start-1"
        assert sizes == plugins.load("synthetic").split_sizes(
            WhaleRunSpec.model_validate(run.store.read_json(layout.spec_key("prep"))).experiment.data
        )
        final = run.play_to_end()
    assert final["phase"] == "Succeeded", final
    assert "Preparing" in reasons(api, kube_namespace, "prep")


def test_prepare_is_retried_then_fails_the_run_with_the_jobs_reason(
    start_operator, kube_cluster: EmulatedCluster, kube_namespace: str, store
):
    api = kube_cluster.api
    with start_operator():
        run = create_unprepared(api, kube_namespace, store, "noprep", {"retry": {"maxAttempts": 2}})
        first = wait_for(lambda: api.get("batch/v1", "jobs", kube_namespace, "noprep-prepare-1"), what="attempt 1")
        run.fail(first, "prepare workload failed: DomainError: data file missing")
        second = wait_for(lambda: api.get("batch/v1", "jobs", kube_namespace, "noprep-prepare-2"), what="attempt 2")
        # a Job that "succeeds" without writing the sizes is a failed attempt too
        run.complete(second)
        final = wait_for(lambda: run.status().get("phase") == "Failed" and run.status(), what="the run to fail")
        events = wait_for(lambda: "Failed" in (r := reasons(api, kube_namespace, "noprep")) and r, what="Failed event")
    assert final["reason"] == "PrepareFailed"
    assert "noprep-prepare-2" in final["message"] and "without writing" in final["message"]
    assert "PrepareRetried" in events
    assert sorted(j["metadata"]["name"] for j in run.jobs()) == ["noprep-prepare-1", "noprep-prepare-2"]
    cond = {c["type"]: c for c in final["conditions"]}
    assert cond["Failed"]["status"] == "True" and cond["Failed"]["reason"] == "PrepareFailed"


def test_a_suspended_run_is_not_prepared_until_resumed(
    start_operator, kube_cluster: EmulatedCluster, kube_namespace: str, store
):
    api = kube_cluster.api
    with start_operator():
        run = create_unprepared(api, kube_namespace, store, "later", {"suspend": True})
        wait_for(lambda: "suspend" in (run.status().get("message") or ""), what="the suspended message")
        assert run.jobs() == []
        api.patch(WR, "whaleruns", kube_namespace, "later", {"spec": {"suspend": False}})
        wait_for(lambda: api.get("batch/v1", "jobs", kube_namespace, "later-prepare-1"), what="the prepare Job")


def test_a_domain_the_operator_cannot_load_is_an_invalid_spec(
    start_operator, kube_cluster: EmulatedCluster, kube_namespace: str, store
):
    """The operator asks the domain plugin for its tool services: an unknown domain names spec.domain."""
    api = kube_cluster.api
    with start_operator():
        run = create_unprepared(api, kube_namespace, store, "nodomain", {"domain": "no_such_domain"})
        st = wait_for(lambda: run.status().get("phase") == "Failed" and run.status(), what="Failed")
        assert st["reason"] == "InvalidSpec" and st["message"].startswith("spec.domain: cannot load domain")
        assert run.jobs() == []
