"""cluster.admission jobSet through the real operator (kopf) against the API emulator, with JobSet's real CRD
installed: under a Kueue queue every phase is one JobSet, created suspended, carrying its own vLLM server and its
workload; no run-wide vLLM Deployment exists; an eviction of the admitted unit keeps it for Kueue to re-admit, and
the phase resumes from its last checkpoint without spending the failure budget; the workload's completion completes
the phase.

The emulator runs no controllers: the test plays Kueue (unsuspend = admit, suspend again = evict), the JobSet
controller (its status) and the workloads (tests/operator/player.py writes their outputs)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.fixtures.kube import APIError, EmulatedCluster, KubeAPI, now_rfc3339, wait_for
from tests.operator.player import WorkloadPlayer
from whale.core import layout
from whale.core.protocol import PhaseKind, parse_request
from whale_operator import kueue, names

pytestmark = pytest.mark.timeout(120)

CRDS = Path(__file__).resolve().parents[1] / "fixtures" / "crds"
JS = names.JOBSET_API_VERSION
SPEC = {"inference": {"backend": "vllm"}, "cluster": {"queueName": "gpu"}}


@pytest.fixture()
def jobset_crd(kube_cluster: EmulatedCluster) -> None:
    """JobSet's CRD (vendored, unchanged) in the emulator: the API then serves jobsets as a cluster with JobSet
    installed does."""
    api = kube_cluster.api
    crd = yaml.safe_load((CRDS / "jobset.x-k8s.io_jobsets.yaml").read_text())
    if api.get("apiextensions.k8s.io/v1", "customresourcedefinitions", None, crd["metadata"]["name"]) is None:
        api.create("apiextensions.k8s.io/v1", "customresourcedefinitions", None, crd)


# ----- playing Kueue and the JobSet controller -------------------------------------------------------------


def jobsets(api: KubeAPI, namespace: str, run: str) -> dict[str, dict[str, Any]]:
    return {j["metadata"]["name"]: j for j in api.list(JS, "jobsets", namespace, f"{names.LABEL_RUN}={run}")}


def wait_jobset(api: KubeAPI, namespace: str, name: str) -> dict[str, Any]:
    return wait_for(lambda: api.get(JS, "jobsets", namespace, name), what=f"JobSet {name}")


def admit(api: KubeAPI, namespace: str, name: str) -> None:
    """Kueue admits the Workload (unsuspends the JobSet); JobSet starts the server, then (``dependsOn``, once the
    server is Ready) the workload: the emulator's Kueue and JobSet (tests/fixtures/kube.py)."""
    api.admit(namespace, name, plural="jobsets")
    api.server_ready(namespace, name)


def evict(api: KubeAPI, namespace: str, name: str) -> None:
    """Kueue evicts the Workload: the JobSet is suspended and kept, its Jobs suspended (tests/fixtures/kube.py)."""
    api.evict(namespace, name, plural="jobsets")


def complete(api: KubeAPI, namespace: str, name: str) -> None:
    """The workload succeeded: successPolicy marks the JobSet Completed (and JobSet stops the server)."""
    api.patch(
        JS,
        "jobsets",
        namespace,
        name,
        {
            "status": {
                "terminalState": "Completed",
                "conditions": [
                    {
                        "type": "Completed",
                        "status": "True",
                        "reason": "AllJobsCompleted",
                        "message": "jobset completed successfully",
                        "lastTransitionTime": now_rfc3339(),
                    }
                ],
            }
        },
        sub="status",
    )


def marked(api: KubeAPI, namespace: str, name: str) -> bool:
    js = api.get(JS, "jobsets", namespace, name) or {}
    return kueue.STARTED_ANNOTATION in (js.get("metadata", {}).get("annotations") or {})


def finish_phase(run: WorkloadPlayer, api: KubeAPI, namespace: str, name: str) -> None:
    """Admit the phase's JobSet, do what its workload does, and complete it."""
    js = wait_jobset(api, namespace, name)
    admit(api, namespace, name)
    req = run.request(js)
    if req.kind is PhaseKind.WEIGHT:
        run.finish_weight(req)
    elif req.kind is PhaseKind.HARNESS:
        run.finish_harness(req)
    else:
        run.finish_eval(req)
    try:
        complete(api, namespace, name)
    except APIError as exc:
        # a reconcile read the result first (a phase writes it before its unit ends) and the run ended with it: the
        # operator stops a run's unfinished children at its end, so the unit is gone before the workload "completes"
        if exc.code != 404:
            raise
        wait_for(lambda: run.status().get("phase") in ("Succeeded", "Failed"), what=f"the run's end, {name} gone")
    run.handled.add(name)


