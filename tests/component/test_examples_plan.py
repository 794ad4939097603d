"""`whale plan` on the paper's twelve manifests prints the optimiser updates per RSFT step (JSON and text),
and the manifests carry the paper's thinking and token-budget settings."""

from __future__ import annotations

import json

import pytest
import yaml
from typer.testing import CliRunner

from tests.fixtures.specs import flat
from tests.unit.test_rsft_minibatch_scope import PAPER_RUNS, PAPER_UPDATES
from whale.cli import app


@pytest.mark.parametrize("path", PAPER_RUNS, ids=lambda p: p.stem)
def test_plan_json_gives_the_optimizer_updates_per_step(path):
    res = CliRunner().invoke(app, ["plan", str(path), "-o", "json"])
    assert res.exit_code == 0, res.output
    plan = json.loads(res.output)
    if plan["condition"] == "mh_only":
        assert "optimizerUpdatesPerStep" not in plan
        return
    ranks, bound, by_kept = PAPER_UPDATES[path.stem.split("-")[0]]
    updates = plan["optimizerUpdatesPerStep"]
    assert (updates["miniBatchScope"], updates["dataParallelRanks"], updates["upperBound"]) == ("perRank", ranks, bound)
    assert [u["updates"] for u in updates["byKept"]] == by_kept


def test_plan_text_prints_the_figure():
    path = next(p for p in PAPER_RUNS if p.stem == "math-rsft")
    res = CliRunner().invoke(app, ["plan", str(path)])
    assert res.exit_code == 0, res.output
    assert (
        "optimizer updates per RSFT step (perRank mini-batch, 8 data-parallel ranks): 1 x ceil(ceil(kept / 8) / "
        "64); at most 4 (every rollout kept); 1 at 512 kept, 2 at 1024 kept, 4 at 2048 kept"
    ) in " ".join(res.output.split())


@pytest.mark.parametrize("path", PAPER_RUNS, ids=lambda p: p.stem)
def test_the_manifests_carry_the_papers_thinking_and_budgets(path):
    spec = flat(yaml.safe_load(path.read_text())["spec"])
    assert spec["model"]["enableThinking"] is True and spec["inference"].get("reasoningParser") is None
    sampling = spec["rsft"]["sampling"]
    budget, window = {"searchqa": (8192, 10240), "math": (8192, 8192), "chess": (8129, 16384)}[path.stem.split("-")[0]]
    assert (sampling["episodeTokenBudget"], sampling["episodeWindowTokens"]) == (budget, window)
    assert sampling["maxResponseTokens"] == budget  # per call: the paper lets one call spend the whole budget
