"""The Kubernetes Events about a run: posted by the reconcile itself through the operator's own client (not kopf's
poster on the event loop), shaped as client-go's recorder writes them, and never able to fail the reconcile that made
them: one the API server refuses is counted and dropped, the run goes on. One Reconciler against the API emulator."""

from __future__ import annotations

from typing import Any

from tests.operator.conftest import BASE_SPEC, prepared_run
from whale.core.spec import API_GROUP, API_VERSION, KIND, PLURAL
from whale_operator import builders
from whale_operator.builders.events import COMPONENT, MESSAGE_LIMIT
from whale_operator.kube import KubeClient
from whale_operator.metrics import OperatorMetrics
from whale_operator.reconcile import Reconciler

FORBIDDEN = (403, "Forbidden", 'events is forbidden: User "whale-operator" cannot create resource "events"')


def test_an_event_names_its_run_and_is_cut_to_one_line():
    run = builders.RunRef("demo", "team-a", "0f1e2d3c")
    ev = builders.run_event(
        run, "Warning", "PhaseRetried", "x" * 5000, builders.event_name("demo", 255), "2026-12-05T08:00:00Z"
    )
    assert ev["metadata"] == {"name": "demo.ff", "namespace": "team-a"}
    assert ev["involvedObject"] == {
        "apiVersion": f"{API_GROUP}/{API_VERSION}",
        "kind": KIND,
        "name": "demo",
        "namespace": "team-a",
        "uid": "0f1e2d3c",
    }
    assert (ev["type"], ev["reason"], len(ev["message"])) == ("Warning", "PhaseRetried", MESSAGE_LIMIT)
    assert ev["source"] == {"component": COMPONENT} and ev["reportingComponent"] == COMPONENT
    assert ev["firstTimestamp"] == ev["lastTimestamp"] == "2026-12-05T08:00:00Z" and ev["count"] == 1
    assert builders.event_name("demo", 1) != builders.event_name("demo", 2)


def _first_job(reconciler: Reconciler, player: Any, namespace: str, name: str) -> None:
    for _ in range(8):  # the run's infrastructure, its serving target acknowledged, its first Job
        player.ack_serving()
        outcome = reconciler.reconcile(namespace, name)
        assert outcome is not None
        if player.jobs():
            return
    raise AssertionError("no first Job after 8 reconciles")


def _events(api: Any, namespace: str, run: str) -> list[dict[str, Any]]:
    return [e for e in api.list("v1", "events", namespace) if e.get("involvedObject", {}).get("name") == run]


def test_the_reconcile_posts_its_events_through_the_operators_client(operator_env, kube_cluster, kube_namespace, store):
    api = kube_cluster.api
    player = prepared_run(api, store, kube_namespace, "told", {**BASE_SPEC, "storage": {"uri": store.uri}})
    metrics = OperatorMetrics()
    reconciler = Reconciler(KubeClient.from_environment(), metrics)
    _first_job(reconciler, player, kube_namespace, "told")
    uid = api.get(f"{API_GROUP}/{API_VERSION}", PLURAL, kube_namespace, "told")["metadata"]["uid"]
    events = _events(api, kube_namespace, "told")
    assert {"Started", "PhaseStarted"} <= {e["reason"] for e in events}, [e["reason"] for e in events]
    assert all(e["involvedObject"]["uid"] == uid and e["source"]["component"] == COMPONENT for e in events)
    assert len({e["metadata"]["name"] for e in events}) == len(events), "each Event a name of its own"
    assert metrics.registry.get_sample_value("whale_operator_events_dropped_total", {"error": "Refused"}) is None


def test_a_refused_event_is_counted_and_dropped_and_the_run_goes_on(operator_env, kube_cluster, kube_namespace, store):
    api, emulator = kube_cluster.api, kube_cluster.emulator
    player = prepared_run(api, store, kube_namespace, "muted", {**BASE_SPEC, "storage": {"uri": store.uri}})
    metrics = OperatorMetrics()
    reconciler = Reconciler(KubeClient.from_environment(), metrics)
    kube_cluster.call(emulator.refuse_creates.__setitem__, "events", FORBIDDEN)
    try:
        _first_job(reconciler, player, kube_namespace, "muted")  # raises nothing: the refusals are not the run's
    finally:
        kube_cluster.call(emulator.refuse_creates.pop, "events", None)
    assert player.jobs(), "the run reached its first Job"
    status = api.get(f"{API_GROUP}/{API_VERSION}", PLURAL, kube_namespace, "muted")["status"]
    assert status["phase"] == "Running" and status.get("attempts"), status
    assert _events(api, kube_namespace, "muted") == []
    dropped = metrics.registry.get_sample_value("whale_operator_events_dropped_total", {"error": "Refused"})
    assert dropped is not None and dropped >= 2, dropped  # Started and PhaseStarted at least
