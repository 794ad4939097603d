"""A reconcile reads the WhaleRun and its children from the operator's informer (``whale_operator.informer``), fed by
watch events and by the answers to the operator's own writes: after the first reconcile of a run it asks the API
server nothing to read them. The requests are counted at the Kubernetes API emulator."""

from __future__ import annotations

from tests.fixtures.kube import EmulatedCluster, wait_for
from tests.operator.conftest import BASE_SPEC, prepared_run
from tests.operator.player import WR, WorkloadPlayer
from whale.core import layout
from whale.store import Store
from whale_operator import informer as informer_kinds
from whale_operator import names, observe
from whale_operator.informer import Informer
from whale_operator.kube import KubeClient
from whale_operator.metrics import OperatorMetrics
from whale_operator.reconcile import Reading, Reconciler


def requests_since(cluster: EmulatedCluster, before: int) -> list[tuple[str, str]]:
    """(method, path?query) of each request of the reconciles the emulator received after the first ``before``."""
    return [
        (str(r.method).upper().rsplit(".", 1)[-1], f"{r.url.path}?{r.url.query_string}")
        for r in cluster.emulator._requests[before:]
        # the operator's reconciles (its KubeClient: the SDK's agent), not kopf's watches nor the test's own reads
        if r.headers.get("User-Agent", "").startswith("OpenAPI-Generator")
    ]


def reads(requests: list[tuple[str, str]]) -> list[str]:
    """The GETs among them."""
    return [path for method, path in requests if method == "GET"]


def informed_run(
    cluster: EmulatedCluster, namespace: str, store: Store, name: str
) -> tuple[WorkloadPlayer, Informer, Reconciler]:
    """A run, and a Reconciler reading through an Informer fed by its own writes (the watch events fed by hand)."""
    player = prepared_run(cluster.api, store, namespace, name, {**BASE_SPEC, "storage": {"uri": store.uri}})
    kube = KubeClient.from_environment()
    informer = Informer(kube)
    kube.on_write = informer.observe
    return player, informer, Reconciler(kube, OperatorMetrics(), reads=informer)


def to_jobs(reconciler: Reconciler, player: WorkloadPlayer, namespace: str, name: str, count: int = 1) -> None:
    """Reconcile (the serving target acknowledged each time) until the run has ``count`` Jobs."""
    for _ in range(8):
        player.ack_serving()
        reconciler.reconcile(namespace, name)
        if len(player.jobs()) >= count:
            return
    raise AssertionError(f"{name}: fewer than {count} Jobs after 8 reconciles")


def test_reads_come_from_the_informer_and_its_own_writes_are_seen(operator_env, kube_cluster, kube_namespace, store):
    spec = {**BASE_SPEC, "storage": {"uri": store.uri}}
    player = prepared_run(kube_cluster.api, store, kube_namespace, "reuse", spec)
    kube = KubeClient.from_environment()
    informer = Informer(kube)
    kube.on_write = informer.observe
    reconciler = Reconciler(kube, OperatorMetrics(), reads=informer)
    emulator = kube_cluster.emulator

    def reconcile(reuse: bool = False) -> list[tuple[str, str]]:
        before = len(emulator._requests)
        reconciler.reconcile(kube_namespace, "reuse", Reading.POLL if reuse else Reading.FULL)
        return requests_since(kube_cluster, before)

    first = reconcile()
    assert any("/whaleruns/reuse" in p for p in reads(first)), "the first reconcile of a run reads it"
    assert any("/jobs?" in p for p in reads(first)), "... and lists its children once"
    for _ in range(6):  # started, the inference target acknowledged, the first Job created
        player.ack_serving()
        reconcile()
        if player.jobs():
            break
    [job] = player.jobs()
    assert reads(reconcile()) == [], "the Job it made is seen from the create's answer: the status takes it in"
    assert reconcile() == [] and reconcile(reuse=True) == [], "nothing changed: no request at all"
    # the Job ends on the API server; a watch event brings it (here fed by hand: test_informer_fed_by_kopf has kopf)
    player.finish(job)
    informer.observe(kube_cluster.api.get("batch/v1", "jobs", kube_namespace, job["metadata"]["name"]))
    after = reconcile()
    assert reads(after) == [], after
    assert "PATCH" in {m for m, _ in after}, "the finished Job is seen: the status takes in its result"
    assert player.status()["completedPhases"] == [] and player.status()["evals"][0]["meanAtK"] is not None


