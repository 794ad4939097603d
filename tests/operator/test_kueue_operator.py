"""Kueue's semantics through the real operator (kopf) over HTTP against the emulator, which plays Kueue, the Job
controller and the JobSet controller as upstream does (tests/fixtures/kube.py): an evicted Job is kept (no new
attempt, no failure), its eviction counted once with Kueue's reason (from the Workload) in status, an Event and the
metric; Kueue re-admits the same Job and the run goes on; past ``execution.retry.maxEvictions`` the run fails saying why;
the Queued and Admitted conditions follow the child."""

from __future__ import annotations

import socket
import urllib.request
from typing import Any

import pytest

from tests.fixtures.kube import EmulatedCluster, KubeAPI, install_jobset, install_kueue, wait_for
from tests.operator.player import WorkloadPlayer
from whale_operator import kueue, names

pytestmark = pytest.mark.timeout(180)

JS = names.JOBSET_API_VERSION
PREEMPTED = "Preempted to accommodate a workload (UID: 5c8f, JobUID: 9a1e) due to prioritization in the ClusterQueue"


def conditions(run: WorkloadPlayer) -> dict[str, dict[str, Any]]:
    return {c["type"]: c for c in run.status().get("conditions", [])}


def condition_is(run: WorkloadPlayer, type_: str, status: str, reason: str) -> dict[str, Any] | None:
    cond = conditions(run).get(type_)
    return cond if cond is not None and (cond["status"], cond["reason"]) == (status, reason) else None


def event_messages(api: KubeAPI, namespace: str, run: str, reason: str) -> list[str]:
    return [
        e.get("message", "")
        for e in api.list("v1", "events", namespace)
        if e.get("involvedObject", {}).get("name") == run and e.get("reason") == reason
    ]


def annotations_of(api: KubeAPI, namespace: str, name: str, plural: str = "jobs") -> dict[str, str]:
    obj = api.get("batch/v1" if plural == "jobs" else JS, plural, namespace, name) or {}
    return obj.get("metadata", {}).get("annotations") or {}


def weight_jobs(run: WorkloadPlayer) -> list[str]:
    return [n for n in run.job_names() if "-c01-weight-" in n]


def admit_and_see_it_run(api: KubeAPI, namespace: str, name: str, plural: str = "jobs") -> None:
    """Kueue admits the child; the operator marks it started (what tells its next eviction from queueing)."""
    api.admit(namespace, name, plural=plural)
    wait_for(
        lambda: kueue.STARTED_ANNOTATION in annotations_of(api, namespace, name, plural), what=f"{name}'s started mark"
    )


def metrics_port(monkeypatch: pytest.MonkeyPatch) -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    monkeypatch.setenv("WHALE_OPERATOR_METRICS_PORT", str(port))
    return port


