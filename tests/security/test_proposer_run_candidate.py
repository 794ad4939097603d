"""The proposer's ``run_candidate``: a candidate on a few D_harness items, inside the sandbox, never the test split.

The tool is built from the evaluator's item list — the D_harness split — and nothing else, so a test
item can never be requested or returned; a candidate goes through the search loop's own static gate
first; one that got past the gate still runs in the harness sandbox (the probe below tries the data
root, the checkout, the runtime's environment and the network from inside a trial, and is refused each
time); and every rollout is counted against the iteration's budget.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from synthetic import DOMAIN
from tests.component.test_search_phase import GOOD
from tests.fixtures.proposer_double import DigitSayerPolicyDouble
from tests.security.harness_probes import CHECKOUT, gold_file, probe_harness, report
from whale.core.spec import Data
from whale.metaharness.evaluate import CandidateEvaluator, EvalSettings
from whale.metaharness.proposer.tools import CandidateTrials, ProposerTools, Toolbox
from whale.metaharness.proposer.workspace import ToolError, Workspace
from whale.metaharness.validate import candidate_problems

SETTINGS = EvalSettings(
    smoke_items=2, smoke_hook_timeout_s=3.0, smoke_timeout_s=30, candidate_timeout_s=60, max_concurrency=8
)


def _gate(code: str) -> list[str]:
    return candidate_problems(code, incoming=GOOD, allowed_imports=DOMAIN.allowed_imports, prompt_only=False)


@pytest.fixture
def harness_items() -> list[dict]:
    return DOMAIN.load_split("harness", Data(harness_size=6))


@pytest.fixture
def test_items() -> list[dict]:
    return DOMAIN.load_split("test", Data(test_size=4))


def _trials(items: list[dict], policy: DigitSayerPolicyDouble, budget: int = 64, check=_gate) -> CandidateTrials:
    evaluator = CandidateEvaluator(DOMAIN, policy, items, SETTINGS)
    return CandidateTrials(evaluator, check=check, budget=budget, call_timeout_s=60)


@pytest.mark.timeout(120)
def test_a_test_item_can_never_be_requested_or_returned(harness_items, test_items, tmp_path: Path):
    policy = DigitSayerPolicyDouble()
    trials = _trials(harness_items, policy)
    harness_ids = {i["id"] for i in harness_items}
    assert set(trials.item_ids) == harness_ids and not harness_ids & {i["id"] for i in test_items}
    for ask in ([test_items[0]["id"]], [harness_items[0]["id"], test_items[1]["id"]]):
        with pytest.raises(ToolError, match=r"not training \(D_harness\) items: 'test-0000\d'"):
            trials.pick(None, ask)
    box = Toolbox(Workspace(tmp_path, tmp_path / "scratch", 1), ProposerTools(trials=trials))
    out = asyncio.run(box.call("run_candidate", {"code": GOOD, "items": [test_items[0]["id"]]}))
    assert out.startswith("error: not training (D_harness) items: 'test-00000'")
    assert policy.calls == 0 and trials.rollouts == 0  # refused before anything ran

    answer = json.loads(asyncio.run(box.call("run_candidate", {"code": GOOD, "k": 16})))
    assert answer["valid"] and answer["score"] == 1.0 and answer["rollouts_spent"] == len(harness_items)
    assert {e["item_id"] for e in answer["episodes"]} == harness_ids  # k=16 > |D_harness|: the split, no more
    assert trials.rollouts == len(harness_items) == policy.calls


@pytest.mark.timeout(120)
def test_the_static_gate_comes_first(harness_items, tmp_path: Path):
    policy = DigitSayerPolicyDouble()
    trials = _trials(harness_items, policy)
    probe = probe_harness(tmp_path, {"cwd": "os.getcwd()"}).read_text()
    answer = json.loads(asyncio.run(trials.run(probe, name="probe", k=2)))
    assert answer["valid"] is False and answer["rollouts_spent"] == 0
    assert any("[private-attribute]" in p for p in answer["problems"])
    assert policy.calls == 0 and trials.rollouts == 0


@pytest.mark.timeout(180)
def test_a_candidate_past_the_gate_still_runs_inside_the_sandbox(harness_items, tmp_path: Path, monkeypatch):
    gold, row = gold_file()
    monkeypatch.setenv("WHALE_PROBE_MARKER", "runtime-marker-91c2")
    attempts = {
        "gold": f"read_fd(os.open({str(gold)!r}, os.O_RDONLY))",
        "data": f"os.listdir({str(gold.parent)!r})",
        "checkout": f"read_fd(os.open({str(CHECKOUT / 'whale' / '__init__.py')!r}, os.O_RDONLY))",
        "parent": "read_fd(os.open('/proc/%d/environ' % os.getppid(), os.O_RDONLY))",
        "net": "socket.create_connection(('127.0.0.1', 9), timeout=2)",
        "marker": "os.environ.get('WHALE_PROBE_MARKER')",
    }
    probe = probe_harness(tmp_path, attempts).read_text()
    trials = _trials(harness_items, DigitSayerPolicyDouble(), check=lambda code: [])  # as if it slipped past
    answer = json.loads(asyncio.run(trials.run(probe, name="probe", k=1)))
    assert answer["valid"] and answer["rollouts_spent"] == 1
    first = answer["episodes"][0]["messages"][0]["content"]
    got = report(first)
    assert set(got) == set(attempts)
    assert {k: v for k, v in got.items() if k != "marker" and not v.startswith("BLOCKED")} == {}
    assert got["marker"] == "OK: None"  # the runtime's environment does not reach the harness
    assert row["problem"][:30] not in json.dumps(answer)


@pytest.mark.timeout(120)
def test_rollouts_are_counted_and_bounded_by_the_budget(harness_items, tmp_path: Path):
    policy = DigitSayerPolicyDouble()
    trials = _trials(harness_items, policy, budget=5)
    box = Toolbox(Workspace(tmp_path / "archive", tmp_path / "scratch", 2), ProposerTools(trials=trials))
    box.workspace.write_candidate("mine", GOOD)
    first = json.loads(asyncio.run(box.call("run_candidate", {"name": "mine", "k": 3})))
    assert first["rollouts_spent"] == 3 and first["rollouts_left"] == 2 and first["candidate"] == "mine"
    over = asyncio.run(box.call("run_candidate", {"name": "mine", "k": 3}))
    assert (
        over == "error: 3 rollouts asked for but only 2 of this iteration's 5 are left; ask for fewer items, or propose"
    )
    assert asyncio.run(box.call("run_candidate", {"name": "mine", "k": 17})).startswith("error: k must be an integer")
    assert asyncio.run(box.call("run_candidate", {"name": "nope"})).startswith("error: no candidate named 'nope'")
    assert asyncio.run(box.call("run_candidate", {})).startswith("error: give exactly one of")
    assert trials.rollouts == 3 == policy.calls
    assert trials.log == [
        {
            "candidate": "mine",
            "sha": trials.log[0]["sha"],
            "items": [i["id"] for i in harness_items[:3]],
            "rollouts": 3,
            "score": 1.0,
            "errors": 0,
            "error": None,
        }
    ]
    no_budget = Toolbox(box.workspace, ProposerTools(trials=_trials(harness_items, policy, budget=0)))
    assert "run_candidate" not in {s["function"]["name"] for s in no_budget.specs}
    assert asyncio.run(no_budget.call("run_candidate", {"name": "mine"})).startswith("error: run_candidate is not")
