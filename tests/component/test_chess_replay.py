"""chess_puzzles episodes through the real runtime: h0 in its sandboxed process, scripted replies
(``whale.replay``), real Lichess rows. Checks what the model sees and the retry rules end to end."""

from __future__ import annotations

import csv
import functools
import json

import pytest

from chess_puzzles.prep import SOURCE_FILE
from whale import domains
from whale.domain import DomainError, default_data_root
from whale.harness.validate import validate_file
from whale.replay import replay


@functools.cache
def rows() -> dict[str, dict[str, str]]:
    with (default_data_root() / "chess_puzzles" / SOURCE_FILE).open(newline="", encoding="utf-8") as handle:
        return {row["PuzzleId"]: row for row in csv.DictReader(handle)}


def tagged(moves):
    return [f"Thinking... <move>{m}</move>" for m in moves]


def line(puzzle_id):
    return rows()[puzzle_id]["Moves"].split()[1::2]


def user_turns(episode):
    return [m["content"] for m in episode["messages"] if m["role"] == "user"]


def verdicts(episode):
    return [s["result"]["observation"]["verdict"] for s in episode["steps"] if s["type"] == "action"]


def test_h0_passes_the_interface_check():
    domain = domains.load("chess_puzzles")
    validate_file(domain.h0_path(), domain.allowed_imports)
    assert domain.skill_path().read_text().startswith("# Skill: improving the chess_puzzles harness")


def test_stored_line_solves_and_each_turn_shows_the_position():
    episode = replay("chess_puzzles", rows()["00008"], tagged(line("00008")))
    assert (episode["reward"], episode["turns"], episode["end"], episode["error"]) == (1.0, 3, "env_done", None)
    assert verdicts(episode) == ["correct", "correct", "solved"]
    first, second, third = user_turns(episode)
    assert "You play white." in first
    assert "FEN: r6k/pp2r2p/4Rp1Q/3p4/8/1N1P2b1/PqP3PP/7K w - - 0 25" in first
    assert "r . . . . . . k\np p . . r . . p" in first  # the ASCII board
    assert "Your moves so far: none yet" in first and "Opponent's last move: f2g3 (Bxg3)" in first
    assert "- [e6e7] SAN=Rxe7\n" in first and "- [h6h7] SAN=Qxh7+\n" in first
    assert first.endswith("Reply with your move as <move>uci</move>.")
    assert second.startswith("Rxe7 is correct. The opponent replied Qb1+ (b2b1)")
    assert "Your moves so far: e6e7 (Rxe7)" in second and "Opponent's last move: b2b1 (Qb1+)" in second
    assert "Your moves so far: e6e7 (Rxe7), b3c1 (Nc1)" in third
    assert episode["messages"][0]["role"] == "system" and "<move>" in episode["messages"][0]["content"]


def test_a_wrong_legal_move_ends_the_puzzle_at_once():
    episode = replay("chess_puzzles", rows()["00008"], tagged(["a2a3", *line("00008")]))
    assert (episode["reward"], episode["turns"], episode["end"]) == (0.0, 1, "env_done")
    assert verdicts(episode) == ["wrong"]
    assert episode["replies_used"] == 1


def test_alternative_mate_on_the_last_move_is_wrong_as_in_the_paper():
    """Only the stored move counts by default (the paper); Lichess's any-mate rule is an option."""
    moves = line("004kB")
    episode = replay("chess_puzzles", rows()["004kB"], tagged([*moves[:-1], "f8f1"]))
    assert moves[-1] == "e1f1"
    assert (episode["reward"], verdicts(episode)[-1]) == (0.0, "wrong")


def test_one_malformed_reply_and_one_illegal_move_are_retried():
    replies = ["I would play the rook.", "<move>a1a8</move>", *tagged(line("00008"))]
    episode = replay("chess_puzzles", rows()["00008"], replies)
    assert (episode["reward"], episode["turns"]) == (1.0, 5)
    assert verdicts(episode) == ["malformed", "illegal", "correct", "correct", "solved"]
    turns = user_turns(episode)
    assert turns[1].startswith("No move was found in the answer")
    assert turns[2].startswith("a1a8 is not a legal move in this position")


@pytest.mark.parametrize(
    ("replies", "expected"),
    [
        (["no tag", "<move>Rxe7</move>", "<move>e6e7</move>"], ["malformed", "malformed"]),
        (
            ["<move>a1a8</move>", "<move>e6e7</move>", "<move>a1a8</move>", "<move>b3c1</move>"],
            ["illegal", "correct", "illegal"],
        ),
        ([], ["malformed", "malformed"]),  # too few replies: empty answers
    ],
)
def test_the_second_malformed_or_illegal_answer_ends_the_puzzle(replies, expected):
    episode = replay("chess_puzzles", rows()["00008"], replies)
    assert (episode["reward"], episode["end"], episode["error"]) == (0.0, "env_done", None)
    assert verdicts(episode) == expected


def test_the_last_move_tag_counts():
    episode = replay("chess_puzzles", rows()["001KR"], ["Not <move>a2a3</move> but <move>f1f8</move>"])
    assert episode["reward"] == 1.0


def test_a_bad_raw_row_is_refused_naming_the_puzzle():
    bad = {**rows()["00008"], "Moves": "f2g3 e6e9"}
    with pytest.raises(DomainError, match=r"puzzle 00008: move 2 \('e6e9'\) is not a UCI move"):
        replay("chess_puzzles", bad, [])


def test_whale_replay_cli(tmp_path):
    from typer.testing import CliRunner

    from whale.cli import app

    item = tmp_path / "item.json"
    item.write_text(json.dumps(rows()["001KR"]))
    result = CliRunner().invoke(app, ["replay", "chess_puzzles", "--item", str(item), "--", "<move>f1f8</move>"])
    assert result.exit_code == 0, result.output
    episode = json.loads(result.output)
    assert (episode["reward"], episode["turns"]) == (1.0, 1)