def test_an_evicted_job_is_kept_readmitted_and_the_run_proceeds(
    start_operator, make_run, kube_cluster: EmulatedCluster, kube_namespace: str, monkeypatch
):
    api, ns = kube_cluster.api, kube_namespace
    install_kueue(api)
    port = metrics_port(monkeypatch)
    with start_operator():
        run = make_run("evict", spec={"cluster": {"queueName": "gpu", "admission": "perChild"}})
        start = run.wait_job()
        name = start["metadata"]["name"]
        assert start["spec"]["suspend"] is True
        # created suspended under the queue: Queued (Kueue has not admitted it), not Admitted
        wait_for(lambda: condition_is(run, "Queued", "True", "WaitingForAdmission"), what="Queued")
        assert condition_is(run, "Admitted", "False", "WaitingForAdmission")
        # Kueue's words on why it waits reach the condition (from its Workload)
        api.workload_pending(ns, name, "couldn't assign flavors to pod set main: insufficient quota for cpu")
        wait_for(
            lambda: "insufficient quota for cpu" in conditions(run)["Queued"]["message"], what="Kueue's pending words"
        )
        admit_and_see_it_run(api, ns, name)
        admitted = wait_for(lambda: condition_is(run, "Admitted", "True", "Admitted"), what="Admitted")
        assert "LocalQueue gpu" in admitted["message"] and condition_is(run, "Queued", "False", "Admitted")
        run.finish(start)

        weight = run.wait_job()
        wname = weight["metadata"]["name"]
        assert wname == "evict-c01-weight-1"
        admit_and_see_it_run(api, ns, wname)
        api.evict(ns, wname, message=PREEMPTED)
        st = wait_for(lambda: run.status() if run.status().get("evictions") else None, what="the eviction counted")
        # kept for Kueue: no new attempt, no failure, the same Job
        assert st["evictions"] == {"c01-weight": 1} and st["attempts"]["c01-weight"] == 1 and st["failures"] == {}
        assert st.get("preemptions", 0) == 0 and weight_jobs(run) == [wname]
        kept = api.get("batch/v1", "jobs", ns, wname)
        assert kept["metadata"]["uid"] == weight["metadata"]["uid"]
        assert kept["metadata"]["annotations"][kueue.EVICTIONS_ANNOTATION] == "1"
        assert kueue.STARTED_ANNOTATION not in kept["metadata"]["annotations"]
        # the reason is Kueue's, read from the Workload (the Job only says "Job suspended")
        queued = wait_for(lambda: condition_is(run, "Queued", "True", "Evicted"), what="Queued: Evicted")
        assert "Preempted: " + PREEMPTED in queued["message"] and "kept for Kueue to re-admit" in queued["message"]
        assert condition_is(run, "Admitted", "False", "Evicted")
        (said,) = wait_for(lambda: event_messages(api, ns, "evict", "Evicted"), what="the Evicted event")
        assert "c01-weight" in said and PREEMPTED in said and "spec.execution.retry.maxEvictions 10" in said
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as answer:
            text = answer.read().decode()
        assert 'whale_operator_evictions_total{kind="weight"} 1.0' in text

        # Kueue re-admits the same Job; it runs and is marked again; the eviction stays counted once
        admit_and_see_it_run(api, ns, wname)
        wait_for(lambda: condition_is(run, "Admitted", "True", "Admitted"), what="Admitted again")
        assert weight_jobs(run) == [wname] and run.status()["evictions"] == {"c01-weight": 1}
        final = run.play_to_end()
    assert final["phase"] == "Succeeded" and final["evictions"] == {"c01-weight": 1}
    assert final["failures"] == {} and final["attempts"]["c01-weight"] == 1
    assert condition_is(run, "Queued", "False", "NoChild") and condition_is(run, "Admitted", "False", "NoChild")
    assert len(event_messages(api, ns, "evict", "Evicted")) == 1


def test_a_queue_name_without_its_localqueue_is_said_with_its_own_reason_and_the_fix(
    start_operator, make_run, kube_cluster: EmulatedCluster, kube_namespace: str
):
    """Kueue installed, but no LocalQueue ``gpu`` in the run's namespace: Kueue's workload controller says so on the
    Workload, and the run's Queued/Admitted conditions say it with their own reason (not "waits for admission"),
    naming the queue, the namespace and the fix; once the admin creates the queue and Kueue admits, they follow."""
    api, ns = kube_cluster.api, kube_namespace
    install_kueue(api)
    with start_operator():
        run = make_run("noqueue", spec={"cluster": {"queueName": "gpu", "admission": "perChild"}})
        name = run.wait_job()["metadata"]["name"]
        wait_for(lambda: condition_is(run, "Queued", "True", "WaitingForAdmission"), what="Queued")
        api.local_queue_missing(ns, name)
        queued = wait_for(lambda: condition_is(run, "Queued", "True", "LocalQueueNotFound"), what="LocalQueueNotFound")
        said = queued["message"]
        assert f"no LocalQueue gpu in namespace {ns}" in said and "LocalQueue gpu doesn't exist" in said
        assert "create the LocalQueue" in said and f"kubectl get localqueues -n {ns}" in said and name in said
        assert "waits for admission" not in said
        assert condition_is(run, "Admitted", "False", "LocalQueueNotFound")
        (warned,) = wait_for(lambda: event_messages(api, ns, "noqueue", "LocalQueueNotFound"), what="the Warning")
        assert warned == said
        assert run.status()["phase"] == "Running" and run.job_names() == [name]  # kept: it runs once the queue exists
        # the admin makes the LocalQueue; Kueue's words change on the Workload (nothing the operator watches): polled
        api.workload_pending(ns, name, "couldn't assign flavors to pod set main: insufficient quota for cpu")
        wait_for(lambda: condition_is(run, "Queued", "True", "WaitingForAdmission"), what="waiting again")
        admit_and_see_it_run(api, ns, name)  # Kueue admits the same Job
        wait_for(lambda: condition_is(run, "Admitted", "True", "Admitted"), what="Admitted")
        assert condition_is(run, "Queued", "False", "Admitted")
    assert len(event_messages(api, ns, "noqueue", "LocalQueueNotFound")) == 1


