"""The watches of the runs' children outside kopf (:mod:`whale_operator.watches`), against the API emulator over
HTTP: a child's change wakes its run and reaches the informer, a dropped stream resumes from its version without
losing an event, 410 Gone lists afresh and forgets what was deleted meanwhile, bookmarks move the version, and a
stopped operator leaves no watch thread behind, even one stopped before its start-up completed."""

from __future__ import annotations

import asyncio
import http.server
import logging
import threading
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import urllib3

from tests.fixtures.http_double import DoubleHTTPServer
from tests.fixtures.kube import EmulatedCluster, install_jobset, start_emulator, wait_for
from whale.core.spec import API_GROUP, API_VERSION
from whale_operator import handlers, names, watches
from whale_operator import kube as kube_module
from whale_operator.informer import JOB, Informer
from whale_operator.kube import KubeClient
from whale_operator.metrics import OperatorMetrics
from whale_operator.watches import (
    ChildIndex,
    ChildWatches,
    Decision,
    Step,
    decide,
    watch_namespaces,
    watch_timeout_s,
)

pytestmark = pytest.mark.timeout(120)
RUN_UID = "run-uid-1"


# --- pure ---
def test_what_each_event_does_to_the_watch() -> None:
    obj = {"metadata": {"resourceVersion": "41"}}
    assert decide({"type": "MODIFIED", "object": obj}) == Decision(Step.APPLY, "41")
    assert decide({"type": "DELETED", "object": obj}) == Decision(Step.APPLY, "41")
    assert decide({"type": "BOOKMARK", "object": obj}) == Decision(Step.BOOKMARK, "41")
    gone = decide({"type": "ERROR", "object": {"kind": "Status", "code": 410, "message": "too old"}})
    assert gone == Decision(Step.EXPIRED, message="too old")
    assert decide({"type": "ERROR", "object": {"code": 500, "message": "etcd"}}).step is Step.FAILED


def child(uid: str, status: dict[str, Any] | None = None) -> dict[str, Any]:
    refs = [{"kind": "WhaleRun", "uid": RUN_UID}, {"kind": "Other", "uid": "x"}]
    meta = {"name": f"c-{uid}", "namespace": "ns", "uid": uid, "resourceVersion": "1", "ownerReferences": refs}
    return {"kind": "Job", "metadata": meta, "spec": {}, "status": status or {}}


def test_the_index_wakes_on_what_a_reconcile_reads_and_on_deletion() -> None:
    index = ChildIndex()
    assert index.apply("ADDED", child("a")) == ()  # nothing to read yet: its maker knows it is there
    assert index.apply("MODIFIED", child("a", {"active": 1})) == (RUN_UID,)
    assert index.apply("MODIFIED", child("a", {"active": 1})) == ()  # unchanged for a reconcile
    assert index.apply("DELETED", child("a", {"active": 1})) == (RUN_UID,)
    assert "a" not in index.seen
    index.apply("ADDED", child("b"))
    index.apply("ADDED", child("c"))
    gone = index.missing([child("c")])
    assert [(g.name, g.owners) for g in gone] == [("c-b", (RUN_UID,))] and set(index.seen) == {"c"}


def test_the_scope_and_timeout_settings_name_the_variable_on_bad_input() -> None:
    assert watch_namespaces({}) == ()
    assert watch_namespaces({"WHALE_OPERATOR_NAMESPACES": " team-a, team-b ,team-a"}) == ("team-a", "team-b")
    with pytest.raises(ValueError, match="WHALE_OPERATOR_NAMESPACES: 'Team_A'"):
        watch_namespaces({"WHALE_OPERATOR_NAMESPACES": "Team_A"})
    assert watch_timeout_s({}) == 300
    for bad in ("0", "-3", "5m"):
        with pytest.raises(ValueError, match="WHALE_OPERATOR_WATCH_TIMEOUT_S"):
            watch_timeout_s({"WHALE_OPERATOR_WATCH_TIMEOUT_S": bad})


