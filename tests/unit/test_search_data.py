"""Search-QA splits: 100 per available benchmark (TriviaQA reported missing), disjoint train splits."""

from __future__ import annotations

import collections

import pytest

from search_qa.data import BENCHMARKS, MISSING_BENCHMARKS, DataError, load_splits, make_splits, to_item
from search_qa.verifier import normalize
from whale.domain import default_data_root

ROOT = default_data_root()


def test_real_splits():
    s = load_splits(ROOT, seed=0)
    per = collections.Counter(r["subset"] for r in s["test"])
    assert MISSING_BENCHMARKS == ("triviaqa",)
    assert set(per) == {b for b, f in BENCHMARKS.items() if f}
    assert set(per.values()) == {100}
    assert len(s["harness"]) == 256
    w = {r["id"] for r in s["weight"]}
    assert not w & {r["id"] for r in s["harness"]}
    assert len(w) > 15000
    test_q = {normalize(r["question"]) for r in s["test"]}
    assert not test_q & {normalize(r["question"]) for r in s["weight"] + s["harness"]}
    row = s["test"][0]
    assert row["id"].startswith(row["subset"] + "/") and row["golden_answers"]


def test_test_size_is_per_benchmark_and_seeded():
    a = load_splits(ROOT, seed=0, test_size=5, harness_size=8, weight_size=50)
    b = load_splits(ROOT, seed=1, test_size=5, harness_size=8, weight_size=50)
    assert len(a["test"]) == 30 and len(a["weight"]) == 50 and len(a["harness"]) == 8
    assert [r["id"] for r in a["test"]] != [r["id"] for r in b["test"]]
    assert [r["id"] for r in a["test"]] == [r["id"] for r in load_splits(ROOT, seed=0, test_size=5,
                                                                         harness_size=8, weight_size=50)["test"]]


def test_small_benchmark_is_taken_whole():
    tests = {"tiny": [to_item({"id": str(i), "question": f"q{i}", "golden_answers": ["a"]}, "f", "tiny")
                      for i in range(3)]}
    train = [to_item({"id": str(i), "question": f"t{i}", "golden_answers": "a"}, "f") for i in range(4)]
    s = make_splits(tests, train, seed=0, harness_size=2)
    assert len(s["test"]) == 3 and len(s["harness"]) == 2 and len(s["weight"]) == 2


def test_bad_rows_are_named():
    with pytest.raises(DataError, match="row 'x'.*golden_answers"):
        to_item({"id": "x", "question": "q", "golden_answers": []}, "f.jsonl")
