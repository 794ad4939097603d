"""`whale plan` against what a run spends (issue #30): for each condition, a short real run of the shrunk tiny manifest
(the real workloads, the tiny model, the replayed proposer) and the plan of the same manifest; the store's rollouts,
RSFT steps, phases and evaluation points are the plan's — or, where the plan says it gives a bound (adaptive_whale's
phases, mh_only's evaluations of accepted harnesses, a harness phase's proposals, each priced as if valid, new and
scored in full), within it, short by exactly what the run did not spend."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.component.rsft_support import tiny_model_dir
from tests.component.test_run_seed import RUN, manifest
from whale.core import layout
from whale.store import open_store

pytest.importorskip("transformers")
pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]

#: the schedule of each condition's short run
SCHEDULES: dict[str, dict[str, Any]] = {
    "rsft_only": {"totalSteps": 2},
    "mh_only": {"mhOnlyIterations": 2},
    "whale": {"totalSteps": 2, "weightStepsPerCycle": 1, "harnessIterationsPerCycle": 2},
    "adaptive_whale": {
        "totalSteps": 3,
        "adaptive": {
            "weight": {"windowSteps": 1, "burnInSteps": 1, "patienceSteps": 1},
            "harness": {"minIterations": 2, "patience": 1, "maxIterations": 2},
        },
    },
}


def whale_cli(*args: str, cwd: Path, timeout_s: float) -> str:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TOKENIZERS_PARALLELISM": "false"}
    out = subprocess.run(
        [sys.executable, "-m", "whale.cli", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout_s
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    return out.stdout


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    return tiny_model_dir(tmp_path_factory.getbasetemp())


@pytest.mark.timeout(600)
@pytest.mark.parametrize("condition", list(SCHEDULES))
def test_the_plan_counts_what_the_run_spends(tmp_path, model_dir, condition):
    doc = copy.deepcopy(manifest(model_dir, seed=3))
    spec = doc["spec"]
    spec["condition"] = condition
    spec["experiment"]["schedule"] = SCHEDULES[condition]
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(doc))
    plan = json.loads(whale_cli("plan", str(path), "-o", "json", cwd=tmp_path, timeout_s=120))
    store_dir = tmp_path / "store"
    whale_cli("run", str(path), "--store", str(store_dir), "--timeout", "500", cwd=tmp_path, timeout_s=540)

    store = open_store(str(store_dir))
    status = store.read_json(layout.status_key(RUN))
    assert status["phase"] == "Succeeded", status.get("message")
    kinds = Counter("weight" if p.endswith("-weight") else "harness" for p in status["completedPhases"])
    evals = [e for e in status["evals"] if e.get("meanAtK") is not None]
    # the metrics lines add up to the status's rollouts (what the report and decide() count)
    lines = sum(m["rollouts"] for p in status["completedPhases"] for m in store.read_jsonl(layout.metrics_key(RUN, p)))
    assert lines == status["rolloutsSpent"]
    # every harness candidate spent what the plan prices it at, or — where the plan's figure is a bound — less, by
    # exactly what it did not run: the incoming harness its full score, a scored proposal its smoke test and full
    # score, an invalid or duplicate one nothing, one that failed the smoke test at most its smoke episodes
    per = plan.get("rolloutsPerProposal", {"smoke": 0, "full": 0})
    unspent = 0
    harness_spent = 0
    for phase in status["completedPhases"]:
        if not phase.endswith("-harness"):
            continue
        prefix = layout.archive_candidates_prefix(RUN, int(phase[1:3]))
        metas = [store.read_json(k) for k in store.list(prefix) if k.endswith("/meta.json")]
        assert metas, f"no candidate under {prefix}"
        for meta in metas:
            harness_spent += meta["rollouts"]
            if meta["iteration"] == 1:
                assert meta["rollouts"] == per["full"] or per["full"] == 0
                continue
            if meta["status"] == "scored":
                assert meta["rollouts"] == per["smoke"] + per["full"], meta
            elif meta["status"] in ("invalid", "duplicate"):
                assert meta["rollouts"] == 0, meta
            else:
                assert meta["status"] == "smoke_failed" and meta["rollouts"] <= per["smoke"], meta
            unspent += per["smoke"] + per["full"] - meta["rollouts"]
        # a proposer may return fewer proposals than asked (the replayed script has fewer): none spends anything
        iterations = len(store.read_jsonl(layout.metrics_key(RUN, phase)))
        made = sum(1 for meta in metas if meta["iteration"] > 1)
        asked = (iterations - 1) * spec["experiment"]["harnessSearch"]["proposalsPerIteration"]
        assert made <= asked
        unspent += (asked - made) * (per["smoke"] + per["full"])
    weight_spent = status["rolloutsSpent"] - harness_spent
    assert weight_spent == status.get("step", 0) * plan.get("rolloutsPerStep", 0)
    if condition == "adaptive_whale":  # the plan is the longest run the patience rules allow
        assert plan["rolloutsUpperBound"] is True
        assert 0 < status["rolloutsSpent"] <= plan["rollouts"]
        assert status["step"] == plan["totalSteps"]  # the weight budget is spent whatever the phases' lengths
        assert kinds["harness"] <= plan["counts"]["harness"] and len(evals) >= 2
        return
    assert status["rolloutsSpent"] == plan["rollouts"] - unspent
    assert plan.get("rolloutsUpperBound", False) is (condition != "rsft_only")
    assert status.get("step", 0) == plan["totalSteps"]
    assert (kinds["weight"], kinds["harness"]) == (plan["counts"]["weight"], plan["counts"]["harness"])
    if plan.get("evaluationsUpperBound"):  # mh_only: an evaluation only where the accepted harness changed
        assert 1 <= len(evals) <= plan["counts"]["eval"]  # the start, then each newly accepted harness
    else:
        assert len(evals) == plan["counts"]["eval"]
