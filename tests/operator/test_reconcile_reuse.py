"""A progress poll reuses what the run's last reconcile read from the API server when that reconcile changed nothing
there: one Reconciler against the API emulator, its requests counted."""

from __future__ import annotations

from tests.operator.conftest import BASE_SPEC, prepared_run
from whale_operator.kube import KubeClient
from whale_operator.metrics import OperatorMetrics
from whale_operator.reconcile import Reconciler


def test_a_poll_after_a_quiet_reconcile_asks_the_api_server_nothing(operator_env, kube_cluster, kube_namespace, store):
    spec = {**BASE_SPEC, "storage": {"uri": store.uri}}
    player = prepared_run(kube_cluster.api, store, kube_namespace, "reuse", spec)
    kube = KubeClient.from_environment()
    reconciler = Reconciler(kube, OperatorMetrics())
    emulator = kube_cluster.emulator

    def requests_of(reuse: bool) -> int:
        before = len(emulator._requests)
        reconciler.reconcile(kube_namespace, "reuse", reuse)
        return len(emulator._requests) - before

    for _ in range(6):  # started, the inference target acknowledged, the first Job created
        player.ack_serving()
        reconciler.reconcile(kube_namespace, "reuse")
        if player.jobs():
            break
    [job] = player.jobs()
    requests_of(reuse=False)  # the status takes in the Job just created
    assert requests_of(reuse=False) == 3  # nothing changed: the WhaleRun, its Jobs, its Deployments read, no write
    assert requests_of(reuse=True) == 0  # a poll: the same reads again, from the last reconcile
    assert requests_of(reuse=True) == 0
    player.finish(job)  # the Job ends (a watch event: the daemon would read afresh) ...
    assert requests_of(reuse=False) > 3  # ... and the reconcile writes (its started mark, the status, ...)
    assert requests_of(reuse=True) >= 1  # what it read is stale after its own writes: a poll reads again
