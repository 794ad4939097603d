"""Issue #29, item 7 (the part that holds today): a phase start that waits (its inference server has not acknowledged
the weights it must serve) sends each child's create once, not once per reconcile. One Reconciler against the API
emulator, reconciling again and again with fresh reads; every create the emulator receives is counted per object. And the started mark: sent for a child seen running, not
for one first seen after it ended."""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

from tests.operator.conftest import BASE_SPEC, prepared_run
from whale_operator import kueue
from whale_operator.kube import KubeClient
from whale_operator.metrics import OperatorMetrics
from whale_operator.reconcile import Reconciler

RECONCILES = 12


def test_a_waiting_phase_start_creates_each_child_once(operator_env, kube_cluster, kube_namespace, store):
    spec = {**BASE_SPEC, "storage": {"uri": store.uri}}
    player = prepared_run(kube_cluster.api, store, kube_namespace, "churn", spec)
    kube = KubeClient.from_environment()
    reconciler = Reconciler(kube, OperatorMetrics())
    emulator = kube_cluster.emulator
    before = len(emulator._requests)
    for _ in range(RECONCILES):  # nobody acknowledges the serving target: the first phase's start stays gated
        reconciler.reconcile(kube_namespace, "churn", False)
    assert player.jobs() == [], "gated: no Job yet"
    creates: Counter[tuple[str, str]] = Counter()
    for request in emulator._requests[before:]:
        if str(request.method).upper().endswith("POST") and "/events" not in request.url.path:
            body = json.loads(request.text)
            creates[(body["kind"], body["metadata"]["name"])] += 1
    assert ("Deployment", "churn-vllm") in creates and ("NetworkPolicy", "churn-workload-ingress") in creates
    assert ("Deployment", "churn-harness") in creates and ("Secret", "churn-auth") in creates
    assert max(creates.values()) == 1, {k: n for k, n in creates.items() if n > 1}


def test_a_child_is_marked_started_when_seen_running_and_not_when_first_seen_ended(
    operator_env, kube_cluster, kube_namespace, store
):
    """The started mark (what tells a later eviction from queueing) goes on a child seen running; a child the operator
    first sees after it ended gets no mark (nothing reads it: an ended child is never evicted) and no request."""
    api = kube_cluster.api
    spec = {**BASE_SPEC, "storage": {"uri": store.uri}}
    player = prepared_run(api, store, kube_namespace, "mark", spec)
    reconciler = Reconciler(KubeClient.from_environment(), OperatorMetrics())

    def annotations(job: dict[str, Any]) -> dict[str, str]:
        now = api.get("batch/v1", "jobs", kube_namespace, job["metadata"]["name"]) or {}
        return now.get("metadata", {}).get("annotations") or {}

    for _ in range(8):  # the run's infrastructure, its serving target acknowledged, its first Job
        player.ack_serving()
        reconciler.reconcile(kube_namespace, "mark")
        if player.jobs():
            break
    first = player.jobs()[0]
    api.start_job(kube_namespace, first["metadata"]["name"])
    reconciler.reconcile(kube_namespace, "mark")
    assert kueue.STARTED_ANNOTATION in annotations(first), "seen running: marked"
    player.finish(first)
    for _ in range(8):  # the next Job, once its serving target is acknowledged
        player.ack_serving()
        reconciler.reconcile(kube_namespace, "mark")
        if len(player.jobs()) > 1:
            break
    second = next(j for j in player.jobs() if j["metadata"]["name"] != first["metadata"]["name"])
    player.finish(second)  # ended before any reconcile saw it run
    patches = len([r for r in kube_cluster.emulator._requests if str(r.method).upper().endswith("PATCH")])
    reconciler.reconcile(kube_namespace, "mark")
    assert kueue.STARTED_ANNOTATION not in annotations(second), "first seen ended: not marked"
    sent = [r.url.path for r in kube_cluster.emulator._requests if str(r.method).upper().endswith("PATCH")][patches:]
    assert not any(second["metadata"]["name"] in path for path in sent), sent
