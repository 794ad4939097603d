"""Issue #29, item 7 (the part that holds today): a phase start that waits (its inference server has not acknowledged
the weights it must serve) sends each child's create once, not once per reconcile. One Reconciler against the API
emulator, reconciling again and again with fresh reads; every create the emulator receives is counted per object."""

from __future__ import annotations

import json
from collections import Counter

from tests.operator.conftest import BASE_SPEC, prepared_run
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
