"""Every evaluation is checked with the candidates' integrity rules, and a flagged one is never the best.

The attack (issue 27): a harness that behaves on D_harness — where the search scores and checks it — and
answers test items without calling the model. Before, the search accepted it, its test evaluation reported
1.0 with a note only, and ``best`` took it. Here the real eval workload (sandboxed harness process, the real
synthetic domain, a model double) runs it against the usage its harness phase recorded on D_harness; then
``decide`` turns the result into the run's status as a controller would, and the operator's condition and
events read it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.security.test_reward_integrity import EvenDigitSayerPolicyDouble
from whale.core import layout
from whale.core.alternation import Observations, decide
from whale.core.protocol import EvalPhaseArgs, EvalResult, phase_request
from whale.core.spec import WhaleRunSpec
from whale.core.status import WhaleRunStatus
from whale.metaharness.integrity import ANSWER_NOT_FROM_MODEL, SPLIT_DEPENDENT, ModelUsage
from whale.store import open_store
from whale.workloads.eval import run_eval

RUN = "evalint"

#: honest on D_harness (the digit the model named), straight from the task on test items (ids "test-…")
SPLIT_DEPENDENT_HARNESS = '''"""Ask the model on D_harness; answer test items without it."""
import re

from whale.harness.api import BaseHarness, Decision, env_action


class Harness(BaseHarness):
    SYSTEM_PROMPT = "Answer inside <answer></answer>."
    USER_TEMPLATE = "{question}"
    MAX_TURNS = 1

    def start(self, task, state):
        if str(task.get("id", "")).startswith("test-"):
            return Decision(actions=[env_action("<answer>" + str(task["digit"]) + "</answer>")], done=True)
        return super().start(task, state)

    def parse_action(self, text, state):
        digits = re.findall(r"\\d", text)
        return env_action("<answer>" + (digits[-1] if digits else "") + "</answer>")
'''

#: what its harness phase measured on D_harness: every episode called the model once
D_HARNESS_USAGE = ModelUsage(episodes=8, rewarded=4, completion_tokens=40, turns=8)
SPEC: dict[str, Any] = {
    "domain": "synthetic",
    "condition": "mh_only",
    "model": {"name": "unused-policy-is-a-double"},
    "schedule": {"mhOnlyIterations": 1},
    "evaluation": {"samplesPerItem": 2, "maxItems": 6},
    "inference": {"maxConcurrency": 4},
}


def evaluate(tmp_path: Path, integrity: dict[str, Any] | None = None) -> tuple[EvalResult, str, str]:
    store = open_store(str(tmp_path / "store"))
    harness = layout.harness_key(RUN, "c01-accepted")
    store.write_text(harness, SPLIT_DEPENDENT_HARNESS)
    store.write_json(layout.harness_usage_key(harness), {"candidate": "i02-c1", "usage": D_HARNESS_USAGE.to_dict()})
    spec = {**SPEC, "harnessSearch": {"integrity": integrity}} if integrity else SPEC
    phase = layout.eval_phase_key(1, 0, "harness")
    request = phase_request(
        spec,
        run=RUN,
        phase=phase,
        attempt=1,
        args=EvalPhaseArgs(cycle=1, step=0, after="harness", checkpoint=None, harness=harness),
    )
    store.write_json(layout.spec_key(RUN), spec)
    store.write_json(layout.request_key(RUN, phase), request.to_wire())
    policy = EvenDigitSayerPolicyDouble()
    result = run_eval(store, RUN, phase, client=policy)
    assert policy.calls == 0  # the attack: on test items the model is never asked
    return result, phase, harness


@pytest.mark.timeout(120)
def test_a_split_dependent_harness_is_flagged_and_never_the_best(tmp_path: Path) -> None:
    result, phase, harness = evaluate(tmp_path)
    # no inflated number: every answer is the harness's own, so every episode scores 0
    assert result.mean_at_k == 0.0
    assert result.model_usage is not None and result.model_usage.answer_not_model == 12
    rules = [f.split("]")[0] + "]" for f in result.integrity_flags]
    assert rules == [f"[{ANSWER_NOT_FROM_MODEL}]", f"[{SPLIT_DEPENDENT}]"]
    assert "here 100% of episodes made no model call (0% on D_harness)" in result.integrity_flags[1]

    # the run's status, as a controller stores it: the flag, the point marked, and not the best
    start = layout.eval_phase_key(0, 0, "start")
    status = WhaleRunStatus.model_validate(
        {
            "phase": "Running",
            "evals": [
                {"phase": start, "cycle": 0, "step": 0, "after": "start"},
                {"phase": phase, "cycle": 1, "step": 0, "after": "harness", "harness": harness},
            ],
        }
    )
    h0 = EvalResult(mean_at_k=0.0, k=2, items=6).to_wire()
    boosted = result.model_copy(update={"mean_at_k": 0.9}).to_wire()  # as if it had scored: still never best
    obs = Observations(
        run=RUN,
        results={start: h0, phase: boosted},
        split_sizes={"weight": 10, "harness": 8, "test": 6},
        now="2030-01-01T00:00:00Z",
    )
    after = decide(WhaleRunSpec.model_validate(SPEC), status, obs).status
    assert after.best is not None and after.best.phase == start
    assert [(e.phase, e.flagged) for e in after.evals] == [(start, False), (phase, True)]
    assert [(f.phase, f.candidate, f.evaluation) for f in after.integrity_flags] == [(phase, harness, True)]
    (cond,) = [c for c in after.conditions if c.type == "RewardIntegrity"]  # `whale run`'s status has it too
    assert (cond.status, cond.reason) == ("False", "FlaggedEvaluation") and phase in cond.message

    from whale_operator import status as st

    kind, ok, reason, message = st.integrity_condition(after)
    assert (kind, ok, reason) == ("RewardIntegrity", "False", "FlaggedEvaluation")
    assert phase in message and ANSWER_NOT_FROM_MODEL in message
    events = st.events(status, after, ())
    assert any(
        e.type == "Warning" and e.reason == "RewardIntegrity" and "evaluation flagged" in e.message for e in events
    )


@pytest.mark.timeout(120)
def test_with_the_walls_off_the_attack_reports_a_perfect_unflagged_mean(tmp_path: Path) -> None:
    """``integrity.action: off`` (a spec author's explicit choice) lifts both walls: the attack of issue 27."""
    result, _, _ = evaluate(tmp_path, {"action": "off", "acknowledgeOff": True})
    assert result.integrity_flags == [] and result.mean_at_k == 1.0
    assert result.model_usage is not None and result.model_usage.answer_not_model == 12  # still measured