# --- against the emulator ---
class Woken:
    """The runs the watches woke, on an event loop of the test's own (the operator's daemons live on kopf's)."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.runs: list[str] = []
        self.thread = threading.Thread(target=self.loop.run_forever, name="test-loop", daemon=True)
        self.thread.start()

    def wake(self, runs: tuple[str, ...]) -> None:
        self.runs.extend(runs)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()


@pytest.fixture()
def watching(
    kube_cluster: EmulatedCluster, kube_namespace: str, monkeypatch: pytest.MonkeyPatch
) -> Iterator[tuple[ChildWatches, Informer, Woken, OperatorMetrics]]:
    monkeypatch.setenv("KUBECONFIG", str(kube_cluster.kubeconfig))
    kube = KubeClient.from_environment(pool_size=4)
    informer, metrics, woken = Informer(kube), OperatorMetrics(), Woken()
    env = {"WHALE_OPERATOR_NAMESPACES": kube_namespace, "WHALE_OPERATOR_WATCH_TIMEOUT_S": "60"}
    watches = ChildWatches.build(kube, informer, metrics, woken.wake, woken.loop, env)
    watches.start()
    try:
        yield watches, informer, woken, metrics
    finally:
        watches.stop()
        woken.close()
        kube.close()
        kube_cluster.call(lambda: kube_cluster.emulator.refuse_watches.discard("jobs"))
    assert not [w for w in watches.watches if w.thread.is_alive()]


def make_job(kube_cluster: EmulatedCluster, ns: str, name: str) -> dict[str, Any]:
    labels = {"app.kubernetes.io/managed-by": names.MANAGED_BY, names.LABEL_RUN: "r"}
    owner = {"apiVersion": f"{API_GROUP}/{API_VERSION}", "kind": "WhaleRun", "name": "r", "uid": RUN_UID}
    body = {"metadata": {"name": name, "labels": labels, "ownerReferences": [owner]}, "spec": {"template": {}}}
    return kube_cluster.api.create("batch/v1", "jobs", ns, body)


def job_watch(watches: ChildWatches) -> Any:
    return next(w for w in watches.watches if w.target.kind == "Job")


def served(kube_cluster: EmulatedCluster, ns: str) -> list[tuple[str, str]]:
    """The Job watches the emulator served in ``ns``: (plural, the resourceVersion asked for)."""
    log = kube_cluster.call(lambda: list(kube_cluster.emulator.watches_served))
    return [(plural, rv) for plural, where, rv in log if plural == "jobs" and where == ns]


def held(informer: Informer, ns: str, job: dict[str, Any]) -> str | None:
    """The resourceVersion of the informer's copy of ``job`` (None: it holds none)."""
    probe = {"kind": "Job", "metadata": {"namespace": ns, "name": job["metadata"]["name"], "resourceVersion": "0"}}
    newest = informer.newest(probe)
    return None if newest is probe else newest["metadata"]["resourceVersion"]


def restarts(metrics: OperatorMetrics, reason: str) -> float:
    return (
        metrics.registry.get_sample_value("whale_operator_watch_restarts_total", {"kind": "Job", "reason": reason})
        or 0.0
    )


def test_a_childs_change_wakes_its_run_and_its_deletion_is_forgotten(watching, kube_cluster, kube_namespace):
    watches, informer, woken, _ = watching
    ns = kube_namespace
    wait_for(lambda: served(kube_cluster, ns), what="the Job watch")
    job = make_job(kube_cluster, ns, "j1")
    wait_for(lambda: held(informer, ns, job) == job["metadata"]["resourceVersion"], what="the new Job in the informer")
    assert woken.runs == []  # a new child with nothing to read wakes nothing
    started = kube_cluster.api.start_job(ns, "j1")
    wait_for(lambda: woken.runs == [RUN_UID], what="its run woken by the Job's status")
    assert held(informer, ns, job) == started["metadata"]["resourceVersion"]
    kube_cluster.api.delete("batch/v1", "jobs", ns, "j1")
    wait_for(lambda: woken.runs == [RUN_UID, RUN_UID], what="its run woken by the deletion")
    assert held(informer, ns, job) is None
    assert job["metadata"]["uid"] not in job_watch(watches).index.seen


def test_a_dropped_stream_resumes_from_its_version_without_losing_an_event(watching, kube_cluster, kube_namespace):
    watches, informer, woken, metrics = watching
    ns, emu = kube_namespace, kube_cluster.emulator
    make_job(kube_cluster, ns, "j1")
    wait_for(lambda: job_watch(watches).index.seen, what="the Job seen")
    before = served(kube_cluster, ns)
    kube_cluster.call(lambda: emu.refuse_watches.add("jobs"))
    kube_cluster.call(emu.drop_watches, "jobs")
    wait_for(lambda: restarts(metrics, "KubeError") >= 1, what="a refused watch counted as a restart")
    done = kube_cluster.api.complete_job(ns, "j1")  # while no watch is open
    kube_cluster.call(lambda: emu.refuse_watches.discard("jobs"))
    wait_for(lambda: woken.runs == [RUN_UID], what="the missed completion wakes the run")
    assert held(informer, ns, done) == done["metadata"]["resourceVersion"]
    resumed = served(kube_cluster, ns)[len(before) :]
    # every watch after the drop resumed from the version last seen (no list from scratch: none asked for "")
    assert resumed and all(rv and int(rv) < int(done["metadata"]["resourceVersion"]) for _, rv in resumed)
    assert restarts(metrics, "expired") == 0


