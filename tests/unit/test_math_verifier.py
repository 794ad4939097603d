"""The strict \\boxed{} verifiers: the paper's (the reference code's verl ``math_dapo`` with
``strict_box_verify``: the last box of the last 100 characters, compared as an exact string; the default)
and math-verify equivalence (``spec.experiment.domainOptions.mathAnswer: mathVerify``), on edge cases and real rows."""

from __future__ import annotations

import json

import pytest

from math_reasoning import MathReasoning
from math_reasoning.env import MathEnvironment
from math_reasoning.verifier import (
    DAPO_TAIL_CHARS,
    dapo_last_boxed,
    dapo_score,
    last_boxed,
    math_verify_score,
    score,
)
from whale.domain import default_data_root, open_raw

DATA = default_data_root() / "math_reasoning"


@pytest.mark.parametrize(
    ("text", "boxed"),
    [
        (r"so \boxed{42}.", "42"),
        (r"\boxed{\frac{\sqrt{3}}{2}}", r"\frac{\sqrt{3}}{2}"),  # nested braces
        (r"first \boxed{1}, finally \boxed{2}", "2"),  # several boxes: the last
        (r"\boxed{\{1,2\}}", r"\{1,2\}"),  # escaped braces do not close the box
        (r"\boxed{7} and a broken \boxed{8", "7"),  # an unclosed box is skipped
        (r"\fbox{5}", "5"),
        ("the answer is 42", None),  # no box
        (r"\boxed 42", None),
    ],
)
def test_last_boxed(text, boxed):
    assert last_boxed(text) == boxed


@pytest.mark.parametrize(
    ("reply", "gold", "expected"),
    [
        (r"\boxed{\frac{1}{2}}", "0.5", 1.0),  # \frac vs decimal
        (r"\boxed{0.5}", r"\frac{1}{2}", 1.0),
        (r"\boxed{\dfrac{9}{2}}", r"\frac{9}{2}", 1.0),
        (r"\boxed{1,000}", "1000", 1.0),  # thousands separators
        (r"\boxed{1\,000}", "1000", 1.0),
        (r"\boxed{1{,}000}", "1000", 1.0),
        (r"\boxed{999.9999}", "1000", 0.0),
        (r"\boxed{2} no wait \boxed{3}", "3", 1.0),
        (r"\boxed{2} no wait \boxed{3}", "2", 0.0),
        ("The answer is 3.", "3", 0.0),  # strict: no box, no credit
        ("", "3", 0.0),
        (None, "3", 0.0),
        (r"\boxed{" + "9" * 400 + "}", "9", 0.0),  # absurdly long answers are refused
    ],
)
def test_math_verify_cases(reply, gold, expected):
    assert math_verify_score(reply, gold) == expected
    assert score(reply, gold, "mathVerify") == expected


def _rows(name: str, n: int) -> list[dict]:
    with open_raw(DATA / name) as fh:
        return [json.loads(line) for _, line in zip(range(n), fh, strict=False)]


@pytest.mark.parametrize("name", ["aime_2024.jsonl", "aime_2025.jsonl"])
def test_aime_rows_gold_scores_one_and_off_by_one_zero(name):
    for row in _rows(name, 30):
        gold = row["answer"]
        for match in ("dapo", "mathVerify"):
            assert score(f"Thus the answer is $\\boxed{{{gold}}}$.", gold, match) == 1.0, (row["id"], match)
            assert score(f"\\boxed{{{int(gold) + 1}}}", gold, match) == 0.0, (row["id"], match)


def test_math_train_fractions_accept_decimal_equivalents():
    rows = [r for r in _rows("math_train_numeric.jsonl", 400) if r["answer_type"] == "fraction"][:15]
    assert rows
    import re
    from fractions import Fraction

    for row in rows:
        m = re.fullmatch(r"(-?)\\[dt]?frac\{(\d+)\}\{(\d+)\}", row["answer"])
        if not m:
            continue
        value = Fraction(int(m.group(2)), int(m.group(3))) * (-1 if m.group(1) else 1)
        assert score(f"\\boxed{{{row['answer']}}}", row["answer"], "mathVerify") == 1.0, row["id"]
        if value.denominator in (2, 4, 5, 8, 10, 20, 25):  # exact decimals only
            assert score(f"\\boxed{{{float(value)}}}", row["answer"], "mathVerify") == 1.0, row["id"]
            # the paper's match compares strings: the decimal is not the fraction
            assert score(f"\\boxed{{{float(value)}}}", row["answer"]) == 0.0, row["id"]
        assert score(f"\\boxed{{{row['answer']}}}", row["answer"]) == 1.0, row["id"]
        assert score(f"\\boxed{{{float(value) + 1}}}", row["answer"], "mathVerify") == 0.0, row["id"]


