"""Reward-integrity rules, pure: model usage from episodes, the flag rules against the incoming harness,
acceptance that refuses flagged candidates, what the archive summary, the phase result and the run's
status make of them."""

from __future__ import annotations

import pydantic
import pytest

from whale.core.alternation import MAX_STATUS_FLAGS_PER_PHASE, integrity_status
from whale.core.protocol import HarnessPhaseResult, IntegrityFlag
from whale.core.spec import HarnessSearch
from whale.core.status import IntegrityFlagStatus, WhaleRunStatus
from whale.harness.trace import Episode
from whale.metaharness.integrity import (
    REWARDED_WITHOUT_MODEL,
    SCORE_UP_TOKENS_DOWN,
    IntegrityAction,
    IntegrityPolicy,
    ModelUsage,
    integrity_flags,
    model_usage,
)
from whale.metaharness.records import (
    INCOMING_ID,
    Candidate,
    Status,
    best_scores_by_iteration,
    pick_best,
    summary,
    summary_markdown,
)

REJECT = IntegrityPolicy()
FLAG = IntegrityPolicy(IntegrityAction.FLAG)
OFF = IntegrityPolicy(IntegrityAction.OFF)


def ep(reward: float, turns: int, tokens: int) -> Episode:
    return Episode(episode_id="x#0", item_id="x", reward=reward, turns=turns, completion_tokens=tokens)


def test_model_usage_counts_episodes_objects_and_dicts_alike():
    episodes = [ep(1.0, 0, 0), ep(1.0, 2, 40), ep(0.0, 0, 0), ep(0.5, 1, 20)]
    usage = model_usage(episodes)
    assert usage == ModelUsage(
        episodes=4, rewarded=3, without_model=2, rewarded_without_model=1, completion_tokens=60, turns=3
    )
    assert model_usage(e.to_dict() for e in episodes) == usage
    assert usage.mean_completion_tokens == 15.0 and usage.mean_turns == 0.75
    assert usage.rewarded_without_model_share == pytest.approx(1 / 3)
    assert ModelUsage.from_dict(usage.to_dict()) == usage
    assert usage + usage == ModelUsage(8, 6, 4, 2, 120, 6)
    empty = model_usage([])
    assert empty.mean_completion_tokens == empty.mean_turns == empty.rewarded_without_model_share == 0.0


def test_rewarded_episode_without_a_model_call_is_flagged_even_without_a_baseline():
    usage = model_usage([ep(1.0, 0, 0), ep(1.0, 1, 30), ep(0.0, 1, 30)])
    flags = integrity_flags(usage, 2 / 3, baseline=None, baseline_score=None, policy=REJECT)
    assert flags == (
        f"[{REWARDED_WITHOUT_MODEL}] 1 of 2 rewarded episodes (50%) never called the model; "
        "1 of 3 episodes made no model call",
    )
    # an episode that skips the model but earns nothing is no evidence of cheating
    assert (
        integrity_flags(
            model_usage([ep(0.0, 0, 0), ep(1.0, 1, 5)]), 0.5, baseline=None, baseline_score=None, policy=REJECT
        )
        == ()
    )
    assert integrity_flags(usage, 2 / 3, baseline=None, baseline_score=None, policy=OFF) == ()


@pytest.mark.parametrize(
    ("score", "tokens", "ratio", "flagged"),
    [
        (0.8, 24.0, 0.25, True),  # better, with under a quarter of the incoming's 100 tokens per episode
        (0.8, 25.0, 0.25, False),  # exactly at the ratio: not below it
        (0.5, 10.0, 0.25, False),  # no better than the incoming: a cheaper harness is fine
        (0.4, 10.0, 0.25, False),  # worse
        (0.8, 40.0, 0.5, True),  # a stricter spec ratio
        (0.8, 0.0, 0.0, False),  # ratio 0 turns the rule off
    ],
)
def test_better_score_on_a_fraction_of_the_tokens_is_flagged(score, tokens, ratio, flagged):
    baseline = ModelUsage(episodes=10, rewarded=5, completion_tokens=1000, turns=10)
    usage = ModelUsage(episodes=10, rewarded=8, completion_tokens=int(tokens * 10), turns=10)
    flags = integrity_flags(
        usage, score, baseline=baseline, baseline_score=0.5, policy=IntegrityPolicy(min_token_ratio=ratio)
    )
    assert bool(flags) is flagged
    if flagged:
        assert flags[0].startswith(f"[{SCORE_UP_TOKENS_DOWN}] score 0.8000 > incoming 0.5000")
        assert f"< {ratio:g} x incoming 100.0" in flags[0]


def test_no_token_rule_when_the_backend_reports_no_tokens():
    baseline = ModelUsage(episodes=10, rewarded=5, completion_tokens=0, turns=10)
    usage = ModelUsage(episodes=10, rewarded=8, completion_tokens=0, turns=10)
    assert integrity_flags(usage, 0.8, baseline=baseline, baseline_score=0.5, policy=REJECT) == ()


