"""The operator starts a child only once the vLLM pod serves the weights that child samples from
(the weight-sync sidecar's acknowledgement, ``control/served.json``). The test plays the sidecar."""

from __future__ import annotations

import time

import pytest

from tests.fixtures.kube import wait_for
from whale.core import layout
from whale.inference.doorbell import Doorbell

pytestmark = pytest.mark.timeout(120)


def test_children_wait_for_the_served_acknowledgement(start_operator, make_run, store):
    with start_operator():
        run = make_run("gated", play_sidecar=False)
        target = wait_for(lambda: run.store.read_json_or_none(layout.serving_key("gated")), what="the serving target")
        assert target == {"checkpoint": None}
        # no acknowledgement: no Job, however long the operator polls (progress interval 0.2 s)
        deadline = time.monotonic() + 1.5
        while time.monotonic() < deadline:
            assert run.jobs() == []
            time.sleep(0.1)
        run.store.write_json(layout.served_key("gated"), {"checkpoint": None, "at": "2026-01-01T00:00:00Z"})
        first = run.wait_job()
        assert first["metadata"]["name"] == "gated-eval-c00-s000000-start-1"
        run.finish(first)
        # the weight phase samples from the base model too: it starts at once
        second = run.wait_job()
        assert second["metadata"]["labels"]["whale.dev/phase"] == "c01-weight"
        run.finish(second)
        # the eval of step 2 needs the new checkpoint served: it waits until the sidecar says so
        ckpt = layout.checkpoint_prefix("gated", 2)
        wait_for(
            lambda: (run.store.read_json_or_none(layout.serving_key("gated")) or {}).get("checkpoint") == ckpt,
            what="the operator to serve the step-2 checkpoint",
        )
        assert run.pending_job() is None
        run.ack_serving()
        third = run.wait_job()
        assert third["metadata"]["labels"]["whale.dev/phase"] == "eval-c01-s000002-weight"
        assert run.store.read_json(layout.spec_key("gated"))["domain"] == "synthetic"


def test_the_sidecars_doorbell_wakes_a_waiting_run_without_the_poll(start_operator, make_run, monkeypatch):
    # no poll within the test: only watch events move the run
    monkeypatch.setenv("WHALE_OPERATOR_PROGRESS_S", "300")
    monkeypatch.setenv("WHALE_OPERATOR_RESYNC_S", "300")
    with start_operator():
        run = make_run("bell", play_sidecar=False, ring_doorbell=False)
        api = run.api
        wait_for(lambda: run.store.read_json_or_none(layout.serving_key("bell")), what="the serving target")
        cm = wait_for(lambda: api.get("v1", "configmaps", run.namespace, "bell-served"), what="the doorbell")
        assert cm["metadata"]["ownerReferences"][0]["kind"] == "WhaleRun"
        dep = wait_for(lambda: api.get("apps/v1", "deployments", run.namespace, "bell-vllm"), what="the server")
        assert dep["spec"]["template"]["spec"]["serviceAccountName"] == "bell-weight-sync"
        quiet(run, 1.0)  # the reconciles that made those have run, and waited for the acknowledgement
        run.ack_serving()  # in the store only (an old sidecar): nothing the operator watches changed
        quiet(run, 1.5)
        Doorbell(api.url, run.namespace, "bell-served").ring({"checkpoint": None})
        first = run.wait_job(20)  # long before the 300 s poll
        assert first["metadata"]["name"] == "bell-eval-c00-s000000-start-1"
        # and for new weights: the eval of step 2 waits for them, the ring starts it
        run.ring_doorbell = True
        run.play_sidecar = True
        run.finish(first)
        run.finish(run.wait_job(20))
        third = run.wait_job(20)
        assert third["metadata"]["labels"]["whale.dev/phase"] == "eval-c01-s000002-weight"


def quiet(run, seconds: float) -> None:
    """No Job appears for ``seconds`` (the operator is waiting, with nothing to wake it)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        assert run.jobs() == []
        time.sleep(0.1)
