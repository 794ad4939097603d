"""The GSM8K problem set of math_reasoning (``spec.experiment.domainOptions.mathSet: gsm8k``): GSM8K test as D_test, GSM8K train
as the pool of D_weight / D_harness, the same caps and checks as the paper's AIME set."""

from __future__ import annotations

import pytest

from math_reasoning import MathReasoning
from math_reasoning.data import DataError, load_splits
from math_reasoning.env import MathEnvironment
from whale.core.spec import Data
from whale.domain import DomainOptionsError, default_data_root

ROOT = default_data_root()


def test_gsm8k_splits_come_from_gsm8k_only_and_are_disjoint() -> None:
    s = load_splits(ROOT, seed=0, math_set="gsm8k")
    assert len(s["test"]) == 1319
    assert [r["id"] for r in s["test"][:2]] == ["gsm8k_test_0", "gsm8k_test_1"]
    assert {r["source"] for r in s["test"]} == {"gsm8k_test.jsonl"}
    assert {r["source"] for r in s["weight"] + s["harness"]} == {"gsm8k_train.jsonl"}
    assert len(s["harness"]) == 256 and 7000 < len(s["weight"]) <= 7473 - 256
    problems = {k: {" ".join(r["problem"].split()).lower() for r in v} for k, v in s.items()}
    assert not problems["weight"] & problems["harness"]
    assert not (problems["weight"] | problems["harness"]) & problems["test"]
    first = s["test"][0]
    assert first["answer"] == "18" and first["problem"].startswith("Janet")


def test_gsm8k_caps_and_seed() -> None:
    s = load_splits(ROOT, seed=3, math_set="gsm8k", harness_size=16, weight_size=64, test_size=32)
    assert (len(s["weight"]), len(s["harness"]), len(s["test"])) == (64, 16, 32)
    again = load_splits(ROOT, seed=3, math_set="gsm8k", harness_size=16, weight_size=64, test_size=32)
    other = load_splits(ROOT, seed=4, math_set="gsm8k", harness_size=16, weight_size=64, test_size=32)
    assert [r["id"] for r in again["harness"]] == [r["id"] for r in s["harness"]]
    assert [r["id"] for r in other["harness"]] != [r["id"] for r in s["harness"]]
    # the paper's set is unchanged by the option's existence
    assert len(load_splits(ROOT, seed=0)["test"]) == 60


def test_the_domain_reads_the_spec_option_and_scores_gsm8k_answers() -> None:
    domain = MathReasoning().with_options({"mathSet": "gsm8k"})
    test = domain.load_split("test", Data.model_validate({"testSize": 5, "harnessSize": 8}))
    assert len(test) == 5 and all(r["id"].startswith("gsm8k_test_") for r in test)
    assert domain.split_sizes(Data.model_validate({"harnessSize": 8, "weightSize": 40})) == {
        "weight": 40,
        "harness": 8,
        "test": 1319,
    }
    item = test[0]
    right, wrong = MathEnvironment(item, runner=None), MathEnvironment(item, runner=None)  # type: ignore[arg-type]  # no tool call
    right.step(f"So the answer is \\boxed{{{item['answer']}}}.")
    wrong.step(f"So the answer is {item['answer']}.")  # no box: 0, as the h0 prompt asks for one
    assert (right.reward(), wrong.reward()) == (1.0, 0.0)


def test_an_unknown_set_is_refused_with_the_field_named() -> None:
    with pytest.raises(DomainOptionsError, match=r"spec.experiment.domainOptions.mathSet: .*aime.*gsm8k"):
        MathReasoning().with_options({"mathSet": "aime2026"})
    with pytest.raises(DataError, match=r"spec.experiment.domainOptions.mathSet='bogus'.*aime, gsm8k"):
        load_splits(ROOT, math_set="bogus")


def test_missing_gsm8k_files_name_the_file_and_the_fix(tmp_path) -> None:
    (tmp_path / "math_reasoning").mkdir()
    with pytest.raises(DataError, match=r"gsm8k_test.jsonl: missing.*dataDir"):
        load_splits(tmp_path, math_set="gsm8k")