def test_a_poll_that_sees_a_child_ended_reads_its_result(operator_env, kube_cluster, kube_namespace, store):
    """A progress poll already under way when a child's end reaches the informer judges that child by its result
    (read then), not by the results read before it ended: the evaluation is absorbed, no failure is counted."""
    player, informer, reconciler = informed_run(kube_cluster, kube_namespace, store, "ended")
    to_jobs(reconciler, player, kube_namespace, "ended")
    [job] = player.jobs()
    reconciler.reconcile(kube_namespace, "ended")  # a fresh reconcile reads the results: none yet
    player.finish(job)
    informer.observe(kube_cluster.api.get("batch/v1", "jobs", kube_namespace, job["metadata"]["name"]))
    reconciler.reconcile(kube_namespace, "ended", Reading.POLL)
    status = player.status()
    assert status["evals"][0]["meanAtK"] is not None, status
    assert not status.get("failures"), status


def test_a_change_no_event_told_of_is_read_at_the_relist(operator_env, kube_cluster, kube_namespace, store):
    """What the informer holds is what a reconcile reads; a relist (after a failed reconcile, or every RELIST_S) reads
    the API server afresh, dropping what is gone and taking in what changed."""
    player, informer, reconciler = informed_run(kube_cluster, kube_namespace, store, "relist")
    to_jobs(reconciler, player, kube_namespace, "relist")
    [job] = player.jobs()
    name = job["metadata"]["name"]
    held = [j["metadata"]["name"] for j in informer.children(informer_kinds.JOB, kube_namespace, "relist")]
    assert held == [name], "the create's answer is held"
    kube_cluster.api.delete("batch/v1", "jobs", kube_namespace, name)  # no event fed
    assert [j["metadata"]["name"] for j in informer.children(informer_kinds.JOB, kube_namespace, "relist")] == [name]
    informer.relist(kube_namespace, "relist")
    assert informer.children(informer_kinds.JOB, kube_namespace, "relist") == []
    deleted = {**job, "metadata": {**job["metadata"], "resourceVersion": "1"}}
    informer.observe(deleted)  # an old version arriving late does not bring it back ...
    assert informer.children(informer_kinds.JOB, kube_namespace, "relist") == []
    reconciler.reconcile(kube_namespace, "relist")  # reads the run afresh
    informer.observe(kube_cluster.api.get(WR, "whaleruns", kube_namespace, "relist"), deleted=True)
    before = len(kube_cluster.emulator._requests)
    assert informer.run(kube_namespace, "relist") is None, "... and a run deleted is gone for the reconcile"
    assert len(kube_cluster.emulator._requests) == before


def test_informer_fed_by_kopf(start_operator, make_run, kube_cluster: EmulatedCluster):
    """The real operator: a child finished on the API server is seen by the next reconcile through kopf's watch
    event, with no list of the run's children and no read of the WhaleRun."""
    with start_operator():
        run = make_run("fed")
        first = run.wait_job()
        kube_cluster.api.ready_deployment(run.namespace, "fed-vllm")
        counts: list[int] = []

        def quiet() -> bool:  # no request between two looks (the run's progress polls ask the API server nothing)
            counts.append(len(kube_cluster.emulator._requests))
            return len(counts) > 1 and counts[-1] == counts[-2]

        wait_for(quiet, 20, 0.5, what="the operator at rest")
        before = len(kube_cluster.emulator._requests)
        run.finish(first)
        nxt = run.wait_job()
        assert nxt["metadata"]["name"] != first["metadata"]["name"]
        during = requests_since(kube_cluster, before)
    own = [p for p in reads(during) if "/whaleruns/fed" in p or "whale.dev%2Frun" in p or "whale.dev/run" in p]
    assert own == [], own
    assert any(m == "POST" and "/jobs" in p for m, p in during), "the next Job was created"