def next_jobset(run: WorkloadPlayer, api: KubeAPI, namespace: str) -> str | None:
    run.play_prepare_jobs()
    for name, js in sorted(jobsets(api, namespace, run.run).items()):
        if name not in run.handled and not any(
            c.get("status") == "True" for c in js.get("status", {}).get("conditions") or [] if c["type"] != "Suspended"
        ):
            return name
    return None


# ----- the test ----------------------------------------------------------------------------------------------


def test_a_phase_is_one_jobset_admitted_whole(
    jobset_crd, start_operator, make_run, kube_cluster: EmulatedCluster, kube_namespace: str
):
    api, ns = kube_cluster.api, kube_namespace
    with start_operator():
        run = make_run("unit", SPEC, play_sidecar=False)
        start = "unit-eval-c00-s000000-start-1"
        js = wait_jobset(api, ns, start)
        # one unit, created suspended under the queue: the server and the workload together
        assert js["spec"]["suspend"] is True and js["metadata"]["labels"][names.LABEL_QUEUE] == "gpu"
        assert [r["name"] for r in js["spec"]["replicatedJobs"]] == ["inference", "workload"]
        assert js["spec"]["replicatedJobs"][1]["dependsOn"] == [{"name": "inference", "status": "Ready"}]
        # the serving target is written before the JobSet (its server's fetch-weights init container reads it)
        assert run.store.read_json(layout.serving_key("unit")) == {"checkpoint": None}
        # no run-wide vLLM Deployment or Service, and no Job: nothing runs until Kueue admits the JobSet
        assert api.get("apps/v1", "deployments", ns, names.inference_name("unit")) is None
        assert api.get("v1", "services", ns, names.inference_name("unit")) is None
        assert run.jobs() == []
        assert not marked(api, ns, start)
        st = run.status()
        assert st["attempts"].get("eval-c00-s000000-start", 1) == 1 and st.get("preemptions", 0) == 0

        # admitted: the operator marks it (what tells a later eviction from queueing); the phase completes
        admit(api, ns, start)
        wait_for(lambda: marked(api, ns, start), what="the started mark on the JobSet")
        # the phase's own server is what InferenceReady reads now
        wait_for(
            lambda: any(
                c["type"] == "InferenceReady" and c["status"] == "True" and c["reason"] == "Serving"
                for c in run.status().get("conditions", [])
            ),
            what="InferenceReady from the JobSet's server",
        )
        run.finish_eval(run.request(js))
        complete(api, ns, start)
        run.handled.add(start)

        weight = "unit-c01-weight-1"
        wait_jobset(api, ns, weight)
        admit(api, ns, weight)
        wait_for(lambda: marked(api, ns, weight), what="the started mark on the weight JobSet")
        req = run.request(api.get(JS, "jobsets", ns, weight))
        assert req.weight is not None and req.weight.from_step == 0
        run.weight_metrics(req, 1)
        run.checkpoint(1)  # the workload saved step 1 before Kueue preempted the unit

        evict(api, ns, weight)
        st = wait_for(lambda: run.status() if run.status().get("evictions") else None, what="the eviction counted")
        # kept for Kueue to re-admit: no new attempt, no failure budget spent, the same JobSet back in the queue
        assert st["evictions"] == {"c01-weight": 1} and st["failures"] == {} and st["attempts"]["c01-weight"] == 1
        assert sorted(jobsets(api, ns, "unit")) == sorted([start, weight])
        assert api.get(JS, "jobsets", ns, weight)["spec"]["suspend"] is True
        # re-admitted, its workload continues from the phase's last checkpoint and resume state in the store
        # (whale.rsft.phase): the request is the one it started with
        again = parse_request(run.store.read_json(layout.request_key("unit", "c01-weight")))
        assert again.attempt == 1 and again.weight == req.weight

        # the workload's completion completes the phase; the run goes on, every phase a JobSet
        finish_phase(run, api, ns, weight)
        for _ in range(40):
            st = run.status()
            if st.get("phase") in ("Succeeded", "Failed"):
                break
            name = wait_for(
                lambda: next_jobset(run, api, ns) or (run.status().get("phase") in ("Succeeded", "Failed")),
                what="the next JobSet",
            )
            if isinstance(name, str):
                finish_phase(run, api, ns, name)
        st = wait_for(lambda: run.status() if run.status().get("phase") == "Succeeded" else None, what="Succeeded")
        assert st["failures"] == {} and st["evictions"] == {"c01-weight": 1} and st.get("preemptions", 0) == 0
        assert run.jobs() == [] and api.get("apps/v1", "deployments", ns, names.inference_name("unit")) is None


