"""The strict \\boxed{} verifier: box extraction edge cases and math-verify equivalence on real rows."""

from __future__ import annotations

import json

import pytest

from math_reasoning.verifier import last_boxed, score
from whale.domain import default_data_root

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
def test_score_cases(reply, gold, expected):
    assert score(reply, gold) == expected


def _rows(name: str, n: int) -> list[dict]:
    with (DATA / name).open() as fh:
        return [json.loads(line) for _, line in zip(range(n), fh)]


@pytest.mark.parametrize("name", ["aime_2024.jsonl", "aime_2025.jsonl"])
def test_aime_rows_gold_scores_one_and_off_by_one_zero(name):
    for row in _rows(name, 30):
        gold = row["answer"]
        assert score(f"Thus the answer is $\\boxed{{{gold}}}$.", gold) == 1.0, row["id"]
        assert score(f"\\boxed{{{int(gold) + 1}}}", gold) == 0.0, row["id"]


def test_math_train_fractions_accept_decimal_equivalents():
    rows = [r for r in _rows("math_train_numeric.jsonl", 400) if r["answer_type"] == "fraction"][:15]
    assert rows
    from fractions import Fraction

    import re

    for row in rows:
        m = re.fullmatch(r"(-?)\\[dt]?frac\{(\d+)\}\{(\d+)\}", row["answer"])
        if not m:
            continue
        value = Fraction(int(m.group(2)), int(m.group(3))) * (-1 if m.group(1) else 1)
        assert score(f"\\boxed{{{row['answer']}}}", row["answer"]) == 1.0, row["id"]
        if value.denominator in (2, 4, 5, 8, 10, 20, 25):  # exact decimals only
            assert score(f"\\boxed{{{float(value)}}}", row["answer"]) == 1.0, row["id"]
        assert score(f"\\boxed{{{float(value) + 1}}}", row["answer"]) == 0.0, row["id"]
