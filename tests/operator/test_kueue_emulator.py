"""The emulator plays Kueue, the Job controller and the JobSet controller as upstream does (tests/fixtures/kube.py
cites the sources): a child created under a LocalQueue gets a Workload it owns once Kueue is installed; admission
and eviction are written on that Workload, the child is stopped and kept, and re-admission resumes the same child;
a phase JobSet's workload runs only once its server is Ready (``dependsOn``). All over HTTP."""

from __future__ import annotations

from typing import Any

from tests.fixtures.kube import (
    KUEUE_JOB_UID_LABEL,
    EmulatedCluster,
    KubeAPI,
    install_jobset,
    install_kueue,
)

JS = "jobset.x-k8s.io/v1alpha2"


def conds(obj: dict[str, Any] | None) -> dict[str, dict[str, Any]]:
    return {c["type"]: c for c in ((obj or {}).get("status") or {}).get("conditions") or ()}


def queued_job(api: KubeAPI, namespace: str, name: str, queue: str | None = "gpu") -> dict[str, Any]:
    labels = {"kueue.x-k8s.io/queue-name": queue} if queue else {}
    body = {"metadata": {"name": name, "labels": labels}, "spec": {"suspend": True, "parallelism": 1}}
    return api.create("batch/v1", "jobs", namespace, body)


def test_a_queued_job_gets_its_workload_and_is_kept_across_eviction_and_readmission(
    kube_cluster: EmulatedCluster, kube_namespace: str
):
    api, ns = kube_cluster.api, kube_namespace
    install_kueue(api)
    job = queued_job(api, ns, "j")
    wl = api.workload_of(ns, job)
    assert wl is not None and wl["metadata"]["name"].startswith("job-j-")
    assert wl["metadata"]["labels"][KUEUE_JOB_UID_LABEL] == job["metadata"]["uid"]
    assert wl["metadata"]["ownerReferences"][0]["uid"] == job["metadata"]["uid"]
    assert wl["spec"]["queueName"] == "gpu" and wl["spec"]["active"] is True
    # a Job with no queue label gets none
    assert api.workload_of(ns, queued_job(api, ns, "free", queue=None)) is None

    api.workload_pending(ns, "j", "couldn't assign flavors to pod set main: insufficient quota for nvidia.com/gpu")
    assert conds(api.workload_of(ns, job))["QuotaReserved"]["status"] == "False"

    api.admit(ns, "j", cluster_queue="gpu-cq")
    running = api.get("batch/v1", "jobs", ns, "j")
    assert running["spec"]["suspend"] is False and running["status"]["startTime"] and running["status"]["active"] == 1
    wl = api.workload_of(ns, job)
    assert conds(wl)["Admitted"]["status"] == "True" and wl["status"]["admission"]["clusterQueue"] == "gpu-cq"

    api.evict(ns, "j", reason="PodsReadyTimeout", message="Exceeded the PodsReady timeout " + ns + "/job-j")
    stopped = api.get("batch/v1", "jobs", ns, "j")
    assert stopped["metadata"]["uid"] == job["metadata"]["uid"]  # kept, not replaced
    assert stopped["spec"]["suspend"] is True and "startTime" not in stopped["status"]  # Kueue cleared it
    # the Job controller's own words: the eviction's reason is on the Workload only
    assert conds(stopped)["Suspended"]["message"] == "Job suspended"
    wl = api.workload_of(ns, job)
    assert conds(wl)["Evicted"]["reason"] == "PodsReadyTimeout" and conds(wl)["Admitted"]["status"] == "False"
    assert wl["status"]["requeueState"]["count"] == 1  # Kueue's back-off for PodsReady timeouts

    api.admit(ns, "j")  # the same Job again
    again = api.get("batch/v1", "jobs", ns, "j")
    assert again["metadata"]["uid"] == job["metadata"]["uid"] and again["spec"]["suspend"] is False
    assert conds(again)["Suspended"]["status"] == "False" and conds(again)["Suspended"]["reason"] == "JobResumed"
    wl = api.workload_of(ns, job)
    assert conds(wl)["Evicted"]["status"] == "False" and conds(wl)["Admitted"]["status"] == "True"

    api.delete("batch/v1", "jobs", ns, "j")  # the Workload goes with its owner (garbage collector)
    assert api.workload_of(ns, job) is None