def test_gang_scheduling_needs_the_pod_group_api_and_then_groups_the_train_pods(
    start_operator, make_run, kube_cluster: EmulatedCluster, kube_namespace: str
):
    """No PodGroup API: the run says so on the field that asks for it (no crash loop); installed (the spec touched
    to wake the run), a multi-node train's pods are placed all together by a PodGroup of numNodes."""
    api, ns = kube_cluster.api, kube_namespace
    spec = {
        "train": {"numNodes": 2, "gpusPerNode": 1},
        "cluster": {"gangScheduling": "podGroup", "schedulerName": "scheduler-plugins-scheduler"},
    }
    with start_operator():
        run = make_run("gang", spec)
        st = wait_for(lambda: run.status() if run.status().get("reason") == "InvalidSpec" else None, what="refusal")
        assert st["message"].startswith("spec.cluster.gangScheduling: this cluster does not serve scheduling.x-k8s.io")
        assert "set gangScheduling: none" in st["message"] and run.jobs() == []

        crd = yaml.safe_load((CRDS / "scheduling.x-k8s.io_podgroups.yaml").read_text())
        api.create("apiextensions.k8s.io/v1", "customresourcedefinitions", None, crd)
        api.patch("whale.dev/v1alpha2", "whaleruns", ns, "gang", {"spec": {"suspend": False}})
        run.finish(run.wait_job())  # the start evaluation: one pod, no group
        train = run.wait_job()
        assert train["metadata"]["name"] == "gang-c01-weight-1" and train["spec"]["parallelism"] == 2
        pod = train["spec"]["template"]
        assert pod["metadata"]["labels"]["scheduling.x-k8s.io/pod-group"] == "gang-c01-weight-1"
        assert pod["spec"]["schedulerName"] == "scheduler-plugins-scheduler"
        group = api.get("scheduling.x-k8s.io/v1alpha1", "podgroups", ns, "gang-c01-weight-1")
        assert group is not None and group["spec"] == {"minMember": 2}
        run.finish(train)
        assert run.play_to_end()["phase"] == "Succeeded"


def test_suspending_the_run_deletes_its_running_jobset_and_resuming_queues_it_again(
    jobset_crd, start_operator, make_run, kube_cluster: EmulatedCluster, kube_namespace: str
):
    api, ns = kube_cluster.api, kube_namespace
    with start_operator():
        run = make_run("pause", SPEC, play_sidecar=False)
        start = "pause-eval-c00-s000000-start-1"
        wait_jobset(api, ns, start)
        admit(api, ns, start)
        wait_for(lambda: marked(api, ns, start), what="the started mark")
        api.patch("whale.dev/v1alpha2", "whaleruns", ns, "pause", {"spec": {"suspend": True}})
        wait_for(lambda: start not in jobsets(api, ns, "pause"), what="the running JobSet to be deleted")
        st = wait_for(lambda: run.status() if run.status().get("phase") == "Suspended" else None, what="Suspended")
        assert st["failures"] == {}
        api.patch("whale.dev/v1alpha2", "whaleruns", ns, "pause", {"spec": {"suspend": False}})
        again = wait_jobset(api, ns, start)  # the same attempt, back in the queue as one unit
        assert again["spec"]["suspend"] is True and not marked(api, ns, start)


def test_a_failed_jobset_spends_the_failure_budget_with_its_workers_last_words(
    jobset_crd, start_operator, make_run, kube_cluster: EmulatedCluster, kube_namespace: str
):
    """A failure (not an eviction) of the unit: JobSet fails at once (maxRestarts 0), the operator counts it and
    retries; the run's message carries the failed worker's termination message, found among the JobSet's pods."""
    api, ns = kube_cluster.api, kube_namespace
    with start_operator():
        run = make_run("flaky", {**SPEC, "retry": {"maxAttempts": 1}}, play_sidecar=False)
        name = "flaky-eval-c00-s000000-start-1"
        wait_jobset(api, ns, name)
        admit(api, ns, name)
        pod = f"{name}-workload-0-0-abcde"
        api.create("v1", "pods", ns, {"metadata": {"name": pod, "labels": {"jobset.sigs.k8s.io/jobset-name": name}}})
        terminated = {"exitCode": 1, "message": "Traceback ...\nRuntimeError: CUDA out of memory"}
        api.patch(
            "v1",
            "pods",
            ns,
            pod,
            {"status": {"containerStatuses": [{"name": "worker", "state": {"terminated": terminated}}]}},
            sub="status",
        )
        failed = {
            "type": "Failed",
            "status": "True",
            "reason": "FailedJobs",
            "message": f"jobset failed due to job {name}-workload-0",
            "lastTransitionTime": now_rfc3339(),
        }
        api.patch(
            JS, "jobsets", ns, name, {"status": {"terminalState": "Failed", "conditions": [failed]}}, sub="status"
        )
        final = wait_for(lambda: run.status() if run.status().get("phase") == "Failed" else None, what="run Failed")
    assert final["reason"] == "PhaseFailed" and final["failures"] == {"eval-c00-s000000-start": 1}
    assert "RuntimeError: CUDA out of memory" in final["message"] and "FailedJobs" in final["message"]
    assert final.get("preemptions", 0) == 0
