"""The weight-sync sidecar's doorbell against the Kubernetes API emulator: each acknowledgement is stamped on the
run's ConfigMap (what the operator watches); a doorbell that cannot ring never fails the acknowledgement."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.fixtures.kube import EmulatedCluster
from whale.inference.doorbell import ANNOTATION, CONFIGMAP_ENV, Doorbell
from whale.inference.weight_sync import WeightSyncer
from whale.store import open_store

pytestmark = pytest.mark.timeout(60)


def test_the_acknowledgement_is_in_the_store_and_on_the_doorbell(
    kube_cluster: EmulatedCluster, kube_namespace: str, tmp_path: Path
) -> None:
    api = kube_cluster.api
    api.create("v1", "configmaps", kube_namespace, {"metadata": {"name": "demo-served"}})
    store = open_store(f"file://{tmp_path / 'store'}")
    bell = Doorbell(kube_cluster.url, kube_namespace, "demo-served")
    syncer = WeightSyncer(store, "demo", "base", tmp_path / "models", doorbell=bell)
    syncer.acknowledge({"checkpoint": "runs/demo/checkpoints/step-000002"})
    served = store.read_json("runs/demo/control/served.json")
    cm = api.get("v1", "configmaps", kube_namespace, "demo-served")
    assert cm is not None
    assert json.loads(cm["metadata"]["annotations"][ANNOTATION]) == served
    assert served["checkpoint"] == "runs/demo/checkpoints/step-000002"


def test_a_doorbell_that_cannot_ring_leaves_the_acknowledgement_standing(
    kube_cluster: EmulatedCluster, kube_namespace: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    store = open_store(f"file://{tmp_path / 'store'}")
    missing = Doorbell(kube_cluster.url, kube_namespace, "no-such-served")
    syncer = WeightSyncer(store, "demo", "base", tmp_path / "models", doorbell=missing)
    syncer.acknowledge({"checkpoint": None})  # the API server answers 404: logged, not raised
    assert store.read_json("runs/demo/control/served.json")["checkpoint"] is None
    assert "refused the doorbell (ConfigMap no-such-served): HTTP 404" in caplog.text
    unreachable = Doorbell("http://127.0.0.1:9", kube_namespace, "demo-served")
    assert unreachable.ring({"checkpoint": None}) is False


def test_only_a_pod_given_the_doorbell_has_one(tmp_path: Path) -> None:
    account = tmp_path / "account"
    env = {CONFIGMAP_ENV: "demo-served", "KUBERNETES_SERVICE_HOST": "10.0.0.1", "KUBERNETES_SERVICE_PORT": "6443"}
    assert Doorbell.from_environment(env, account) is None  # no token mounted (a local run, a test)
    account.mkdir()
    (account / "token").write_text("t0ken\n")
    (account / "namespace").write_text("team-a\n")
    assert Doorbell.from_environment({k: v for k, v in env.items() if k != CONFIGMAP_ENV}, account) is None
    bell = Doorbell.from_environment(env, account)
    assert bell == Doorbell("https://10.0.0.1:6443", "team-a", "demo-served", account / "token", None)
    ipv6 = Doorbell.from_environment({**env, "KUBERNETES_SERVICE_HOST": "fd00::1"}, account)
    assert ipv6 is not None and ipv6.api_url == "https://[fd00::1]:6443"