def test_410_gone_lists_afresh_and_forgets_a_child_deleted_meanwhile(watching, kube_cluster, kube_namespace):
    watches, informer, woken, metrics = watching
    ns, emu = kube_namespace, kube_cluster.emulator
    gone = make_job(kube_cluster, ns, "gone")
    kept = make_job(kube_cluster, ns, "kept")
    wait_for(lambda: len(job_watch(watches).index.seen) == 2, what="both Jobs seen")
    assert held(informer, ns, gone) is not None
    kube_cluster.call(lambda: emu.refuse_watches.add("jobs"))
    kube_cluster.call(emu.drop_watches, "jobs")
    wait_for(lambda: restarts(metrics, "KubeError") >= 1, what="the watch away")
    kube_cluster.api.delete("batch/v1", "jobs", ns, "gone")  # its DELETED event is compacted away below
    kube_cluster.call(emu.compact, "jobs")
    kube_cluster.call(lambda: emu.refuse_watches.discard("jobs"))
    wait_for(lambda: restarts(metrics, "expired") == 1, what="410 Gone, listed afresh")
    wait_for(lambda: woken.runs == [RUN_UID], what="the run of the deleted child woken")
    assert held(informer, ns, gone) is None
    assert held(informer, ns, kept) == kept["metadata"]["resourceVersion"]
    assert set(job_watch(watches).index.seen) == {kept["metadata"]["uid"]}


def test_a_bookmark_moves_the_version_the_next_watch_resumes_from(kube_cluster, kube_namespace, monkeypatch):
    monkeypatch.setenv("KUBECONFIG", str(kube_cluster.kubeconfig))
    kube, ns = KubeClient.from_environment(pool_size=2), kube_namespace
    woken = Woken()
    env = {"WHALE_OPERATOR_NAMESPACES": kube_namespace, "WHALE_OPERATOR_WATCH_TIMEOUT_S": "1"}
    watches = ChildWatches.build(kube, Informer(kube), OperatorMetrics(), woken.wake, woken.loop, env)
    watches.start()
    try:
        first = wait_for(lambda: served(kube_cluster, ns), what="the first Job watch")[-1][1]
        # an object the watch's selector leaves out moves the API server's version, not the watch's
        other = kube_cluster.api.create("v1", "configmaps", kube_namespace, {"metadata": {"name": f"x-{uuid.uuid4()}"}})
        later = int(other["metadata"]["resourceVersion"])
        wait_for(
            lambda: any(rv and int(rv) >= later for _, rv in served(kube_cluster, ns)), 10, what="a bookmark's version"
        )
    finally:
        watches.stop()
        woken.close()
        kube.close()
    assert int(first) < later


def watch_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith("watch-")]


def test_a_stopped_operator_leaves_no_watch_thread(start_operator) -> None:
    with start_operator():
        wait_for(lambda: len(watch_threads()) == 4, what="one watch thread per child kind")
    assert watch_threads() == []


class HeldCollector(logging.Handler):
    """``gc`` for the operator's last start-up handler (``settle_collector``): its collection is held until kopf says
    the operator is stopping (kopf then cancels the start-up, once the synchronous handler has returned)."""

    def __init__(self) -> None:
        super().__init__()
        self.entered = threading.Event()
        self.stopping = threading.Event()

    def emit(self, record: logging.LogRecord) -> None:
        if "Operator is stopping" in record.getMessage():
            self.stopping.set()

    def collect(self) -> int:
        self.entered.set()
        self.stopping.wait(30)
        return 0

    def freeze(self) -> None:
        pass


def test_an_operator_stopped_during_its_start_up_leaves_no_watch_thread(start_operator, monkeypatch) -> None:
    """kopf runs no cleanup handler after a start-up cut short: stopped while a start-up handler after the watches'
    still runs (the collector's settling, held here), the operator must end the watch threads all the same."""
    held = HeldCollector()
    monkeypatch.setattr(handlers, "gc", held)
    kopf_reactor = logging.getLogger("kopf._core.reactor.running")
    kopf_reactor.addHandler(held)
    try:
        with start_operator():
            wait_for(lambda: len(watch_threads()) == 4, what="one watch thread per child kind")
            assert held.entered.wait(30), "the start-up reached the collector's settling"
    finally:
        held.stopping.set()
        kopf_reactor.removeHandler(held)
    assert watch_threads() == []


