"""Pure archive rules: acceptance, per-iteration best scores, summaries, record round trips."""

import pytest

from whale.metaharness.records import (
    INCOMING_ID,
    Candidate,
    Status,
    best_scores_by_iteration,
    candidate_id,
    code_hash,
    pick_best,
    summary,
    summary_markdown,
)


def cand(cid, it, score=None, turns=None, status=Status.SCORED, **kw):
    return Candidate(id=cid, iteration=it, status=status, score=score, mean_turns=turns, **kw)


def test_best_score_wins_then_fewer_turns_then_earliest():
    cands = [
        cand(INCOMING_ID, 1, 0.5, 2.0),
        cand("i02-c1", 2, 0.7, 3.0),
        cand("i02-c2", 2, 0.7, 2.5),
        cand("i03-c1", 3, 0.7, 2.5),
        cand("i03-c2", 3, 0.9, None, status=Status.SMOKE_FAILED),
    ]
    assert pick_best(cands).id == "i02-c2"
    assert pick_best([cand(INCOMING_ID, 1, 0.5, 2.0), cand("i02-c1", 2, 0.5, 2.0)]).id == INCOMING_ID


def test_duplicates_and_unscored_never_win():
    cands = [cand(INCOMING_ID, 1, 0.2, 1.0), cand("i02-c1", 2, 0.9, 1.0, status=Status.DUPLICATE, same_as=INCOMING_ID)]
    assert pick_best(cands).id == INCOMING_ID
    assert pick_best([cand("i02-c1", 2, status=Status.INVALID)]) is None


def test_best_scores_by_iteration_is_monotone_archive_best():
    cands = [cand(INCOMING_ID, 1, 0.25, 1.0), cand("i02-c1", 2, 0.1, 1.0), cand("i03-c1", 3, 0.5, 1.0)]
    assert best_scores_by_iteration(cands, 4) == [0.25, 0.25, 0.5, 0.5]


def test_record_round_trip_and_ids():
    c = cand("i02-c3", 2, 0.5, 1.5, rationale="why", sha=code_hash("x = 1\n"), rollouts=9)
    assert Candidate.from_dict(c.to_dict()) == c
    assert c.to_dict()["status"] == "scored"
    assert candidate_id(3, 2) == "i03-c2"
    with pytest.raises(ValueError, match="1-based"):
        candidate_id(0, 1)
    assert code_hash("x = 1\n") == code_hash("  x = 1")
    assert Status.PENDING.final is False and Status.INVALID.final


def test_summary_rows_and_markdown():
    cands = [
        cand("i02-c1", 2, None, None, status=Status.INVALID, error="harness.py:3: [syntax] bad | worse"),
        cand(INCOMING_ID, 1, 0.25, 1.0),
    ]
    data = summary(cands)
    assert data["best"] == INCOMING_ID and [r["id"] for r in data["candidates"]] == [INCOMING_ID, "i02-c1"]
    md = summary_markdown(cands)
    assert "| i01-incoming | scored | 0.2500 | 1.00 |" in md
    assert "[syntax] bad / worse" in md  # table-safe
