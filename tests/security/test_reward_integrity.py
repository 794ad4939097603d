"""Reward integrity, the loop's second line against a harness that scores without the model.

A real harness phase (search workload, sandboxed harness processes, the synthetic domain, a replay
proposer) where the proposer offers an honest harness and a cheating one that answers from the task
in ``start`` and never calls the model. The cheater passes validation and the smoke test and scores
higher; the attack is that it gets accepted. The loop must flag it, refuse it by default, accept it
under ``action: flag`` only with the flag in the phase result and in the run's status, and an
evaluation of such a harness must show, per item, that the model was never called.

Since the answer-provenance rule (``whale.harness.provenance``; tests/security/test_answer_provenance.py),
the real synthetic domain scores such an answer 0 before these rules see it (the last test here). The rules
below stay the line for a domain whose environment declares no graded answer, so the phases here run on
:class:`UndeclaredAnswerSyntheticDouble`, the synthetic domain with that declaration removed.
"""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path
from typing import Any

import pytest

from synthetic import Synthetic, SyntheticEnvironment
from tests.component.test_search_phase import GOOD
from tests.fixtures.proposer_double import DigitSayerPolicyDouble
from whale.core import layout
from whale.core.alternation import Observations, decide
from whale.core.protocol import EvalPhaseArgs, HarnessPhaseArgs, HarnessPhaseResult, phase_request
from whale.core.spec import WhaleRunSpec
from whale.core.status import WhaleRunStatus
from whale.domain import StepResult
from whale.inference.base import ChatResult, Completion, SamplingParams
from whale.metaharness.archive import Archive
from whale.metaharness.evaluate import EvalSettings
from whale.metaharness.integrity import ANSWER_NOT_FROM_MODEL, REWARDED_WITHOUT_MODEL, SCORE_UP_TOKENS_DOWN
from whale.metaharness.records import INCOMING_ID, Candidate, Status
from whale.store import Store, open_store
from whale.workloads.eval import run_eval
from whale.workloads.search import run_search

RUN = "integrity"
PHASE = layout.harness_phase_key(1)
HARNESS_ITEMS = 8

#: answers from the task itself, in ``start``; the model is never called (turns == 0). Valid Python,
#: allowed imports, the right hooks: validation and the smoke test cannot tell it from a real harness.
CHEATER = '''"""Answer straight away: no model turn."""
from whale.harness.api import BaseHarness, Decision, env_action


class Harness(BaseHarness):
    SYSTEM_PROMPT = "Answer inside <answer></answer>."
    USER_TEMPLATE = "{question}"
    MAX_TURNS = 1
    MAX_FORMAT_RETRIES = 0

    def start(self, task, state):
        return Decision(actions=[env_action("<answer>" + str(task["digit"]) + "</answer>")], done=True)
'''


class EvenDigitSayerPolicyDouble(DigitSayerPolicyDouble):
    """Names the digit ("The digit is 4.") only when it is even; otherwise "I do not know." — so an
    honest harness that extracts the digit scores the share of even digits, below 1.0."""

    model = "even-digit-sayer-double"

    async def chat(
        self,
        messages: list[dict[str, Any]],
        sampling: SamplingParams,
        n: int = 1,
        tools: list[dict[str, Any]] | None = None,
    ) -> ChatResult:
        self.calls += 1
        users = [m for m in messages if m.get("role") == "user"]
        found = re.findall(r"\d", users[-1]["content"]) if users else []
        text = f"The digit is {found[-1]}." if found and int(found[-1]) % 2 == 0 else "I do not know."
        completions = [Completion({"role": "assistant", "content": text}, "stop", 5) for _ in range(n)]
        return ChatResult(completions, prompt_tokens=10, completion_tokens=5 * n)


class _UndeclaredAnswerEnvDouble(SyntheticEnvironment):
    def step(self, action: Any) -> StepResult:
        return dataclasses.replace(super().step(action), graded=())


