"""Normalised exact match of the last <answer> against any gold answer, on real benchmark rows."""

from __future__ import annotations

import json

import pytest

from search_qa.verifier import last_answer, normalize, score
from whale.domain import default_data_root

EVAL = default_data_root() / "search_qa" / "eval"


def _row(name: str, row_id: str) -> dict:
    with (EVAL / name).open() as fh:
        for line in fh:
            row = json.loads(line)
            if row["id"] == row_id:
                return row
    raise LookupError(row_id)


@pytest.mark.parametrize(
    ("text", "norm"),
    [
        ("The Beatles", "beatles"),
        ("  An   apple, a day!  ", "apple day"),
        ("U.S.A.", "usa"),
        ("Theatre", "theatre"),  # articles only as whole words
    ],
)
def test_normalize(text, norm):
    assert normalize(text) == norm


def test_last_answer_takes_the_last_complete_tag():
    assert last_answer("<answer>a</answer> then <answer> b </answer>") == "b"
    assert last_answer("<ANSWER>x</ANSWER>") == "x"
    assert last_answer("<answer>unclosed") is None
    assert last_answer("no tags") is None


def test_nq_row_with_several_golds():
    row = _row("nq_test.jsonl", "test_0")  # "when was the last time anyone was on the moon"
    golds = row["golden_answers"]
    assert "December 1972" in golds
    assert score("I think <answer>december, 1972.</answer>", golds) == 1.0
    assert score("<answer>14 December 1972 UTC</answer>", golds) == 1.0
    assert score("<answer>1972</answer>", golds) == 0.0
    assert score("December 1972", golds) == 0.0  # no tag, no credit


def test_bamboogle_and_popqa_rows():
    for name, row_id in [("bamboogle_test.jsonl", "test_0"), ("popqa_hipporag1000.jsonl", None)]:
        row = _row(name, row_id) if row_id else json.loads((EVAL / name).open().readline())
        gold = row["golden_answers"][0]
        assert score(f"<answer>{gold.upper()}</answer>", row["golden_answers"]) == 1.0
        assert score(f"<answer>The {gold}</answer>", row["golden_answers"]) == 1.0
        assert score(f"<answer>{gold} and more</answer>", row["golden_answers"]) == 0.0


def test_empty_answer_never_matches():
    assert score("<answer> </answer>", ["", "a"]) == 0.0


def test_tag_spam_earns_a_quarter_as_verl_search_r1():
    """verl's Search-R1 EM reward (the reference's default): a correct answer among more than 10 opening or 10
    closing answer tags earns 0.25; 10 of each is still full credit; a wrong answer stays 0 however tagged."""
    golds = ["Paris"]
    ten = "<answer>x</answer>" * 9 + "<answer>Paris</answer>"
    assert score(ten, golds) == 1.0
    assert score("<answer>x</answer>" + ten, golds) == 0.25
    assert score("</answer>" * 11 + "<answer>Paris</answer>", golds) == 0.25  # closing tags alone count
    assert score("<answer>" * 11 + "<answer>Paris</answer>", golds) == 0.0  # as verl: the match opens at the first
    assert score("<answer>x</answer>" * 11 + "<answer>Rome</answer>", golds) == 0.0