def test_policy_bounds():
    with pytest.raises(ValueError, match="min_token_ratio"):
        IntegrityPolicy(min_token_ratio=1.5)
    assert REJECT.refuses_flagged and not FLAG.refuses_flagged and not OFF.action.checks


def cand(cid, it, score, turns=1.0, flags=(), status=Status.SCORED):
    return Candidate(id=cid, iteration=it, status=status, score=score, mean_turns=turns, integrity_flags=tuple(flags))


def test_acceptance_skips_flagged_candidates_under_reject_only():
    cands = [cand(INCOMING_ID, 1, 0.2), cand("i02-c1", 2, 0.5), cand("i02-c2", 2, 1.0, 0.0, ["[r] x"])]
    assert pick_best(cands, refuse_flagged=True).id == "i02-c1"
    assert pick_best(cands).id == "i02-c2"
    assert best_scores_by_iteration(cands, 2, refuse_flagged=True) == [0.2, 0.5]
    assert best_scores_by_iteration(cands, 2) == [0.2, 1.0]
    # the incoming harness stays the fallback whatever its flags
    flagged_incoming = [cand(INCOMING_ID, 1, 0.9, flags=["[r] x"]), cand("i02-c2", 2, 1.0, flags=["[r] y"])]
    assert pick_best(flagged_incoming, refuse_flagged=True).id == INCOMING_ID


def test_summary_and_markdown_show_the_flags_to_the_proposer():
    cands = [cand(INCOMING_ID, 1, 0.2), cand("i02-c2", 2, 1.0, 0.0, ["[rewarded-without-model] 8 of 8"])]
    data = summary(cands, refuse_flagged=True)
    assert data["best"] == INCOMING_ID and data["flagged"] == ["i02-c2"] and data["flagged_refused"] is True
    assert data["candidates"][1]["integrity_flags"] == ["[rewarded-without-model] 8 of 8"]
    md = summary_markdown(cands, refuse_flagged=True)
    assert (
        "| i02-c2 | scored | 1.0000 | 0.00 |  | 0 | REFUSED (reward without the model): [rewarded-without-model]" in md
    )
    assert "Flagged for reward integrity: i02-c2" in md and "never accepted" in md
    assert "flagged (reward without the model)" in summary_markdown(cands)


def test_candidate_round_trip_keeps_usage_and_flags():
    c = Candidate(
        id="i02-c1",
        iteration=2,
        status=Status.SCORED,
        score=1.0,
        usage=ModelUsage(4, 4, 4, 4, 0, 0),
        integrity_flags=("[a] b", "[c] d"),
    )
    data = c.to_dict()
    assert data["usage"]["without_model"] == 4 and data["usage"]["mean_completion_tokens"] == 0.0
    assert data["integrity_flags"] == ["[a] b", "[c] d"]
    assert Candidate.from_dict(data) == c
    # an archive written before these fields existed still loads
    old = {k: v for k, v in data.items() if k not in ("usage", "integrity_flags")}
    assert Candidate.from_dict(old).usage is None and Candidate.from_dict(old).integrity_flags == ()


def test_status_entries_from_a_phase_result_are_bounded_accepted_first():
    flags = [IntegrityFlag(candidate=f"i{i:02d}-c1", reasons=[f"[r] {i}"]) for i in range(2, 40)]
    flags.append(IntegrityFlag(candidate="i40-c1", reasons=["[r] last"], accepted=True))
    result = HarnessPhaseResult(
        accepted_harness="h",
        accepted_candidate="i40-c1",
        accepted_score=1.0,
        iterations=40,
        rollouts=1,
        integrity_flags=flags,
    )
    entries = integrity_status("c01-harness", result)
    assert len(entries) == MAX_STATUS_FLAGS_PER_PHASE
    assert entries[0] == IntegrityFlagStatus(
        phase="c01-harness", candidate="i40-c1", accepted=True, reasons=["[r] last"]
    )
    status = WhaleRunStatus(integrity_flags=list(entries))
    assert (
        status.integrity_flags[0].accepted
        and WhaleRunStatus.model_validate(status.model_dump(mode="json", by_alias=True)) == status
    )
    assert HarnessPhaseResult.model_validate(result.to_wire()) == result


def test_spec_policy_defaults_and_errors():
    hs = HarnessSearch()
    assert hs.integrity.action == "reject" and hs.integrity.min_token_ratio == 0.25
    assert (
        HarnessSearch.model_validate({"integrity": {"action": "flag", "minTokenRatio": 0.1}}).integrity.action == "flag"
    )
    with pytest.raises(pydantic.ValidationError, match="integrity.action"):
        HarnessSearch.model_validate({"integrity": {"action": "ignore"}})
    with pytest.raises(pydantic.ValidationError, match="minTokenRatio"):
        HarnessSearch.model_validate({"integrity": {"minTokenRatio": 2}})
