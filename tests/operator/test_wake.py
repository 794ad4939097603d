"""Which watch events of a child wake its run (``observe.wake_digest``): those that change what a reconcile reads."""

from __future__ import annotations

from whale_operator.observe import wake_digest


def job(status: dict | None = None, **meta) -> dict:
    return {"kind": "Job", "metadata": {"name": "r-c01-weight-1", **meta}, "spec": {}, "status": status or {}}


def test_a_new_child_wakes_nothing_and_its_first_status_does() -> None:
    assert wake_digest(job()) is None  # the reconcile that made it knows it is there
    assert wake_digest(job({"active": 1})) is not None
    assert wake_digest(job({"active": 1})) != wake_digest(job({"succeeded": 1}))
    assert wake_digest(job(deletionTimestamp="2026-01-01T00:00:00Z")) == "deleting"


def test_the_served_checkpoint_annotation_alone_does_not_wake_and_readiness_does() -> None:
    dep = {"kind": "Deployment", "metadata": {"annotations": {}}, "spec": {"replicas": 1}, "status": {"replicas": 1}}
    annotated = {**dep, "metadata": {"annotations": {"whale.dev/checkpoint": "runs/r/checkpoints/step-000002"}}}
    assert wake_digest(annotated) == wake_digest(dep)
    assert wake_digest({**dep, "status": {"replicas": 1, "readyReplicas": 1}}) != wake_digest(dep)
    assert wake_digest({**dep, "spec": {"replicas": 0}}) != wake_digest(dep)


def test_only_an_acknowledgement_on_the_doorbell_wakes() -> None:
    made = {"kind": "ConfigMap", "metadata": {"name": "r-served"}}
    rung = {"kind": "ConfigMap", "metadata": {"name": "r-served", "annotations": {"whale.dev/served": '{"a": 1}'}}}
    assert wake_digest(made) is None
    assert wake_digest(rung) is not None
    again = {"kind": "ConfigMap", "metadata": {"name": "r-served", "annotations": {"whale.dev/served": '{"a": 2}'}}}
    assert wake_digest(again) != wake_digest(rung)


def test_the_operators_started_mark_wakes_nothing() -> None:
    running = job({"active": 1, "startTime": "2026-01-01T00:00:00Z"})
    marked = job({"active": 1, "startTime": "2026-01-01T00:00:00Z"}, annotations={"whale.dev/started": "now"})
    assert wake_digest(marked) == wake_digest(running)