def test_one_list_of_a_namespace_serves_every_run_and_a_watched_run_is_not_read(
    operator_env, kube_cluster, kube_namespace, store
):
    """Children are listed once a namespace for all its runs: a second run's first reconcile lists nothing, and the
    WhaleRun a watch event brought (here fed by hand, as the handler does) is not read either; a relist of one run
    (after a failed reconcile) lists that run's own children, not the namespace's."""
    spec = {**BASE_SPEC, "storage": {"uri": store.uri}}
    prepared_run(kube_cluster.api, store, kube_namespace, "first", spec)
    prepared_run(kube_cluster.api, store, kube_namespace, "second", spec)
    kube = KubeClient.from_environment()
    informer = Informer(kube)
    kube.on_write = informer.observe
    reconciler = Reconciler(kube, OperatorMetrics(), reads=informer)
    emulator = kube_cluster.emulator

    before = len(emulator._requests)
    reconciler.reconcile(kube_namespace, "first")
    lists = [p for p in reads(requests_since(kube_cluster, before)) if "/jobs?" in p or "/deployments?" in p]
    assert len(lists) == 2 and all("labelSelector=whale.dev/run," in p for p in lists), lists  # the namespace's

    informer.observe(kube_cluster.api.get(WR, "whaleruns", kube_namespace, "second"), watched=True)
    before = len(emulator._requests)
    reconciler.reconcile(kube_namespace, "second")
    sent = requests_since(kube_cluster, before)
    assert reads(sent) == [], "the namespace's lists and the watch event hold what the second run reads"
    assert any(m == "POST" for m, _ in sent), "... and its reconcile made its children"

    informer.relist(kube_namespace, "second")
    before = len(emulator._requests)
    reconciler.reconcile(kube_namespace, "second")
    own = reads(requests_since(kube_cluster, before))
    assert any("/whaleruns/second" in p for p in own), own
    assert own and all("second" in p for p in own), "a relist reads the run and lists its own children"


def _job(name: str, template: dict, **spec: object) -> dict:
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": name,
            "namespace": "ns",
            "resourceVersion": "7",
            "labels": {names.LABEL_RUN: "r"},
            "annotations": {names.ANNOTATION_TEMPLATE_HASH: "abc"},
            "managedFields": [{"manager": "kube-controller-manager", "fieldsV1": {"f:status": {}}}],
        },
        "spec": {"suspend": False, "template": template, **spec},
        "status": {"conditions": [{"type": "Complete", "status": "True"}], "succeeded": 1},
    }


def test_slim_drops_only_what_no_reconcile_reads():
    """A held child keeps all a reconcile reads of it (the wake digest lists it: metadata, status, suspend, replicas,
    the template's hash) and loses its pod template and the field-ownership record; a WhaleRun keeps its spec."""
    template = {"spec": {"containers": [{"name": "train", "env": [{"name": "A", "value": "1"}]}]}}
    job = _job("j", template, parallelism=2)
    held = informer_kinds.slim(job)
    assert "template" not in held["spec"] and held["spec"] == {"suspend": False, "parallelism": 2}
    assert "managedFields" not in held["metadata"]
    assert held["status"] == job["status"] and held["metadata"]["labels"] == job["metadata"]["labels"]
    assert observe.wake_digest(held) == observe.wake_digest(job) is not None
    assert job["spec"]["template"] is template and "managedFields" in job["metadata"], "the event itself is unchanged"

    deployment = {**_job("d", template, replicas=1), "apiVersion": "apps/v1", "kind": "Deployment"}
    assert informer_kinds.slim(deployment)["spec"] == {"suspend": False, "replicas": 1}
    jobset = {
        "apiVersion": "jobset.x-k8s.io/v1alpha2",
        "kind": "JobSet",
        "metadata": {"name": "s", "namespace": "ns"},
        "spec": {"replicatedJobs": [{"name": "workers", "replicas": 2, "template": {"spec": {"template": template}}}]},
    }
    slim_set = informer_kinds.slim(jobset)
    assert slim_set["spec"]["replicatedJobs"] == [{"name": "workers", "replicas": 2}]
    assert observe.is_jobset({k: v for k, v in slim_set.items() if k != "kind"}), "still told apart by its shape"
    run = {"apiVersion": WR, "kind": "WhaleRun", "metadata": {"name": "r", "namespace": "ns"}, "spec": {"template": 1}}
    assert informer_kinds.slim(run) == run


