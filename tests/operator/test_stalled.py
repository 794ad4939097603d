"""The operator shows the Stalled condition ``decide`` sets: one Reconciler against the API emulator, with
the test's clock (a reconcile per step of it), a Job that runs and writes nothing, then a metrics line."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from tests.operator.conftest import BASE_SPEC, prepared_run
from whale.core import layout
from whale_operator import names
from whale_operator.kube import KubeClient
from whale_operator.metrics import OperatorMetrics
from whale_operator.reconcile import Reconciler

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def test_a_job_without_progress_is_stalled_then_not_after_a_metrics_line(
    operator_env, kube_cluster, kube_namespace, store
):
    spec = {
        **BASE_SPEC,
        "condition": "rsft_only",
        "schedule": {"totalSteps": 4},
        "evaluation": {"atStart": False},
        "storage": {"uri": store.uri},
        "retry": {"stallAfterSeconds": 600},
    }
    player = prepared_run(kube_cluster.api, store, kube_namespace, "stall", spec)
    minutes = [0]
    metrics = OperatorMetrics()
    reconciler = Reconciler(
        KubeClient.from_environment(),
        metrics,
        clock=lambda: (T0 + timedelta(minutes=minutes[0])).strftime("%Y-%m-%dT%H:%M:%SZ"),
    )

    def reconcile(after_minutes: int) -> dict:
        minutes[0] += after_minutes
        player.ack_serving()
        outcome = reconciler.reconcile(kube_namespace, "stall")
        assert outcome is not None
        return {c.type: c for c in outcome.status.conditions}

    def gauge() -> float | None:
        return metrics.registry.get_sample_value(
            "whale_operator_run_stalled", {"namespace": kube_namespace, "run": "stall"}
        )

    for _ in range(5):  # started, the inference target acknowledged, the Job created
        conditions = reconcile(1)
        if player.jobs():
            break
    [job] = player.jobs()
    assert job["metadata"]["name"] == names.job_name("stall", "c01-weight", 1)
    # the stall clock started with the run's first reconcile (minute 1), which decided to start the Job
    assert player.status()["lastProgressTime"] == "2026-01-01T00:01:00Z"
    conditions = reconcile(1)  # the Job runs: counted when it was started, so no new progress
    assert conditions["Stalled"].status == "False" and gauge() == 0
    assert player.status()["lastProgressTime"] == "2026-01-01T00:01:00Z"
    conditions = reconcile(10 - minutes[0])  # minute 10: nine minutes of nothing
    assert conditions["Stalled"].status == "False"

    conditions = reconcile(1)
    stalled = conditions["Stalled"]
    assert (stalled.status, stalled.reason) == ("True", "NoProgress")
    assert "no progress in the store for 10 minutes" in stalled.message
    assert f"phase c01-weight, Job {job['metadata']['name']}" in stalled.message
    assert gauge() == 1
    on_object = {c["type"]: c for c in player.status()["conditions"]}
    assert on_object["Stalled"]["status"] == "True" and player.status()["lastProgressTime"]
    assert [j["metadata"]["name"] for j in player.jobs()] == [job["metadata"]["name"]]  # an alert: nothing stopped

    player.weight_metrics(player.request(job), 1)
    assert player.store.read_jsonl(layout.metrics_key("stall", "c01-weight"))
    conditions = reconcile(1)
    assert (conditions["Stalled"].status, conditions["Stalled"].reason) == ("False", "ProgressSeen")
    assert gauge() == 0
    assert {c["type"]: c for c in player.status()["conditions"]}["Stalled"]["status"] == "False"