def test_the_informer_lists_a_kind_afresh_after_it_expired(kube_cluster, kube_namespace, monkeypatch) -> None:
    monkeypatch.setenv("KUBECONFIG", str(kube_cluster.kubeconfig))
    kube = KubeClient.from_environment(pool_size=2)
    informer = Informer(kube)
    try:
        assert informer.children(JOB, kube_namespace, "r") == []
        make_job(kube_cluster, kube_namespace, "late")  # no watch feeds this informer: only a list can find it
        assert informer.children(JOB, kube_namespace, "r") == []
        informer.expire(JOB)
        assert [j["metadata"]["name"] for j in informer.children(JOB, kube_namespace, "r")] == ["late"]
    finally:
        kube.close()


def test_a_runs_held_children_are_read_in_name_order_and_follow_each_change(kube_cluster, kube_namespace, monkeypatch):
    """What a read of a run's children answers is kept between reads (a run keeps its finished Jobs: gathering and
    sorting them at every reconcile grew with its length) and made again at each change: a newer version, a new child,
    a deletion. Each read is the caller's own list."""
    monkeypatch.setenv("KUBECONFIG", str(kube_cluster.kubeconfig))
    kube = KubeClient.from_environment(pool_size=2)
    informer = Informer(kube)
    try:
        for name in ("c", "a", "b"):
            make_job(kube_cluster, kube_namespace, name)
        first = informer.children(JOB, kube_namespace, "r")
        assert [j["metadata"]["name"] for j in first] == ["a", "b", "c"]
        first.clear()
        assert len(informer.children(JOB, kube_namespace, "r")) == 3, "a caller's change is its own"
        done = {"conditions": [{"type": "Complete", "status": "True"}], "succeeded": 1}
        patched = kube_cluster.api.patch("batch/v1", "jobs", kube_namespace, "b", {"status": done}, sub="status")
        informer.observe({"kind": "Job", **patched}, watched=True)
        [b] = [j for j in informer.children(JOB, kube_namespace, "r") if j["metadata"]["name"] == "b"]
        assert b["status"] == done, "the newer version is read"
        informer.observe({"kind": "Job", **make_job(kube_cluster, kube_namespace, "aa")}, watched=True)
        informer.observe({"kind": "Job", **patched}, deleted=True, watched=True)
        assert [j["metadata"]["name"] for j in informer.children(JOB, kube_namespace, "r")] == ["a", "aa", "c"]
    finally:
        kube.close()


def test_a_stream_without_line_ends_is_cut_off_not_held(monkeypatch) -> None:
    """A line longer than any watch event (one object) ends the stream with an error, in bounded memory."""
    monkeypatch.setattr(kube_module, "MAX_LINE_BYTES", 64 * 1024)

    class Endless(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.end_headers()
            try:
                for _ in range(64):  # 4 MiB with no newline, far past the (lowered) bound
                    self.wfile.write(b"x" * 65536)
            except OSError:  # the client hung up: what the bound is for
                pass

        def log_message(self, *args: Any) -> None:
            pass

    server = DoubleHTTPServer(("127.0.0.1", 0), Endless)  # the client hanging up is the point: quiet
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    http_pool = urllib3.PoolManager()
    try:
        resp = http_pool.request("GET", f"http://127.0.0.1:{server.server_port}/", preload_content=False, timeout=10)
        stream = kube_module.Stream(resp)
        with pytest.raises(kube_module.KubeError, match="longer than 65536 bytes"):
            list(stream.lines())
        stream.close()
    finally:
        http_pool.clear()
        server.shutdown()
        server.server_close()
        thread.join(10)


def test_jobsets_are_watched_once_the_api_serves_them(tmp_path, monkeypatch) -> None:
    """A cluster without JobSet's CRD: the JobSet watch waits (no failure counted), and starts once it is there."""
    cluster, stop = start_emulator(tmp_path)  # its own: the shared one may have JobSet's CRD already
    monkeypatch.setattr(watches, "ABSENT_RECHECK_S", 0.1)
    monkeypatch.setenv("KUBECONFIG", str(cluster.kubeconfig))
    kube, woken, metrics = KubeClient.from_environment(pool_size=2), Woken(), OperatorMetrics()
    env = {"WHALE_OPERATOR_NAMESPACES": "default"}
    started = ChildWatches.build(kube, Informer(kube), metrics, woken.wake, woken.loop, env)
    started.start()

    def watched(plural: str) -> bool:
        return cluster.call(lambda: any(p == plural for p, _, _ in cluster.emulator.watches_served))

    try:
        wait_for(lambda: watched("jobs"), what="the Job watch")
        assert not watched("jobsets")
        install_jobset(cluster.api)
        wait_for(lambda: watched("jobsets"), what="the JobSet watch, once its API is served")
        assert not [s for s in metrics.registry.collect() if s.name == "whale_operator_watch_restarts" and s.samples]
    finally:
        started.stop()
        woken.close()
        kube.close()
        cluster.api.close()
        stop.set()
        stop.thread.join(timeout=10)  # type: ignore[attr-defined]  # start_emulator puts it there
