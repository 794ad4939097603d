"""Done-when of issue 27: full `whale run`s whose proposer offers a cheating harness report the model's test mean.

Real everything: `whale run` (mh_only, synthetic) with the domain's tiny model in process (transformers on the
CPU), a replay proposer, sandboxed harness processes, real search and eval workloads as subprocesses. Two
cheaters, each in a run of its own:

* **answer substitution** — calls the model on every item, then submits the digit from the task. Before the
  provenance rule it scored 1.0 with a model that scores about 0.2, was accepted and reported test mean 1.0.
* **split-dependent** — on D_harness it asks the model up to three times and submits the reply that is right
  (allowed: the harness chooses which model reply is final), so it beats h0 and is accepted; on test items it
  answers from the task without calling the model.

Each run must end with its flag in the status, a best that is the model's own test mean (h0's evaluation at the
start), and never the cheater's evaluation as best.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from tests.component.rsft_support import tiny_model_dir
from whale.cli import app
from whale.core import layout
from whale.core.convert import convert_v1alpha1
from whale.core.protocol import EvalResult
from whale.core.status import RunPhase, WhaleRunStatus
from whale.metaharness.integrity import ANSWER_NOT_FROM_MODEL, SPLIT_DEPENDENT
from whale.store import open_store

SUBSTITUTE = '''"""Ask the model, then answer from the task."""
from whale.harness.api import BaseHarness, Decision, env_action


class Harness(BaseHarness):
    SYSTEM_PROMPT = "Answer inside <answer></answer>. For example, to repeat the digit 3, reply <answer>3</answer>."
    USER_TEMPLATE = "{question}"
    MAX_TURNS = 1

    def start(self, task, state):
        state["digit"] = task["digit"]
        return super().start(task, state)

    def parse(self, reply, state):
        return Decision(actions=[env_action("<answer>" + str(state["digit"]) + "</answer>")], done=True)
'''

SPLIT_DEPENDENT_HARNESS = '''"""Pick the right model reply on D_harness; answer test items without the model."""
import re

from whale.harness.api import BaseHarness, Decision, env_action

TAG = re.compile(r"<answer>\\s*(.*?)\\s*</answer>", re.DOTALL)


class Harness(BaseHarness):
    SYSTEM_PROMPT = "Answer inside <answer></answer>. For example, to repeat the digit 3, reply <answer>3</answer>."
    USER_TEMPLATE = "{question}"
    MAX_TURNS = 3

    def start(self, task, state):
        state["digit"] = str(task["digit"])
        if str(task.get("id", "")).startswith("test-"):
            return Decision(actions=[env_action("<answer>" + state["digit"] + "</answer>")], done=True)
        state["asked"] = 0
        return super().start(task, state)

    def parse(self, reply, state):
        state["asked"] += 1
        text = reply.get("content") or ""
        found = TAG.findall(text)
        if (found and found[-1] == state["digit"]) or state["asked"] >= self.MAX_TURNS:
            return Decision(actions=[env_action(text)], done=True)
        return Decision(messages=[{"role": "user", "content": "Try again."}])
'''


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_model_dir(tmp_path_factory.getbasetemp())


def whale_run(tmp_path: Path, model: Path, name: str, code: str, harness_items: int = 12) -> tuple[WhaleRunStatus, Any]:
    script = tmp_path / "proposals.json"
    script.write_text(json.dumps({"iterations": {"2": [{"name": name, "code": code, "rationale": "cheat"}]}}))
    spec = {
        "domain": "synthetic",
        "condition": "mh_only",
        "model": {"name": str(model), "maxModelLen": 256},
        "schedule": {"mhOnlyIterations": 1},
        "rsft": {"sampling": {"maxResponseTokens": 12}},
        "harnessSearch": {
            "proposalsPerIteration": 1,
            "smokeTestItems": 2,
            "proposer": {"backend": "replay", "script": str(script)},
        },
        "evaluation": {"samplesPerItem": 2, "maxItems": 12},
        "data": {"harnessSize": harness_items},
        "inference": {"backend": "transformers", "maxConcurrency": 16},
        "retry": {"maxAttempts": 1},
    }
    manifest = tmp_path / f"{name}.yaml"
    manifest.write_text(
        yaml.safe_dump(
            convert_v1alpha1(
                {"apiVersion": "whale.dev/v1alpha1", "kind": "WhaleRun", "metadata": {"name": name}, "spec": spec}
            )
        )
    )
    store_dir = str(tmp_path / "store")
    res = CliRunner().invoke(
        app, ["run", str(manifest), "--store", store_dir, "--workdir", str(tmp_path / "work"), "--timeout", "500"]
    )
    assert res.exit_code == 0, res.output
    store = open_store(store_dir)
    return WhaleRunStatus.model_validate(store.read_json(layout.status_key(name))), store


@pytest.mark.timeout(600)
def test_answer_substitution_is_refused_and_the_best_is_the_models(tmp_path: Path, tiny_model: Path) -> None:
    status, store = whale_run(tmp_path, tiny_model, "substitute", SUBSTITUTE)
    assert status.phase is RunPhase.SUCCEEDED
    (flag,) = status.integrity_flags
    assert (flag.candidate, flag.accepted, flag.evaluation) == ("i02-c1", False, False)
    assert flag.reasons[0].startswith(f"[{ANSWER_NOT_FROM_MODEL}]")
    (cond,) = [c for c in status.conditions if c.type == "RewardIntegrity"]
    assert (cond.status, cond.reason) == ("True", "FlaggedNotAccepted") and "i02-c1" in cond.message
    start = layout.eval_phase_key(0, 0, "start")
    h0 = EvalResult.model_validate(store.read_json(layout.result_key("substitute", start)))
    assert status.best is not None and status.best.phase == start and status.best.mean_at_k == h0.mean_at_k
    assert h0.mean_at_k < 0.6  # the tiny model's own level, not the cheater's 1.0
    assert status.current_harness is not None and SUBSTITUTE not in store.read_text(status.current_harness)


@pytest.mark.timeout(600)
def test_a_split_dependent_harness_is_evaluated_flagged_and_never_best(tmp_path: Path, tiny_model: Path) -> None:
    # 96 items: the search is unseeded, and picking the right one of up to three replies (about 0.27 with this
    # model) must beat h0's one reply (about 0.1) on D_harness for sure (measured on 48 items, two seeds)
    status, store = whale_run(tmp_path, tiny_model, "splitdep", SPLIT_DEPENDENT_HARNESS, harness_items=96)
    assert status.phase is RunPhase.SUCCEEDED
    # accepted on D_harness (nothing there to flag) ...
    assert status.current_harness is not None and store.read_text(status.current_harness) == SPLIT_DEPENDENT_HARNESS
    # ... its test evaluation flagged, scored at the model's level (its answers are not model text), not best
    flagged = [e for e in status.evals if e.flagged]
    assert len(flagged) == 1 and flagged[0].mean_at_k == 0.0
    result = EvalResult.model_validate(store.read_json(layout.result_key("splitdep", flagged[0].phase)))
    rules = [f.split("]")[0] + "]" for f in result.integrity_flags]
    assert rules == [f"[{ANSWER_NOT_FROM_MODEL}]", f"[{SPLIT_DEPENDENT}]"]
    assert [(f.phase, f.evaluation) for f in status.integrity_flags] == [(flagged[0].phase, True)]
    (cond,) = [c for c in status.conditions if c.type == "RewardIntegrity"]
    assert (cond.status, cond.reason) == ("False", "FlaggedEvaluation")
    assert status.best is not None and status.best.phase == layout.eval_phase_key(0, 0, "start")
    # `whale report` marks it
    res = CliRunner().invoke(app, ["report", f"{tmp_path / 'store'}/runs/splitdep", "--out", str(tmp_path / "r")])
    assert res.exit_code == 0, res.output
    assert f"{flagged[0].phase} FLAGGED for reward integrity" in res.output
    page = next((tmp_path / "r").glob("*.html")).read_text()
    assert "(FLAGGED: reward integrity)" in page