# ----- the paper's strict DAPO match (verl's math_dapo, strict_box_verify), the default ----------------


@pytest.mark.parametrize(
    ("text", "boxed"),
    [
        (r"so \boxed{42}.", "42"),
        (r"\boxed{\frac{\sqrt{3}}{2}}", r"\frac{\sqrt{3}}{2}"),
        (r"first \boxed{1}, finally \boxed{2}", "2"),
        (r"\boxed{7} and a broken \boxed{8", None),  # DAPO reads only the last box, even unclosed
        (r"\fbox{5}", None),  # only \boxed
        (r"\boxed{a\}b}", "a\\"),  # no escapes: the first '}' that balances closes it
        ("the answer is 42", None),
    ],
)
def test_dapo_last_boxed(text, boxed):
    assert dapo_last_boxed(text) == boxed


@pytest.mark.parametrize(
    ("reply", "gold", "expected"),
    [
        (r"The answer is \boxed{204}.", "204", 1.0),
        (r"Thus the answer is $\boxed{204}$.", "204", 1.0),
        (r"\boxed{2} no wait \boxed{3}", "3", 1.0),
        (r"\boxed{\frac{1}{2}}", r"\frac{1}{2}", 1.0),
        # an exact string match, nothing normalised: what the paper's verifier counts
        (r"\boxed{ 204 }", "204", 0.0),
        (r"\boxed{204.}", "204", 0.0),
        (r"\boxed{x = 204}", "204", 0.0),
        (r"\boxed{1,000}", "1000", 0.0),
        (r"\boxed{\frac{1}{2}}", "0.5", 0.0),
        (r"\boxed{0.5}", r"\frac{1}{2}", 0.0),
        (r"\boxed{\dfrac{1}{2}}", r"\frac{1}{2}", 0.0),
        (r"\boxed{3} then a broken \boxed{4", "3", 0.0),  # the last box is unclosed: no answer
        ("The answer is 3.", "3", 0.0),
        ("", "3", 0.0),
        (None, "3", 0.0),
        (r"\boxed{204}" + " and then I explain why." * 5, "204", 0.0),  # the box is not in the last 100
        ("x" * 1000 + r"\boxed{204}", "204", 1.0),
    ],
)
def test_dapo_score_cases(reply, gold, expected):
    assert dapo_score(reply, gold) == expected
    assert score(reply, gold) == expected  # the default


def test_dapo_reads_only_the_last_100_characters():
    gold = "17"
    box = rf"\boxed{{{gold}}}"
    after = "y" * (DAPO_TAIL_CHARS - len(box))
    assert DAPO_TAIL_CHARS == 100
    assert dapo_score(box + after, gold) == 1.0  # exactly the last 100 characters
    assert dapo_score(box + after + "z", gold) == 0.0
    assert score(box + after + "z", gold, "mathVerify") == 1.0  # math-verify reads the whole reply


def test_unknown_match_is_refused():
    with pytest.raises(ValueError, match="dapo, mathVerify"):
        score(r"\boxed{1}", "1", "sympy")


def test_the_spec_picks_the_environments_match():
    """spec.experiment.domainOptions.mathAnswer reaches every environment the domain makes (training, search and eval)."""
    item = {"id": "x", "problem": "What is 1/2?", "answer": r"\frac{1}{2}"}
    domain = MathReasoning(runner=object())  # no tool is called here
    rewards = {}
    for match in ("dapo", "mathVerify"):
        env = domain.with_options({"mathAnswer": match}).make_env(item)
        assert isinstance(env, MathEnvironment) and env.match == match
        result = env.step(r"It is \boxed{0.5}")
        assert result.done and result.info["match"] == match
        rewards[match] = env.reward()
    assert rewards == {"dapo": 0.0, "mathVerify": 1.0}
    assert MathReasoning().answer_match == "dapo"  # the paper's, unless the spec says otherwise
