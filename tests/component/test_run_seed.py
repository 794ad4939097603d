"""Determinism by seed: two real runs of a shrunk tiny manifest (``tiny-synthetic-whale.yaml``, condition whale:
RSFT steps, a harness search with the replayed proposer, evaluations; the real workloads and the tiny model) with
one ``spec.experiment.seed`` give the same metrics, line for line."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.component.rsft_support import tiny_model_dir
from whale.core import layout
from whale.core.spec import WhaleRunSpec
from whale.store import open_store

pytest.importorskip("transformers")
pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "manifests" / "examples" / "local" / "tiny-synthetic-whale.yaml"
RUN = "tiny-synthetic-whale"
#: what a metrics line says about wall time and speed: the only fields two seeded runs may differ in
TIMING = {"secondsSampling", "secondsTraining", "secondsSyncing", "tokensPerSecond", "seconds"}


def manifest(model_dir: Path, seed: int) -> dict[str, Any]:
    """The demo manifest, shrunk to a CI-sized run: 2 weight steps around one harness phase, small evals."""
    doc = yaml.safe_load(TINY.read_text())
    spec = doc["spec"]["experiment"]
    spec["seed"] = seed
    spec["model"]["name"] = str(model_dir)
    spec["schedule"] = {"totalSteps": 2, "weightStepsPerCycle": 1, "harnessIterationsPerCycle": 2}
    spec["rsft"].update(promptsPerStep=8, rolloutsPerPrompt=4, sftEpochs=1)
    spec["harnessSearch"]["proposer"]["script"] = str(ROOT / spec["harnessSearch"]["proposer"]["script"])
    spec["evaluation"] = {"samplesPerItem": 2, "intervalSteps": 2, "maxItems": 6}
    spec["data"] = {"harnessSize": 8}
    return doc


def run_once(tmp_path: Path, model_dir: Path, seed: int, name: str) -> dict[str, Any]:
    """``whale run`` of the shrunk manifest into a fresh store; returns what the run measured."""
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(manifest(model_dir, seed)))
    store_dir = tmp_path / f"store-{name}"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TOKENIZERS_PARALLELISM": "false"}
    out = subprocess.run(
        [sys.executable, "-m", "whale.cli", "run", str(path), "--store", str(store_dir), "--timeout", "500"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=540,
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    store = open_store(str(store_dir))
    status = store.read_json(layout.status_key(RUN))
    assert status["phase"] == "Succeeded"
    measured: dict[str, Any] = {"evals": {}, "items": {}, "metrics": {}}
    for e in status["evals"]:
        measured["evals"][e["phase"]] = e["meanAtK"]
        rows = store.read_jsonl(layout.eval_items_key(RUN, e["phase"]))
        measured["items"][e["phase"]] = sorted((r["item_id"], r["rewards"]) for r in rows)
    for phase in status["completedPhases"]:
        lines = store.read_jsonl(layout.metrics_key(RUN, phase))
        measured["metrics"][phase] = [{k: v for k, v in line.items() if k not in TIMING} for line in lines]
        # every unit of training work says how long it took (GPU-hours: whale.report.series)
        assert all(line.get("seconds", 0) > 0 or line.get("secondsSampling", 0) > 0 for line in lines), lines
    measured["best"] = status["best"]["meanAtK"]
    measured["rollouts"] = status["rolloutsSpent"]
    return measured


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    return tiny_model_dir(tmp_path_factory.getbasetemp())


def test_one_seed_reaches_every_seeded_part_that_sets_none():
    spec = WhaleRunSpec.model_validate(
        {
            "domain": "synthetic",
            "condition": "rsft_only",
            "model": {"name": "m"},
            "schedule": {"totalSteps": 1},
            "seed": 7,
            "evaluation": {"seed": 3},
        }
    )
    assert (spec.experiment.data.seed, spec.experiment.rsft.seed, spec.experiment.harness_search.seed) == (7, 7, 7)
    assert spec.experiment.evaluation.seed == 3  # a part's own seed wins
    # without it, each part keeps its default (the paper's 42 for data and RSFT)
    bare = WhaleRunSpec.model_validate(
        {"domain": "synthetic", "condition": "rsft_only", "model": {"name": "m"}, "schedule": {"totalSteps": 1}}
    )
    assert (
        bare.experiment.seed,
        bare.experiment.data.seed,
        bare.experiment.rsft.seed,
        bare.experiment.evaluation.seed,
        bare.experiment.harness_search.seed,
    ) == (
        None,
        42,
        42,
        0,
        0,
    )
    # the round trip keeps it
    assert WhaleRunSpec.model_validate(spec.to_wire()) == spec


@pytest.mark.timeout(1100)
def test_two_runs_with_one_seed_measure_the_same(tmp_path, model_dir):
    a = run_once(tmp_path, model_dir, 11, "a")
    b = run_once(tmp_path, model_dir, 11, "b")
    assert set(a["metrics"]) == {"c01-weight", "c01-harness", "c02-weight"}
    assert len(a["evals"]) >= 3 and all(v is not None for v in a["evals"].values())
    # the trainer and the harness phase's in-process model ran on this CPU: the lines say so (no GPU-hours)
    assert {line["device"] for lines in a["metrics"].values() for line in lines} == {"cpu"}
    # every metric, every per-item reward, every evaluation: the same
    assert a == b, json.dumps({"a": a, "b": b})[:4000]