def test_past_max_evictions_the_run_fails_saying_why(
    start_operator, make_run, kube_cluster: EmulatedCluster, kube_namespace: str
):
    api, ns = kube_cluster.api, kube_namespace
    install_kueue(api)
    timeout = "Exceeded the PodsReady timeout " + ns + "/job-cap"
    with start_operator():
        run = make_run(
            "cap",
            spec={
                "cluster": {"queueName": "gpu", "admission": "perChild"},
                "retry": {"maxEvictions": 1},
            },
        )
        name = run.wait_job()["metadata"]["name"]
        admit_and_see_it_run(api, ns, name)
        api.evict(ns, name, reason="PodsReadyTimeout", message=timeout)
        st = wait_for(lambda: run.status() if run.status().get("evictions") else None, what="the first eviction")
        assert st["phase"] == "Running" and list(st["evictions"].values()) == [1]
        # Kueue's back-off is shown while the Job waits for it
        wait_for(lambda: "requeued by Kueue at" in conditions(run)["Queued"]["message"], what="the back-off shown")
        admit_and_see_it_run(api, ns, name)
        api.evict(ns, name, reason="PodsReadyTimeout", message=timeout)
        final = wait_for(lambda: run.status() if run.status().get("phase") == "Failed" else None, what="Failed")
        wait_for(lambda: name not in run.job_names(), what="the evicted Job to be deleted with the failed run")
    assert final["reason"] == "EvictionLimitReached"
    assert "2 times, more than spec.execution.retry.maxEvictions (1)" in final["message"]
    assert "PodsReadyTimeout: " + timeout in final["message"]
    cond = {c["type"]: c for c in final["conditions"]}
    assert cond["Failed"]["status"] == "True" and cond["Failed"]["reason"] == "EvictionLimitReached"
    # the failed run's children are gone: nothing of it is queued any more
    assert (cond["Queued"]["status"], cond["Queued"]["reason"]) == ("False", "NoChild")


def test_an_evicted_phase_jobset_is_kept_and_resumes(
    start_operator, make_run, kube_cluster: EmulatedCluster, kube_namespace: str
):
    """cluster.admission jobSet: Kueue evicts the whole unit (server and workload); the operator keeps the JobSet,
    Kueue re-admits it, JobSet resumes its server and then (dependsOn) its workload."""
    api, ns = kube_cluster.api, kube_namespace
    install_kueue(api)
    install_jobset(api)
    with start_operator():
        run = make_run("unit", spec={"inference": {"backend": "vllm"}, "cluster": {"queueName": "gpu"}})
        start = wait_for(lambda: api.list(JS, "jobsets", ns, f"{names.LABEL_RUN}=unit"), what="the first JobSet")[0]
        name = start["metadata"]["name"]
        assert api.workload_of(ns, start) is not None  # Kueue admits the JobSet as one Workload
        wait_for(lambda: condition_is(run, "Queued", "True", "WaitingForAdmission"), what="Queued")
        admit_and_see_it_run(api, ns, name, plural="jobsets")
        # the server runs, the workload waits for it (dependsOn): no inference yet, then Ready
        assert conditions(run)["InferenceReady"]["status"] == "False"
        api.server_ready(ns, name)
        wait_for(lambda: condition_is(run, "InferenceReady", "True", "Serving"), what="the phase's server Ready")
        api.evict(ns, name, plural="jobsets")
        st = wait_for(lambda: run.status() if run.status().get("evictions") else None, what="the eviction counted")
        assert list(st["evictions"].values()) == [1] and st["failures"] == {}
        assert [j["metadata"]["name"] for j in api.list(JS, "jobsets", ns, f"{names.LABEL_RUN}=unit")] == [name]
        wait_for(lambda: condition_is(run, "Queued", "True", "Evicted"), what="Queued: Evicted")
        admit_and_see_it_run(api, ns, name, plural="jobsets")
        wait_for(lambda: condition_is(run, "Admitted", "True", "Admitted"), what="the same JobSet re-admitted")
        assert api.get(JS, "jobsets", ns, name)["metadata"]["uid"] == start["metadata"]["uid"]


