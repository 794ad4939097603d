"""`whale replay` logic: one episode with given replies, on the real chess domain and the test double."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

from tests.fixtures.guess_domain import GuessNumberDomainDouble
from whale.domain import DomainError, default_data_root
from whale.harness.validate import HarnessValidationError
from whale.replay import replay, replay_domain

SAMPLE = default_data_root() / "chess_puzzles" / "lichess_puzzles_sample.csv"


@pytest.fixture(scope="module")
def puzzle() -> dict[str, str]:
    if not SAMPLE.is_file():
        pytest.skip(f"no chess sample at {SAMPLE}")
    with SAMPLE.open(newline="") as fh:
        return next(row for row in csv.DictReader(fh) if len(row["Moves"].split()) >= 4)


def test_chess_solution_line_scores_one(puzzle: dict[str, str]) -> None:
    solver_moves = puzzle["Moves"].split()[1::2]
    episode = replay("chess_puzzles", puzzle, [f"<move>{m}</move>" for m in solver_moves] + ["<move>a1a2</move>"])
    assert (episode["reward"], episode["turns"], episode["end"], episode["error"]) == (
        1.0,
        len(solver_moves),
        "env_done",
        None,
    )
    assert episode["replies_used"] == len(solver_moves) and episode["replies_given"] == len(solver_moves) + 1
    assert [m["role"] for m in episode["messages"][:3]] == ["system", "user", "assistant"]


def test_chess_too_few_replies_are_empty_and_score_zero(puzzle: dict[str, str]) -> None:
    first = puzzle["Moves"].split()[1]
    episode = replay("chess_puzzles", puzzle, [f"<move>{first}</move>"])
    assert episode["reward"] == 0.0 and episode["error"] is None
    assert [m["content"] for m in episode["messages"] if m["role"] == "assistant"][1:] == [""] * (episode["turns"] - 1)


def test_replay_with_a_given_harness_and_the_test_double(tmp_path: Path) -> None:
    domain = GuessNumberDomainDouble()
    harness = tmp_path / "h.py"
    harness.write_text(domain.h0_path().read_text().replace("MAX_TURNS = 6", "MAX_TURNS = 2"))
    episode = replay_domain(
        domain, {"secret": 3}, ["<guess>1</guess>", "<guess>2</guess>", "<guess>3</guess>"], harness
    )
    assert (episode["reward"], episode["turns"], episode["end"], episode["replies_used"]) == (0.0, 2, "max_turns", 2)


def test_bad_item_and_bad_harness_are_clear_errors(tmp_path: Path) -> None:
    domain = GuessNumberDomainDouble()
    with pytest.raises(DomainError, match="needs a 'secret'"):
        replay_domain(domain, {"id": "x"}, [])
    bad = tmp_path / "bad.py"
    bad.write_text("import os\n")
    with pytest.raises(HarnessValidationError, match="bad.py:1: \\[forbidden-import\\]"):
        replay_domain(domain, {"secret": 1}, [], bad)