def test_a_phase_jobset_starts_its_workload_only_once_its_server_is_ready(
    kube_cluster: EmulatedCluster, kube_namespace: str
):
    api, ns = kube_cluster.api, kube_namespace
    install_kueue(api)
    install_jobset(api)
    body = {
        "metadata": {"name": "unit", "labels": {"kueue.x-k8s.io/queue-name": "gpu"}},
        "spec": {
            "suspend": True,
            "replicatedJobs": [
                {"name": "inference", "replicas": 1, "template": {"spec": {}}},
                {
                    "name": "workload",
                    "replicas": 1,
                    "dependsOn": [{"name": "inference", "status": "Ready"}],
                    "template": {"spec": {}},
                },
            ],
        },
    }
    js = api.create(JS, "jobsets", ns, body)
    wl = api.workload_of(ns, js)
    assert wl is not None and [p["name"] for p in wl["spec"]["podSets"]] == ["inference", "workload"]

    api.admit(ns, "unit", plural="jobsets")
    jobs = {r["name"]: r for r in api.get(JS, "jobsets", ns, "unit")["status"]["replicatedJobsStatus"]}
    assert jobs["inference"]["active"] == 1 and jobs["inference"]["ready"] == 0
    assert jobs["workload"]["active"] == 0  # dependsOn: not before the server is Ready
    api.server_ready(ns, "unit")
    jobs = {r["name"]: r for r in api.get(JS, "jobsets", ns, "unit")["status"]["replicatedJobsStatus"]}
    assert jobs["inference"]["ready"] == 1 and jobs["workload"]["active"] == 1

    api.evict(ns, "unit", plural="jobsets")
    stopped = api.get(JS, "jobsets", ns, "unit")
    assert stopped["spec"]["suspend"] is True and conds(stopped)["Suspended"]["message"] == "jobset is suspended"
    assert all(r["suspended"] == 1 and r["active"] == 0 for r in stopped["status"]["replicatedJobsStatus"])
    assert conds(api.workload_of(ns, js))["Evicted"]["reason"] == "Preempted"
    api.admit(ns, "unit", plural="jobsets")
    resumed = api.get(JS, "jobsets", ns, "unit")
    assert resumed["metadata"]["uid"] == js["metadata"]["uid"] and conds(resumed)["Suspended"]["status"] == "False"


def test_a_cluster_without_kueue_says_nothing_will_admit_the_queued_children(tmp_path, monkeypatch):
    """A fresh emulator without Kueue's API (the session's may have it installed): the operator's own client and
    launcher find no Workload API, and the Queued condition says so (KueueNotInstalled)."""
    from tests.fixtures.kube import start_emulator
    from whale_operator import builders
    from whale_operator import status as st
    from whale_operator.children import JobLauncher
    from whale_operator.cluster_spec import ClusterRunSpec
    from whale_operator.kube import KubeClient
    from whale_operator.metrics import OperatorMetrics

    cluster, stop = start_emulator(tmp_path)
    try:
        monkeypatch.setenv("KUBECONFIG", str(cluster.kubeconfig))
        cluster.api.create("v1", "namespaces", None, {"metadata": {"name": "ns"}})
        job = queued_job(cluster.api, "ns", "r-c01-weight-1")
        spec = ClusterRunSpec.model_validate(
            {
                "domain": "synthetic",
                "condition": "rsft_only",
                "model": {"name": "m"},
                "schedule": {"totalSteps": 2},
                "cluster": {"queueName": "gpu", "admission": "perChild"},
            }
        )
        kube = KubeClient.from_environment()
        seen = JobLauncher(kube, OperatorMetrics()).observe_children(
            builders.RunRef("r", "ns", "uid"), spec, {"c01-weight": job}, "2026-12-04T00:00:00Z"
        )
        assert not seen.queue.served and seen.queue.waiting == ("Job r-c01-weight-1 waits for admission",)
        queued = {t: (s, r, m) for t, s, r, m in st.queue_conditions(seen.queue)}["Queued"]
        assert queued[:2] == ("True", "KueueNotInstalled") and "kueue.x-k8s.io/v1beta1" in queued[2]
        kube.close()
    finally:
        cluster.api.close()
        stop.set()
        stop.thread.join(timeout=10)
