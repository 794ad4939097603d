"""Opt-in: the operator on a real cluster ($KUBECONFIG), run with ``pytest --run-cluster``.

Expects ``kubectl apply -f chart/crds`` then ``kubectl apply -k manifests/overlays/dev`` done (CRDs, RBAC, operator,
dev MinIO) and the images loaded
(``images/build.sh`` then ``kind load docker-image ...``). Applies the tiny CPU example, waits for it to
succeed with the real Job controller and workloads, checks what kubectl shows, then deletes it and
checks the garbage collector took every child.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import pytest

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(3600)]
EXAMPLE = Path(__file__).resolve().parents[2] / "manifests" / "examples" / "tiny-cpu.yaml"
NS = os.environ.get("WHALE_CLUSTER_NAMESPACE", "whale")


def kubectl(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["kubectl", *args], capture_output=True, text=True, timeout=120, check=check)


@pytest.fixture()
def cluster_run():
    if not os.environ.get("KUBECONFIG"):
        pytest.skip(
            "set $KUBECONFIG to a cluster with the operator installed (docs/operator.md: chart/crds, then manifests/overlays/dev)"
        )
    kubectl("-n", NS, "delete", "wr", "tiny-cpu", "--ignore-not-found", "--wait=true")
    kubectl("-n", NS, "apply", "-f", str(EXAMPLE))
    yield "tiny-cpu"
    kubectl("-n", NS, "delete", "wr", "tiny-cpu", "--ignore-not-found", check=False)


def test_tiny_run_on_a_real_cluster(cluster_run: str):
    deadline = time.monotonic() + 3000
    phase = ""
    while time.monotonic() < deadline:
        phase = kubectl("-n", NS, "get", "wr", cluster_run, "-o", "jsonpath={.status.phase}").stdout
        if phase in ("Succeeded", "Failed"):
            break
        time.sleep(10)
    status = json.loads(kubectl("-n", NS, "get", "wr", cluster_run, "-o", "json").stdout)["status"]
    assert phase == "Succeeded", status
    assert status["completedPhases"] == ["c01-weight", "c01-harness", "c02-weight"]
    assert status["best"]["meanAtK"] >= 0
    header = kubectl("-n", NS, "get", "wr", cluster_run).stdout.splitlines()[0].split()
    assert header == ["NAME", "PHASE", "CYCLE", "STAGE", "STEP", "BEST", "ROLLOUTS", "AGE"]
    reasons = kubectl(
        "-n",
        NS,
        "get",
        "events",
        "--field-selector",
        f"involvedObject.name={cluster_run}",
        "-o",
        "jsonpath={.items[*].reason}",
    ).stdout.split()
    assert "Started" in reasons and "Succeeded" in reasons

    kubectl("-n", NS, "delete", "wr", cluster_run, "--wait=true")
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        left = kubectl(
            "-n", NS, "get", "jobs,deployments,services", "-l", f"whale.dev/run={cluster_run}", "-o", "name"
        ).stdout.split()
        if not left:
            break
        time.sleep(2)
    assert left == []