class UndeclaredAnswerSyntheticDouble(Synthetic):
    """The synthetic domain whose environment declares no graded answer (a plugin without
    ``StepResult.graded``): the provenance rule has nothing to check there; the model-usage rules do."""

    def make_env(self, item: dict[str, Any]) -> SyntheticEnvironment:
        return _UndeclaredAnswerEnvDouble(item)


SETTINGS = EvalSettings(
    smoke_items=2, smoke_hook_timeout_s=3.0, smoke_timeout_s=30, candidate_timeout_s=60, max_concurrency=8
)


def _spec(script: Path, integrity: dict[str, Any] | None) -> dict[str, Any]:
    hs: dict[str, Any] = {
        "proposalsPerIteration": 2,
        "smokeTestItems": 2,
        "proposer": {"backend": "replay", "script": str(script)},
    }
    if integrity is not None:
        hs["integrity"] = integrity
    return {
        "domain": "synthetic",
        "condition": "mh_only",
        "model": {"name": "unused-policy-is-a-double"},
        "schedule": {"mhOnlyIterations": 2},
        "data": {"harnessSize": HARNESS_ITEMS},
        "evaluation": {"atStart": False, "afterHarnessPhase": False},
        "harnessSearch": hs,
    }


def _run_phase(
    tmp_path: Path, integrity: dict[str, Any] | None, domain: Synthetic | None = None
) -> tuple[Store, dict[str, Any], HarnessPhaseResult]:
    script = tmp_path / "proposals.json"
    script.write_text(
        json.dumps(
            {
                "iterations": {
                    "2": [
                        {"name": "extract_digit", "code": GOOD, "rationale": "extract the digit the model names"},
                        {"name": "answer_directly", "code": CHEATER, "rationale": "skip the model"},
                    ]
                }
            }
        )
    )
    spec = _spec(script, integrity)
    store = open_store(str(tmp_path / "store"))
    request = phase_request(
        spec,
        run=RUN,
        phase=PHASE,
        attempt=1,
        args=HarnessPhaseArgs(
            cycle=1, incoming_harness=None, checkpoint=None, step=0, iterations=2, archive=layout.archive_prefix(RUN, 1)
        ),
    )
    store.write_json(layout.spec_key(RUN), spec)
    store.write_json(layout.request_key(RUN, PHASE), request.to_wire())
    result = run_search(
        store,
        RUN,
        PHASE,
        domain=domain or UndeclaredAnswerSyntheticDouble(),
        client=EvenDigitSayerPolicyDouble(),
        settings=SETTINGS,
    )
    assert HarnessPhaseResult.model_validate(store.read_json(layout.result_key(RUN, PHASE))) == result
    return store, spec, result


def _candidates(store: Store) -> dict[str, Candidate]:
    return {c.id: c for c in Archive(store, layout.archive_prefix(RUN, 1)).candidates()}


def _status_after(spec: dict[str, Any], result: HarnessPhaseResult) -> WhaleRunStatus:
    """What decide() makes of the phase's result: the run's status as a controller would store it."""
    obs = Observations(
        run=RUN,
        results={PHASE: result.to_wire()},
        split_sizes={"weight": 10, "harness": HARNESS_ITEMS, "test": 4},
        now="2030-01-01T00:00:00Z",
    )
    return decide(WhaleRunSpec.model_validate(spec), WhaleRunStatus(), obs).status


