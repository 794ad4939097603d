"""The search workload as the local runner launches it: a real ``python -m whale.workloads search`` child
process in an ``mh_only`` run of the synthetic domain with a tiny in-process model and a replay
proposer. The run succeeds, the phase's result and metrics are where the runner looks, and the
run's current harness is the accepted one."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.component.test_search_phase import GOOD, SYNTAX_ERROR
from whale.core import layout
from whale.core.spec import WhaleRunSpec
from whale.core.status import RunPhase
from whale.metaharness.archive import Archive
from whale.runner.local import LocalRunner
from whale.store import open_store


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_mh_only_run_through_the_local_runner(tmp_path: Path, tiny_qwen3_dir: Path):
    script = tmp_path / "proposals.json"
    script.write_text(
        json.dumps(
            {
                "iterations": {
                    "2": [
                        {"name": "extract", "code": GOOD, "rationale": "wrap the digit"},
                        {"name": "broken", "code": SYNTAX_ERROR},
                    ]
                }
            }
        )
    )
    spec = WhaleRunSpec.model_validate(
        {
            "domain": "synthetic",
            "condition": "mh_only",
            "model": {"name": str(tiny_qwen3_dir)},
            "schedule": {"mhOnlyIterations": 2},
            "rsft": {"sampling": {"maxResponseTokens": 8}},
            "data": {"harnessSize": 6},
            "evaluation": {"atStart": False, "afterHarnessPhase": False},
            "inference": {"backend": "transformers", "maxConcurrency": 8},
            "harnessSearch": {
                "proposalsPerIteration": 2,
                "smokeTestItems": 2,
                "proposer": {"backend": "replay", "script": str(script)},
            },
        }
    )
    store = open_store(str(tmp_path / "store"))
    runner = LocalRunner(
        name="mh",
        spec=spec,
        store=store,
        split_sizes={"weight": 10, "harness": 6, "test": 4},
        workdir=tmp_path / "work",
        poll_interval_s=0.1,
    )
    status = runner.run(max_seconds=240)
    log = (
        store.read_text(layout.log_key("mh", "c01-harness", 1))
        if store.exists(layout.log_key("mh", "c01-harness", 1))
        else ""
    )
    assert status.phase is RunPhase.SUCCEEDED, f"{status.message}\n{log[-3000:]}"
    assert status.completed_phases == ["c01-harness"]
    assert status.current_harness == layout.harness_key("mh", "c01-accepted")
    result = store.read_json(layout.result_key("mh", "c01-harness"))
    # mhOnlyIterations counts proposer iterations (the paper's): 2 of them after the incoming evaluation
    assert result["iterations"] == 3 and result["rollouts"] > 0
    assert store.read_text(result["acceptedHarness"]) == Archive(store, layout.archive_prefix("mh", 1)).code(
        result["acceptedCandidate"]
    )
    cands = {c.id: c for c in Archive(store, layout.archive_prefix("mh", 1)).candidates()}
    assert cands["i02-c2"].status.value == "invalid"
    assert len(store.read_jsonl(layout.metrics_key("mh", "c01-harness"))) == 3


#: a plumbing device, not a real harness: it answers from the task, so it scores 1.0 with any model
ORACLE = """from whale.harness.api import BaseHarness, env_action


class Harness(BaseHarness):
    SYSTEM_PROMPT = "Answer inside <answer></answer>."
    USER_TEMPLATE = "{question}"
    MAX_TURNS = 1
    MAX_FORMAT_RETRIES = 0

    def build_messages(self, task, state):
        state["digit"] = task["digit"]
        return super().build_messages(task, state)

    def parse_action(self, text, state):
        return env_action("<answer>" + str(state["digit"]) + "</answer>")
"""


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_whale_run_trains_the_next_weight_phase_under_the_accepted_harness(tmp_path: Path, tiny_qwen3_dir: Path):
    script = tmp_path / "proposals.json"
    script.write_text(json.dumps({"iterations": {"2": [{"name": "oracle", "code": ORACLE}]}}))
    spec = WhaleRunSpec.model_validate(
        {
            "domain": "synthetic",
            "condition": "whale",
            "model": {"name": str(tiny_qwen3_dir)},
            "schedule": {"totalSteps": 2, "weightStepsPerCycle": 1, "harnessIterationsPerCycle": 2},
            "rsft": {
                "promptsPerStep": 4,
                "rolloutsPerPrompt": 2,
                "miniBatchSize": 4,
                "microBatchSizePerGpu": 2,
                "learningRate": 1e-4,
                "sampling": {"maxResponseTokens": 8},
            },
            "data": {"harnessSize": 4, "weightSize": 16, "testSize": 2},
            "evaluation": {"atStart": False, "afterHarnessPhase": False, "samplesPerItem": 1, "maxItems": 2},
            "inference": {"backend": "transformers", "maxConcurrency": 8},
            "harnessSearch": {
                "proposalsPerIteration": 1,
                "smokeTestItems": 2,
                "proposer": {"backend": "replay", "script": str(script)},
                # the oracle answers from the task (not model text): only with the integrity walls off does it
                # keep its reward, which is what makes "trained under the accepted harness" visible here
                "integrity": {"action": "off", "acknowledgeOff": True},
            },
        }
    )
    store = open_store(str(tmp_path / "store"))
    runner = LocalRunner(
        name="wh",
        spec=spec,
        store=store,
        split_sizes={"weight": 16, "harness": 4, "test": 2},
        workdir=tmp_path / "work",
        poll_interval_s=0.1,
    )
    status = runner.run(max_seconds=360)
    logs = {
        p: store.read_text(layout.log_key("wh", p, 1))[-2000:]
        for p in ("c01-weight", "c01-harness", "c02-weight")
        if store.exists(layout.log_key("wh", p, 1))
    }
    assert status.phase is RunPhase.SUCCEEDED, f"{status.message}\n{logs}"
    assert status.completed_phases[:3] == ["c01-weight", "c01-harness", "c02-weight"]
    accepted = layout.harness_key("wh", "c01-accepted")
    assert store.read_json(layout.result_key("wh", "c01-harness"))["acceptedCandidate"] == "i02-c1"
    assert store.read_text(accepted) == ORACLE
    # the next weight phase was asked to train under the accepted harness, and did: its training
    # reward is the oracle's 1.0, where the first phase under h0 with a random model got ~0
    request = store.read_json(layout.request_key("wh", "c02-weight"))
    assert request["weight"]["harness"] == accepted
    first = store.read_jsonl(layout.metrics_key("wh", "c01-weight"))
    second = store.read_jsonl(layout.metrics_key("wh", "c02-weight"))
    assert second[-1]["rewardMean"] == 1.0 and first[-1]["rewardMean"] < 1.0
