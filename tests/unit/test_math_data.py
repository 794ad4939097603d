"""Math splits: AIME test with ids kept, disjoint seeded D_weight / D_harness from the MATH pool."""

from __future__ import annotations

import json

import pytest

from math_reasoning.data import DataError, load_splits, make_splits, to_item
from whale.domain import default_data_root

ROOT = default_data_root()


def test_real_splits_shapes_and_disjointness():
    s = load_splits(ROOT, seed=0)
    assert len(s["test"]) == 60
    assert [r["id"] for r in s["test"][:2]] == ["2024-I-1", "2024-I-2"]
    assert s["test"][-1]["id"] == "2025-II-15"
    assert len(s["harness"]) == 256
    ids = {k: {r["id"] for r in v} for k, v in s.items()}
    assert not ids["weight"] & ids["harness"]
    assert len(s["weight"]) > 5000
    for row in s["harness"][:5] + s["test"][:5]:
        assert set(row) >= {"id", "problem", "answer"}


def test_seed_changes_harness_and_is_reproducible():
    a = load_splits(ROOT, seed=0)["harness"]
    b = load_splits(ROOT, seed=0)["harness"]
    c = load_splits(ROOT, seed=1)["harness"]
    assert [r["id"] for r in a] == [r["id"] for r in b]
    assert [r["id"] for r in a] != [r["id"] for r in c]


def test_caps_respected():
    s = load_splits(ROOT, seed=3, harness_size=16, weight_size=100, test_size=10)
    assert (len(s["weight"]), len(s["harness"]), len(s["test"])) == (100, 16, 10)
    assert all(r["id"].startswith(("2024-", "2025-")) for r in s["test"])


def test_gsm8k_curriculum_grows_the_pool():
    plain = load_splits(ROOT, seed=0)
    more = load_splits(ROOT, seed=0, gsm8k=True)
    assert len(more["weight"]) > len(plain["weight"]) + 7000
    assert any(r["source"] == "gsm8k_train.jsonl" for r in more["weight"])


def test_duplicates_and_test_problems_leave_the_pool():
    test = [to_item({"id": "t", "problem": "What is 1+1?", "answer": "2"}, "t")]
    pool = [
        to_item({"id": f"p{i}", "problem": p, "answer": "1"}, "p")
        for i, p in enumerate(["What is  1+1?", "A", "a", "B", "C"])
    ]
    s = make_splits(test, pool, seed=0, harness_size=1)
    kept = {r["problem"] for r in s["weight"] + s["harness"]}
    assert kept == {"A", "B", "C"}  # "a" repeats "A"; the test problem is dropped


def test_bad_rows_and_sizes_name_the_problem(tmp_path):
    with pytest.raises(DataError, match="'problem' and 'answer'"):
        to_item({"id": "x", "problem": "", "answer": "1"}, "f.jsonl")
    with pytest.raises(DataError, match="harnessSize=5"):
        make_splits([], [to_item({"id": "a", "problem": "p", "answer": "1"}, "f")], seed=0, harness_size=5)
    (tmp_path / "math_reasoning").mkdir()
    with pytest.raises(DataError, match="aime_2024.jsonl: missing.*dataDir"):
        load_splits(tmp_path)
    for name in ("aime_2024.jsonl", "aime_2025.jsonl", "math_train_numeric.jsonl"):
        (tmp_path / "math_reasoning" / name).write_text(json.dumps({"id": "1", "problem": "p", "answer": "1"}) + "\n")
    (tmp_path / "math_reasoning" / "aime_2025.jsonl").write_text("{not json\n")
    with pytest.raises(DataError, match=r"aime_2025.jsonl:1: not valid JSON"):
        load_splits(tmp_path)
