"""The install commands of docs/operator.md, run as written with the real kubectl against the API emulator.

Every ```bash block under a ``<!-- tested: ... -->`` marker is run line by line (comments skipped) by bash in a
fresh emulator, from a folder that holds ``manifests/`` and the two credential files the commands read. The
emulator serves no OpenAPI document, so a ``kubectl`` shim first on the PATH adds ``--validate=false`` to
``apply``; what client-side validation would check, tests/operator/test_packaging.py checks with
kubernetes-validate. And the reason the CRDs go first is
shown: an overlay applied before them is refused.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from tests.fixtures.kube import EmulatedCluster, start_emulator

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "operator.md"
KUBECTL_TIMEOUT_S = 120
pytestmark = pytest.mark.skipif(shutil.which("kubectl") is None, reason="needs kubectl")


def marked_blocks() -> list[tuple[str, list[str]]]:
    """(the heading above it, its commands) for each marked block."""
    text = DOC.read_text()
    out = []
    for m in re.finditer(r"<!-- tested:[^\n]*-->\n```bash\n(.*?)```", text, flags=re.S):
        heading = re.findall(r"^#+ (.+)$", text[: m.start()], flags=re.M)[-1]
        commands = [line for line in m.group(1).splitlines() if line.strip() and not line.lstrip().startswith("#")]
        out.append((heading, commands))
    return out


BLOCKS = marked_blocks()


@pytest.fixture()
def emulator(tmp_path: Path) -> Iterator[EmulatedCluster]:
    cluster, stop = start_emulator(tmp_path)
    try:
        yield cluster
    finally:
        cluster.api.close()
        stop.set()
        stop.thread.join(timeout=10)  # type: ignore[attr-defined]


def workdir(tmp_path: Path) -> Path:
    cwd = tmp_path / "checkout"
    cwd.mkdir()
    (cwd / "manifests").symlink_to(ROOT / "manifests")
    (cwd / "chart").symlink_to(ROOT / "chart")
    (cwd / "access-key").write_text("an-access-key")
    (cwd / "secret-key").write_text("a-secret-key")
    return cwd


SHIM = """#!/bin/bash
args=()
for a in "$@"; do args+=("$a"); if [ "$a" = apply ]; then args+=(--validate=false); fi; done
exec {kubectl} "${{args[@]}}"
"""


def kubectl(cluster: EmulatedCluster, cwd: Path, line: str) -> subprocess.CompletedProcess[str]:
    assert shlex.split(line)[0] == "kubectl", f"a tested block runs kubectl only: {line}"
    shim = cwd / "bin" / "kubectl"
    if not shim.exists():
        shim.parent.mkdir()
        shim.write_text(SHIM.format(kubectl=shutil.which("kubectl")))
        shim.chmod(0o755)
    # HOME: kubectl keeps a discovery cache under ~/.kube; keep it out of the user's
    env = {
        **os.environ,
        "KUBECONFIG": str(cluster.kubeconfig),
        "HOME": str(cwd),
        "PATH": f"{shim.parent}{os.pathsep}{os.environ['PATH']}",
    }
    return subprocess.run(
        ["bash", "-o", "pipefail", "-c", line],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=KUBECTL_TIMEOUT_S,
        check=False,
    )


def test_the_doc_has_the_blocks_this_test_runs():
    assert {h for h, _ in BLOCKS} >= {"Cluster-wide", "Namespaced", "Monitoring", "Uninstall"}


@pytest.mark.parametrize("heading, commands", BLOCKS, ids=[h for h, _ in BLOCKS])
def test_each_documented_command_works(emulator: EmulatedCluster, tmp_path: Path, heading: str, commands: list[str]):
    cwd = workdir(tmp_path)
    if heading == "Monitoring":  # its prerequisites: an install, and the Prometheus Operator's CRDs (stand-ins)
        for line in ("kubectl apply -f chart/crds", "kubectl apply -k manifests/overlays/cluster"):
            assert kubectl(emulator, cwd, line).returncode == 0
        for plural, kind in (("servicemonitors", "ServiceMonitor"), ("prometheusrules", "PrometheusRule")):
            emulator.api.create(
                "apiextensions.k8s.io/v1", "customresourcedefinitions", None, stand_in_crd(plural, kind)
            )
    if heading == "Uninstall":  # an install with a run whose finalizer no operator will remove
        for line in (
            "kubectl apply -f chart/crds",
            "kubectl wait --for=condition=Established --timeout=60s -f chart/crds",
            "kubectl apply -k manifests/overlays/cluster",
            "kubectl create namespace team-a --dry-run=client -o yaml | kubectl apply -f -",
        ):
            assert kubectl(emulator, cwd, line).returncode == 0, line
        run = yaml.safe_load((ROOT / "manifests" / "examples" / "tiny-cpu.yaml").read_text())
        run["metadata"] = {"name": "stuck", "namespace": "team-a", "finalizers": ["whale.dev/operator"]}
        emulator.api.create("whale.dev/v1alpha2", "whaleruns", "team-a", run)
    for line in commands:
        done = kubectl(emulator, cwd, line)
        assert done.returncode == 0, f"{line}\n{done.stdout}\n{done.stderr}"
    if heading == "Uninstall":  # nothing of WHALE is left
        assert emulator.api.get("whale.dev/v1alpha2", "whaleruns", "team-a", "stuck") is None
        crds = "apiextensions.k8s.io/v1", "customresourcedefinitions"
        assert emulator.api.get(*crds, None, "whaleruns.whale.dev") is None
        assert emulator.api.get("apps/v1", "deployments", "whale-system", "whale-operator") is None


def stand_in_crd(plural: str, kind: str) -> dict:
    """The Prometheus Operator's CRD as far as the emulator needs it (the real one is that project's)."""
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{plural}.monitoring.coreos.com"},
        "spec": {
            "group": "monitoring.coreos.com",
            "scope": "Namespaced",
            "names": {"plural": plural, "singular": kind.lower(), "kind": kind},
            "versions": [
                {
                    "name": "v1",
                    "served": True,
                    "storage": True,
                    "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}},
                }
            ],
        },
    }


def test_an_overlay_applied_before_the_crds_is_refused(emulator: EmulatedCluster, tmp_path: Path):
    """Why the doc applies chart/crds first and alone."""
    cwd = workdir(tmp_path)
    first = kubectl(emulator, cwd, "kubectl apply -k manifests/overlays/cluster")
    assert first.returncode != 0
    assert 'no matches for kind "ClusterKopfPeering"' in first.stderr
    for line in (
        "kubectl apply -f chart/crds",
        "kubectl wait --for=condition=Established --timeout=60s -f chart/crds",
        "kubectl apply -k manifests/overlays/cluster",
    ):
        done = kubectl(emulator, cwd, line)
        assert done.returncode == 0, f"{line}\n{done.stderr}"
