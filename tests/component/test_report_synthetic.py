"""The issue's "done": `whale run` the synthetic domain for real under weight-only, harness-only and WHALE (one store
each, real workloads through `python -m whale.workloads`), then `whale report` over the three stores."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
import yaml

from whale.core import layout
from whale.report.page import percent

ROOT = Path(__file__).resolve().parents[2]
DEMO = ROOT / "manifests" / "examples" / "local" / "tiny-synthetic-whale.yaml"
SVG = "{http://www.w3.org/2000/svg}"

#: the demo manifest, cut to 4 RSFT steps, under the three conditions of the paper's comparison
RUNS = {
    "tiny-rsft-only": ("rsft_only", {"totalSteps": 4}),
    "tiny-mh-only": ("mh_only", {"mhOnlyIterations": 2}),
    "tiny-whale": ("whale", {"totalSteps": 4, "weightStepsPerCycle": 2, "harnessIterationsPerCycle": 2}),
}


def manifest(tmp: Path, name: str, condition: str, schedule: dict) -> Path:
    doc = yaml.safe_load(DEMO.read_text())
    doc["metadata"]["name"] = name
    doc["spec"].update(condition=condition)
    doc["spec"]["experiment"].update(schedule=schedule)
    doc["spec"]["experiment"]["evaluation"].update(intervalSteps=2, maxItems=8)
    if condition == "whale":  # the live exporter, as the workloads call it
        doc["spec"].setdefault("execution", {})["tracking"] = {"reportTo": ["tensorboard"], "tensorboardDir": "tb"}
    path = tmp / f"{name}.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_report_over_real_runs_of_the_three_conditions(tmp_path):
    pytest.importorskip("matplotlib")
    pytest.importorskip("tensorboardX")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    subprocess.run(
        [sys.executable, "-m", "synthetic.tiny_model", str(tmp_path / ".whale/models/synthetic-tiny")],
        cwd=tmp_path,
        env=env,
        check=True,
        capture_output=True,
        timeout=300,
    )
    (tmp_path / "manifests").symlink_to(ROOT / "manifests")
    statuses = {}
    for name, (condition, schedule) in RUNS.items():
        path = manifest(tmp_path, name, condition, schedule)
        out = subprocess.run(
            [sys.executable, "-m", "whale.cli", "run", str(path), "--store", f"st-{name}", "--timeout", "280"],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
        statuses[name] = json.loads((tmp_path / f"st-{name}" / layout.status_key(name)).read_text())

    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "whale.cli",
            "report",
            *(f"st-{n}" for n in RUNS),
            "-o",
            "html",
            "-o",
            "svg",
            "--out",
            "report",
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    groups = {g.get("id"): g for g in ET.parse(tmp_path / "report" / "mean_at_k.svg").getroot().iter(f"{SVG}g")}
    page = (tmp_path / "report" / "report.html").read_text()
    for name, status in statuses.items():
        for axis in ("rollouts", "steps"):
            assert len(groups[f"mean-{axis}-{name}"].findall(f".//{SVG}use")) == len(status["evals"])
        cells = dict(
            re.findall(
                r'<td data-field="(\w+)"[^>]*>(.*?)</td>',
                re.search(rf'<tr data-run="{name}">(.*?)</tr>', page).group(1),
            )
        )
        assert cells["best"] == percent(status["best"]["meanAtK"]) and cells["k"] == "4"
        assert cells["rolloutsAtBest"] == f"{status['best']['rolloutsAt']:,}"
        assert cells["rolloutsSpent"] == f"{status['rolloutsSpent']:,}"
    training = {g.get("id") for g in ET.parse(tmp_path / "report" / "training.svg").getroot().iter(f"{SVG}g")}
    assert {"reward-tiny-rsft-only", "reward-tiny-whale", "harness-tiny-mh-only", "harness-tiny-whale"} <= training
    # the WHALE run logged each finished phase to TensorBoard while it ran (one events file per phase)
    events = list((tmp_path / "tb" / "tiny-whale").glob("events.out.tfevents.*"))
    assert len(events) == len(statuses["tiny-whale"]["completedPhases"]) + len(statuses["tiny-whale"]["evals"])