@pytest.mark.timeout(240)
def test_a_harness_that_scores_without_the_model_is_flagged_and_refused(tmp_path: Path):
    store, spec, result = _run_phase(tmp_path, integrity=None)  # the default policy: reject
    c = _candidates(store)
    honest, cheater = c["i02-c1"], c["i02-c2"]
    # the attack works as far as scoring goes: it passed the gate and beat the honest harness
    assert cheater.status is Status.SCORED and cheater.score == 1.0
    assert honest.status is Status.SCORED and 0.0 < honest.score < 1.0
    assert c[INCOMING_ID].score == 0.0
    # ... but the numbers give it away, and they are in its meta.json
    assert cheater.usage.episodes == HARNESS_ITEMS and cheater.usage.turns == 0
    assert cheater.usage.rewarded_without_model == cheater.usage.rewarded == HARNESS_ITEMS
    assert cheater.usage.completion_tokens == 0
    # both rules fire: rewarded episodes without a model call, and a better score on a fraction of the tokens
    assert [f.split("]")[0] + "]" for f in cheater.integrity_flags] == [
        f"[{REWARDED_WITHOUT_MODEL}]",
        f"[{SCORE_UP_TOKENS_DOWN}]",
    ]
    assert "8 of 8 rewarded episodes (100%) never called the model" in cheater.integrity_flags[0]
    assert "per episode 0.0 < 0.25 x incoming 5.0" in cheater.integrity_flags[1]
    meta = store.read_json(Archive(store, layout.archive_prefix(RUN, 1)).candidate_key("i02-c2", "meta.json"))
    assert meta["integrity_flags"] == list(cheater.integrity_flags) and meta["usage"]["without_model"] == HARNESS_ITEMS
    assert not honest.integrity_flags and honest.usage.without_model == 0
    assert honest.usage.mean_completion_tokens == 5.0

    # not accepted: the honest harness is
    assert result.accepted_candidate == "i02-c1" and result.accepted_score == honest.score
    assert store.read_text(result.accepted_harness) == GOOD
    assert [(f.candidate, f.accepted) for f in result.integrity_flags] == [("i02-c2", False)]
    assert result.integrity_flags[0].episodes_without_model == HARNESS_ITEMS
    assert result.integrity_flags[0].reasons == list(cheater.integrity_flags)
    # the iteration metrics (the adaptive rule's input) never count it as the archive's best
    lines = store.read_jsonl(layout.metrics_key(RUN, PHASE))
    assert lines[-1]["bestCandidate"] == "i02-c1" and lines[-1]["bestScore"] == honest.score
    flagged = {s["id"]: s["integrityFlags"] for s in lines[-1]["candidates"]}
    assert flagged["i02-c2"] and not flagged["i02-c1"]

    # the proposer's view of the archive says it was refused, and why
    md = store.read_text(f"{layout.archive_prefix(RUN, 1)}/summary.md")
    assert "Best so far: i02-c1" in md
    assert re.search(
        r"\| i02-c2 \| scored \| 1\.0000 \| 0\.00 \| 0\.0 \| \d+ \| REFUSED \(reward without the model\)", md
    )
    summary = store.read_json(f"{layout.archive_prefix(RUN, 1)}/summary.json")
    assert summary["best"] == "i02-c1" and summary["flagged"] == ["i02-c2"]

    # the run's status carries the flag; the run goes on with the honest harness
    status = _status_after(spec, result)
    assert status.current_harness == result.accepted_harness
    assert [(f.phase, f.candidate, f.accepted) for f in status.integrity_flags] == [(PHASE, "i02-c2", False)]
    assert status.integrity_flags[0].reasons[0].startswith(f"[{REWARDED_WITHOUT_MODEL}]")


@pytest.mark.timeout(240)
def test_action_flag_accepts_the_cheater_but_the_result_and_status_show_it(tmp_path: Path):
    store, spec, result = _run_phase(tmp_path, integrity={"action": "flag"})
    assert result.accepted_candidate == "i02-c2" and result.accepted_score == 1.0
    assert store.read_text(result.accepted_harness) == CHEATER
    assert [(f.candidate, f.accepted) for f in result.integrity_flags] == [("i02-c2", True)]
    assert "Best so far: i02-c2" in store.read_text(f"{layout.archive_prefix(RUN, 1)}/summary.md")
    status = _status_after(spec, result)
    assert [(f.candidate, f.accepted) for f in status.integrity_flags] == [("i02-c2", True)]
    assert status.current_harness == result.accepted_harness

    # the operator's conditions and events read the same status field
    from whale_operator import status as st

    kind, ok, reason, message = st.integrity_condition(status)
    assert (kind, ok, reason) == ("RewardIntegrity", "False", "FlaggedHarnessAccepted")
    assert "i02-c2 (c01-harness)" in message and REWARDED_WITHOUT_MODEL in message
    events = st.events(WhaleRunStatus(), status, ())
    assert any(e.type == "Warning" and e.reason == "RewardIntegrity" and "ACCEPTED" in e.message for e in events)


