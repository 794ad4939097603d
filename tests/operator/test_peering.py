"""Issue #29, item 8: operator HA through kopf peering. Two replicas of the real operator (``kopf run --peering``,
each a process of its own, as two pods of the Deployment) against the API emulator, with the peering CRDs of
chart/crds: the replica of lower priority stands by and reconciles nothing, while the other serves the run; when
the active replica exits, the standby takes over. What each replica did is read from its own metrics endpoint (the
reconcile count of ``whale_operator_handler_duration_seconds``), not from its log."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.fixtures.kube import EmulatedCluster, wait_for
from tests.operator.player import WR

pytestmark = pytest.mark.timeout(180)

ROOT = Path(__file__).resolve().parents[2]
PEERING = "whale-operator"
RECONCILES = re.compile(r'^whale_operator_handler_duration_seconds_count\{handler="reconcile"\} (\S+)$', re.M)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Replica:
    """One operator process: its metrics port and its log file."""

    def __init__(self, proc: subprocess.Popen[bytes], port: int, log: Path):
        self.proc, self.port, self.log = proc, port, log

    def metrics(self) -> str | None:
        """Its metrics page (None before the endpoint is up)."""
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/metrics", timeout=5) as answer:
                return str(answer.read().decode())
        except OSError:
            return None

    def reconciles(self) -> float:
        """Reconciles this replica ran (0 before its metrics endpoint is up: it ran none)."""
        found = RECONCILES.search(self.metrics() or "")
        return float(found.group(1)) if found else 0.0

    def output(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""


@pytest.fixture()
def peering(kube_cluster: EmulatedCluster, kube_namespace: str) -> str:
    """The peering CRDs (once per session's emulator) and the namespace's KopfPeering, as manifests/ install them."""
    api = kube_cluster.api
    for crd in yaml.safe_load_all((ROOT / "chart/crds/kopfpeerings.yaml").read_text()):
        if api.get("apiextensions.k8s.io/v1", "customresourcedefinitions", None, crd["metadata"]["name"]) is None:
            api.create("apiextensions.k8s.io/v1", "customresourcedefinitions", None, crd)
    api.create("kopf.dev/v1", "kopfpeerings", kube_namespace, {"metadata": {"name": PEERING}})
    return PEERING


@pytest.fixture()
def replicas(operator_env: None, kube_namespace: str, peering: str, tmp_path: Path) -> Iterator[Any]:
    started: list[Replica] = []

    @contextmanager
    def start(name: str, priority: int) -> Iterator[Replica]:
        port = _free_port()
        env = {
            **os.environ,
            "WHALE_OPERATOR_METRICS_PORT": str(port),
            "WHALE_OPERATOR_PEERING_PRIORITY": str(priority),
            "WHALE_OPERATOR_NAMESPACES": kube_namespace,  # the children's watches: kopf's --namespace
        }
        log = tmp_path / f"{name}.log"
        args = [sys.executable, "-m", "kopf", "run", "--namespace", kube_namespace, "--peering", peering]
        with log.open("wb") as out:
            proc = subprocess.Popen([*args, "-m", "whale_operator.handlers"], env=env, stdout=out, stderr=out)
        replica = Replica(proc, port, log)
        started.append(replica)
        yield replica

    try:
        yield start
    finally:
        for replica in started:
            if replica.proc.poll() is None:
                replica.proc.send_signal(signal.SIGTERM)
                try:
                    replica.proc.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    replica.proc.kill()
                    replica.proc.wait(timeout=10)


def test_the_standby_replica_reconciles_nothing_until_the_active_one_exits(
    replicas, make_run, kube_cluster: EmulatedCluster, kube_namespace: str
):
    def peering_status() -> dict[str, Any]:
        return kube_cluster.api.get("kopf.dev/v1", "kopfpeerings", kube_namespace, PEERING).get("status") or {}

    def suspend(value: bool) -> None:
        kube_cluster.api.patch(WR, "whaleruns", kube_namespace, "ha", {"spec": {"suspend": value}})

    with replicas("active", 200) as active:
        run = make_run("ha")
        first = run.wait_job(timeout_s=60)  # the active replica serves the run
        with replicas("standby", 100) as standby:
            # up (its start-up handler ran) and in the peering (its record next to the active one's); kopf starts a
            # replica paused and unpauses it only when no live peer has a higher priority
            wait_for(standby.metrics, timeout_s=60, what="the standby's metrics endpoint")
            peers = wait_for(
                lambda: len(status := peering_status()) == 2 and status,
                timeout_s=60,
                what="both replicas in the KopfPeering",
            )
            assert sorted(p["priority"] for p in peers.values()) == [100, 200]
            assert standby.reconciles() == 0
            # a change of the run: the active replica reconciles it, the standby still does not
            before = active.reconciles()
            suspend(True)
            wait_for(lambda: active.reconciles() > before, timeout_s=30, what="the active replica's reconcile")
            wait_for(lambda: run.status().get("phase") == "Suspended", timeout_s=30, what="the run suspended")
            assert standby.reconciles() == 0, standby.output()[-3000:]
            assert "Pausing operations" not in active.output()
            assert "Resuming operations" not in standby.output()

            # the active replica exits (a rolling update, a drained node): the standby takes over
            active.proc.send_signal(signal.SIGTERM)
            assert active.proc.wait(timeout=60) == 0, active.output()[-3000:]
            suspend(False)
            again = run.wait_job(timeout_s=90)  # the standby took over: the same attempt resumes
            assert again["metadata"]["name"] == first["metadata"]["name"]
            assert standby.reconciles() > 0
            assert "Resuming operations after the pause" in standby.output()