def test_an_eviction_costs_one_patch_no_create_and_workload_reads_only_while_suspended(
    operator_env, kube_cluster: EmulatedCluster, kube_namespace: str, store
):
    """The call counts of the eviction path, one Reconciler reconciling again and again with fresh reads: the
    evicted Job is patched once (the count), no Job is created for it, the Workload is listed only while the Job is
    suspended (at most once a reconcile), and nothing of it is read or written while it runs."""
    from tests.operator.conftest import BASE_SPEC, prepared_run
    from whale_operator.kube import KubeClient
    from whale_operator.metrics import OperatorMetrics
    from whale_operator.reconcile import Reading, Reconciler

    api, ns, emulator = kube_cluster.api, kube_namespace, kube_cluster.emulator
    install_kueue(api)
    spec = {**BASE_SPEC, "storage": {"uri": store.uri}, "cluster": {"queueName": "gpu", "admission": "perChild"}}
    run = prepared_run(api, store, ns, "counted", spec)
    kube = KubeClient.from_environment()
    reconciler = Reconciler(kube, OperatorMetrics())

    def reconciles(n: int) -> list[Any]:
        before = len(emulator._requests)
        for _ in range(n):
            reconciler.reconcile(ns, "counted", Reading.FULL)
        return emulator._requests[before:]

    def calls(requests: list[Any], method: str, path_part: str) -> int:
        return sum(1 for r in requests if str(r.method).upper().endswith(method) and path_part in r.url.path)

    def next_job() -> dict[str, Any] | None:
        found = run.pending_job()  # plays the weight-sync sidecar: acknowledges what the server must serve
        reconciles(1)
        return found

    job = wait_for(next_job, what="the first Job")
    name = job["metadata"]["name"]
    job_path = f"/jobs/{name}"
    queued = reconciles(6)
    assert calls(queued, "POST", "/jobs") == 0 and 1 <= calls(queued, "GET", "/workloads") <= 6
    api.admit(ns, name)
    running = reconciles(6)
    assert calls(running, "PATCH", job_path) == 1  # the started mark, once
    assert calls(running, "GET", "/workloads") == 0  # admitted and running: Kueue has nothing to say
    api.evict(ns, name)
    evicted = reconciles(12)
    patches = [r for r in evicted if str(r.method).upper().endswith("PATCH") and job_path in r.url.path]
    assert len(patches) == 1 and kueue.EVICTIONS_ANNOTATION in patches[0].text  # the count, once
    assert calls(evicted, "POST", "/jobs") == 0 and calls(evicted, "DELETE", "/jobs") == 0
    assert 1 <= calls(evicted, "GET", "/workloads") <= 12
    phase = job["metadata"]["labels"][names.LABEL_PHASE]
    st = run.status()
    assert st["evictions"] == {phase: 1} and st["attempts"][phase] == 1 and st["failures"] == {}
    kube.close()


def test_without_the_workload_the_eviction_is_told_in_the_childs_own_words(
    operator_env, kube_cluster: EmulatedCluster, kube_namespace: str, store
):
    """No Workload to read (an older chart's RBAC, or Kueue deleted it): the eviction is still counted and kept,
    and its Event says what the Job says."""
    from tests.operator.conftest import BASE_SPEC, prepared_run
    from whale_operator.kube import KubeClient
    from whale_operator.metrics import OperatorMetrics
    from whale_operator.reconcile import Reading, Reconciler

    api, ns = kube_cluster.api, kube_namespace
    install_kueue(api)
    spec = {**BASE_SPEC, "storage": {"uri": store.uri}, "cluster": {"queueName": "gpu", "admission": "perChild"}}
    run = prepared_run(api, store, ns, "wordless", spec)
    kube = KubeClient.from_environment()
    reconciler = Reconciler(kube, OperatorMetrics())

    def next_job() -> dict[str, Any] | None:
        found = run.pending_job()
        reconciler.reconcile(ns, "wordless", Reading.FULL)
        return found

    job = wait_for(next_job, what="the first Job")
    name = job["metadata"]["name"]
    workload = api.workload_of(ns, job)
    assert workload is not None
    api.delete("kueue.x-k8s.io/v1beta1", "workloads", ns, workload["metadata"]["name"])
    api.admit(ns, name)
    reconciler.reconcile(ns, "wordless", Reading.FULL)  # marks it started
    api.evict(ns, name)
    outcome = reconciler.reconcile(ns, "wordless", Reading.FULL)
    assert outcome is not None
    (event,) = [e for e in outcome.events if e.reason == "Evicted"]
    assert event.type == "Warning" and f"Job {name} (Job suspended)" in event.message
    assert list(outcome.status.evictions.values()) == [1] and outcome.status.failures == {}
    kube.close()