@pytest.mark.timeout(240)
def test_action_off_measures_but_flags_nothing(tmp_path: Path):
    store, _, result = _run_phase(tmp_path, integrity={"action": "off", "acknowledgeOff": True})
    cheater = _candidates(store)["i02-c2"]
    assert cheater.usage.rewarded_without_model == HARNESS_ITEMS and not cheater.integrity_flags
    assert result.accepted_candidate == "i02-c2" and result.integrity_flags == []


@pytest.mark.timeout(120)
def test_an_eval_of_a_harness_that_skips_the_model_shows_it_per_item(tmp_path: Path):
    store = open_store(str(tmp_path / "store"))
    store.write_text(layout.harness_key(RUN, "cheater"), CHEATER)
    phase = layout.eval_phase_key(1, 0, "harness")
    spec = {
        "domain": "synthetic",
        "condition": "mh_only",
        "model": {"name": "unused-policy-is-a-double"},
        "evaluation": {"samplesPerItem": 2, "maxItems": 5},
        "inference": {"maxConcurrency": 4},
    }
    request = phase_request(
        spec,
        run=RUN,
        phase=phase,
        attempt=1,
        args=EvalPhaseArgs(
            cycle=1, step=0, after="harness", checkpoint=None, harness=layout.harness_key(RUN, "cheater")
        ),
    )
    store.write_json(layout.spec_key(RUN), spec)
    store.write_json(layout.request_key(RUN, phase), request.to_wire())
    policy = EvenDigitSayerPolicyDouble()
    result = run_eval(store, RUN, phase, domain=UndeclaredAnswerSyntheticDouble(), client=policy)

    assert result.mean_at_k == 1.0 and policy.calls == 0  # a perfect score, and the model never asked
    items = store.read_jsonl(layout.eval_items_key(RUN, phase))
    assert len(items) == 5
    for item in items:
        assert item["episodes_without_model"] == item["rewarded_without_model"] == 2
        assert item["mean_completion_tokens"] == 0.0 and item["mean_turns"] == 0.0
    usage = result.model_usage
    assert usage is not None
    assert (usage.episodes, usage.episodes_without_model, usage.items_answered_without_model) == (10, 10, 5)
    assert usage.mean_completion_tokens == 0.0
    assert any("5 of 5 items were answered without calling the model" in n for n in result.notes)


@pytest.mark.timeout(240)
def test_on_a_domain_that_declares_its_graded_answer_the_cheater_scores_zero(tmp_path: Path):
    """The real synthetic domain: the answer the cheater submits is in no model reply, so it scores 0,
    is flagged by the provenance rule and is refused, even under ``action: flag`` (the honest harness wins)."""
    store, spec, result = _run_phase(tmp_path, integrity={"action": "flag"}, domain=Synthetic())
    cheater = _candidates(store)["i02-c2"]
    assert cheater.status is Status.SCORED and cheater.score == 0.0
    assert cheater.usage.answer_not_model == HARNESS_ITEMS and cheater.usage.rewarded == 0
    assert [f.split("]")[0] + "]" for f in cheater.integrity_flags] == [f"[{ANSWER_NOT_FROM_MODEL}]"]
    assert result.accepted_candidate == "i02-c1"
    status = _status_after(spec, result)
    assert [(f.candidate, f.accepted) for f in status.integrity_flags] == [("i02-c2", False)]