def test_the_informer_holds_children_without_their_pod_templates(operator_env, kube_cluster, kube_namespace, store):
    """A run driven to its first Job through the informer: the Job and Deployments it holds have no pod template (the
    API server's have), and the run still reaches its next Job once the first finishes."""
    player, informer, reconciler = informed_run(kube_cluster, kube_namespace, store, "slim")
    to_jobs(reconciler, player, kube_namespace, "slim")
    [job] = player.jobs()
    assert "template" in job["spec"], "the API server holds the whole Job"
    held_jobs = informer.children(informer_kinds.JOB, kube_namespace, "slim")
    held_deps = informer.children(informer_kinds.DEPLOYMENT, kube_namespace, "slim")
    assert [j["metadata"]["name"] for j in held_jobs] == [job["metadata"]["name"]] and held_deps
    assert all("template" not in o["spec"] for o in [*held_jobs, *held_deps])
    player.finish(job)
    informer.observe(kube_cluster.api.get("batch/v1", "jobs", kube_namespace, job["metadata"]["name"]))
    to_jobs(reconciler, player, kube_namespace, "slim", count=2)  # the run went on to its next Job


def test_a_phase_absorbed_and_ended_is_not_judged_again(operator_env, kube_cluster, kube_namespace, store, monkeypatch):
    """A run keeps its finished Jobs; once a phase's result is in the status and its child was seen ended, later
    reconciles do not judge that child again, so a reconcile's work does not grow with the run's length."""
    player, informer, reconciler = informed_run(kube_cluster, kube_namespace, store, "settled")
    to_jobs(reconciler, player, kube_namespace, "settled")
    for n in range(2, 8):  # six transitions: six finished Jobs, their phases absorbed
        [job] = [j for j in player.jobs() if j["metadata"]["name"] not in player.handled]
        player.finish(job)
        informer.observe(kube_cluster.api.get("batch/v1", "jobs", kube_namespace, job["metadata"]["name"]))
        to_jobs(reconciler, player, kube_namespace, "settled", count=n)
    judged: list[str] = []
    parsed: list[str] = []
    finished, job_phase = observe.finished, observe.job_phase

    def counted(job: dict) -> bool:
        judged.append(job["metadata"]["name"])
        return finished(job)

    def parse_counted(job: dict) -> tuple[str, int] | None:
        parsed.append(job["metadata"]["name"])
        return job_phase(job)

    monkeypatch.setattr(observe, "finished", counted)
    monkeypatch.setattr(observe, "job_phase", parse_counted)
    reconciler.reconcile(kube_namespace, "settled")
    assert len(player.jobs()) == 7 and judged == [], judged
    [running] = [j["metadata"]["name"] for j in player.jobs() if j["metadata"]["name"] not in player.handled]
    assert parsed == [running], "the settled phases' Jobs are passed over unread: only the running one is parsed"


def test_a_reconcile_woken_by_an_event_reads_no_result_of_a_running_child(
    operator_env, kube_cluster, kube_namespace, store, monkeypatch
):
    """Kubernetes tells the operator when a child ends, the store tells nothing: a reconcile woken by a watch event
    (Reading.EVENT) does not ask the store for the result of a phase whose child runs (each ask an S3 request, at
    every event of a run), a full reading does, and once the child has ended its result is read and taken in."""
    player, informer, reconciler = informed_run(kube_cluster, kube_namespace, store, "event")
    to_jobs(reconciler, player, kube_namespace, "event")
    [job] = player.jobs()
    found = observe.job_phase(job)
    assert found is not None
    job_phase = found[0]
    asked: list[str] = []
    read_json_or_none, list_ = type(store).read_json_or_none, type(store).list

    def counted_read(self: Store, key: str) -> object:
        asked.append(key)
        return read_json_or_none(self, key)

    def counted_list(self: Store, prefix: str, recursive: bool = True) -> list[str]:
        asked.append(prefix)
        return list_(self, prefix, recursive)

    monkeypatch.setattr(type(store), "read_json_or_none", counted_read)
    monkeypatch.setattr(type(store), "list", counted_list)

    def results_asked(reading: Reading) -> list[str]:
        asked.clear()
        reconciler.reconcile(kube_namespace, "event", reading)
        return [k for k in asked if k.endswith("/result.json")]

    # the start's evaluation runs; the first weight phase is counted but waits (no child yet)
    assert results_asked(Reading.EVENT) == [], "no child has ended: no result is asked for"
    assert results_asked(Reading.POLL) == [], "... nor by a progress poll"
    assert len(results_asked(Reading.FULL)) == 2, "a full reading asks for every phase in flight"
    player.finish(job)  # its result written, then the Job ends; the watch event comes (fed by hand)
    informer.observe(kube_cluster.api.get("batch/v1", "jobs", kube_namespace, job["metadata"]["name"]))
    assert results_asked(Reading.EVENT) == [layout.result_key("event", job_phase)], "the child has ended: its result"
    assert player.status()["evals"][0]["meanAtK"] is not None, "... and taken in"
    started = [j for j in player.jobs() if j["metadata"]["name"] != job["metadata"]["name"]]
    assert started, "the next phase started"
    assert not [k for k in asked if k.endswith("/request.json")], "its request written without asking the store first"
    [weight] = started
    assert weight["metadata"]["labels"][names.LABEL_KIND] == "weight"
    informer.observe(kube_cluster.api.get("batch/v1", "jobs", kube_namespace, weight["metadata"]["name"]))
    asked.clear()
    reconciler.reconcile(kube_namespace, "event", Reading.POLL)
    # this schedule evaluates the weight phase's last checkpoint only (whale.core.alternation.evaluates_mid_phase)
    assert not [k for k in asked if "/checkpoints" in k], "a poll lists no checkpoint of a phase evaluated at its end"
    assert not [k for k in asked if k.endswith("/result.json")], "... nor asks for a result: its child runs"


