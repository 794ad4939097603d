"""`whale plan -o json` of the paper's 12 manifests gives the paper's budgets: T, E, I, the adaptive and
mh_only iteration counts, the evaluation interval, the rollouts per step and the optimiser updates per step
(issue #13 item 1), whatever data is on the machine (the budgets are in steps, the sizes the full data's)."""

from __future__ import annotations

import json

import pytest
import yaml
from typer.testing import CliRunner

from tests.fixtures.specs import flat
from tests.unit.test_rsft_minibatch_scope import PAPER_RUNS, PAPER_UPDATES
from whale.cli import app

#: the paper's numbers per domain (../shared/REFERENCE.md): steps per epoch = round(|D_weight| / 256),
#: T = epochs x that, E = 0.6 epoch, 0.2 epoch for every adaptive weight knob, mh_only's proposer iterations
PAPER = {
    "searchqa": {"weight": 18_946, "stepsPerEpoch": 74, "T": 296, "E": 44, "adaptive": 15, "mh": 40, "cycles": 7},
    "math": {"weight": 17_917, "stepsPerEpoch": 70, "T": 420, "E": 42, "adaptive": 14, "mh": 60, "cycles": 10},
    "chess": {"weight": 16_384, "stepsPerEpoch": 64, "T": 256, "E": 38, "adaptive": 13, "mh": 40, "cycles": 7},
}
ROLLOUTS_PER_STEP = 256 * 8
EVAL_INTERVAL_STEPS = 7  # about 0.1 epoch (7.4 / 7.0 / 6.4 -> 7, the chess cadence)


def plan_of(path) -> dict:
    res = CliRunner().invoke(app, ["plan", str(path), "-o", "json"])
    assert res.exit_code == 0, res.output
    return json.loads(res.output)


@pytest.fixture(autouse=True)
def no_local_data(tmp_path, monkeypatch):
    """The numbers come from the manifests and the full data's declared sizes, not from the sample data."""
    monkeypatch.setenv("WHALE_DATA_DIR", str(tmp_path / "no-data-here"))


@pytest.mark.parametrize("path", PAPER_RUNS, ids=lambda p: p.stem)
def test_plan_gives_the_papers_budgets(path):
    domain, condition = path.stem.split("-")
    paper = PAPER[domain]
    spec = flat(yaml.safe_load(path.read_text())["spec"])
    plan = plan_of(path)
    assert spec["data"]["source"] == "full" and spec["data"]["seed"] == 42
    assert plan["stepsPerEpoch"] == paper["stepsPerEpoch"]
    if condition == "mh":
        assert spec["schedule"]["mhOnlyIterations"] == paper["mh"]  # proper proposer iterations
        assert plan["counts"]["weight"] == 0 and plan["counts"]["harness"] == 1 and plan["totalSteps"] == 0
        assert "optimizerUpdatesPerStep" not in plan and "rolloutsPerStep" not in plan
        return
    assert plan["totalSteps"] == paper["T"]
    assert plan["rolloutsPerStep"] == ROLLOUTS_PER_STEP
    assert plan["evalIntervalSteps"] == EVAL_INTERVAL_STEPS
    assert (spec["rsft"]["weightDecay"], spec["rsft"]["seed"]) == (0.01, 42)
    ranks, bound, by_kept = PAPER_UPDATES[domain]
    updates = plan["optimizerUpdatesPerStep"]
    assert (updates["dataParallelRanks"], updates["upperBound"]) == (ranks, bound)
    assert [u["updates"] for u in updates["byKept"]] == by_kept
    weights = [p for p in plan["phases"] if p["kind"] == "weight"]
    if condition == "rsft":
        assert [(p["fromStep"], p["toStep"]) for p in weights] == [(0, paper["T"])]
        assert plan["counts"]["harness"] == 0
    elif condition == "whale":
        assert plan["weightStepsPerCycle"] == paper["E"]
        assert plan["harnessIterationsPerPhase"] == 6  # I: the incoming evaluation + 5 proposer iterations
        ends = [min(paper["E"] * k, paper["T"]) for k in range(1, paper["cycles"] + 1)]
        assert [p["toStep"] for p in weights] == ends and ends[-1] == paper["T"]
        assert plan["counts"] == {
            "weight": paper["cycles"],
            "harness": paper["cycles"] - 1,
            "eval": plan["counts"]["eval"],
        }
    else:
        assert condition == "adaptive"
        n = paper["adaptive"]
        assert plan["adaptive"] == {
            "weight": {"windowSteps": n, "burnInSteps": n, "patienceSteps": n},
            "harness": {"minIterations": 6, "patience": 2, "maxIterations": 15},
        }
        assert "weightStepsPerCycle" not in plan


@pytest.mark.parametrize("domain", sorted(PAPER))
def test_the_full_data_sizes_give_the_papers_steps_per_epoch(domain):
    """|D_weight| of the full data, as `whale plan` sees it before anything is fetched."""
    from whale import plugins
    from whale.core.spec import Data

    name = {"searchqa": "search_qa", "math": "math_reasoning", "chess": "chess_puzzles"}[domain]
    sizes = plugins.load(name).split_sizes(Data(source="full", seed=42))
    assert sizes["weight"] == PAPER[domain]["weight"] and sizes["harness"] == 256
    assert round(sizes["weight"] / 256) == PAPER[domain]["stepsPerEpoch"]


def _budget_table() -> dict[str, list[str]]:
    """docs/reproducing.md's budget table, by run name: its cells."""
    from pathlib import Path

    text = (Path(__file__).resolve().parents[2] / "docs" / "reproducing.md").read_text()
    rows = {}
    for line in text.split("## Budgets of each run", 1)[1].split("\n\n## ", 1)[0].splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if cells and cells[0].endswith(("-rsft", "-mh", "-whale", "-adaptive")):
            rows[cells[0]] = cells
    return rows


@pytest.mark.parametrize("path", PAPER_RUNS, ids=lambda p: p.stem)
def test_the_documented_budget_table_is_whale_plans(path):
    """The phases and rollouts columns of docs/reproducing.md are what `whale plan` prints (≤ where it is a bound)."""
    row = _budget_table()[path.stem]
    p = plan_of(path)
    bound = "≤ " if p.get("rolloutsUpperBound") else ""
    assert row[-1] == f"{bound}{p['rollouts']:,}"
    weight, harness = (c.removeprefix("≤ ") for c in row[-2].split(" / "))
    assert (int(weight), int(harness)) == (p["counts"]["weight"], p["counts"]["harness"])