def test_a_reconcile_that_finds_nothing_new_builds_no_status_to_compare(
    operator_env, kube_cluster, kube_namespace, store, monkeypatch
):
    """A run at rest (its child running, nothing new): the reconcile neither writes the status nor serialises it to
    find that out (the status grows with the run: its evaluations, its phases done)."""
    player, informer, reconciler = informed_run(kube_cluster, kube_namespace, store, "rest")
    to_jobs(reconciler, player, kube_namespace, "rest")
    [job] = player.jobs()
    informer.observe(kube_cluster.api.start_job(kube_namespace, job["metadata"]["name"]))
    reconciler.reconcile(kube_namespace, "rest", Reading.EVENT)  # the start seen (and marked)
    built: list[object] = []
    write_status = reconciler._write_status

    def counted(*args: object) -> object:
        built.append(args)
        return write_status(*args)

    monkeypatch.setattr(reconciler, "_write_status", counted)
    before = len(kube_cluster.emulator._requests)
    for reading in (Reading.EVENT, Reading.POLL, Reading.EVENT):
        outcome = reconciler.reconcile(kube_namespace, "rest", reading)
        assert outcome is not None and outcome.status.active_phase is not None
    assert built == [], "nothing new: no status built to compare"
    assert requests_since(kube_cluster, before) == [], "... and nothing sent"


def test_a_new_run_writes_its_status_once_until_its_first_job_runs(operator_env, kube_cluster, kube_namespace, store):
    """What a reconcile starts it counts at once: the progress mark names the child it decided to start (not only one
    seen running) and the Stalled condition the operator lists before ``decide`` did is worded as ``decide`` words it.
    So the reconciles after the first (the serving target acknowledged and the Job made, the Job seen, its start)
    have nothing to write to the status; each used to write it once more (a patch, a watch event for every watcher)."""
    player, informer, reconciler = informed_run(kube_cluster, kube_namespace, store, "once")
    before = len(kube_cluster.emulator._requests)
    to_jobs(reconciler, player, kube_namespace, "once")
    [job] = player.jobs()
    informer.observe(job)  # the Job's watch event
    reconciler.reconcile(kube_namespace, "once", Reading.EVENT)
    informer.observe(kube_cluster.api.start_job(kube_namespace, job["metadata"]["name"]))
    reconciler.reconcile(kube_namespace, "once", Reading.EVENT)  # the start seen (and marked)
    sent = requests_since(kube_cluster, before)
    status_writes = [path for method, path in sent if method == "PATCH" and path.split("?")[0].endswith("/status")]
    assert len(status_writes) == 1, sent
    status = player.status()
    phase, _ = observe.job_phase(job) or ("?", 0)
    assert phase in status["progressMark"].split("running=")[1].split(","), status["progressMark"]
    stalled = {c["type"]: c for c in status["conditions"]}["Stalled"]
    assert (stalled["status"], stalled["message"]) == ("False", f"last progress at {status['lastProgressTime']}")
