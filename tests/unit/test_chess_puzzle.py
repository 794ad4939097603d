"""Parsing one Lichess row: real rows parse; every kind of bad row names the puzzle and the problem."""

from __future__ import annotations

import chess
import pytest

from chess_puzzles.puzzle import PuzzleError, parse_puzzle, position_key
from whale.domain import DomainError

# Real row 0000D of the Lichess sample: the FEN is before Moves[0] (white's d3d6); the solver is black.
ROW = {
    "PuzzleId": "0000D",
    "FEN": "5rk1/1p3ppp/pq3b2/8/8/1P1Q1N2/P4PPP/3R2K1 w - - 2 27",
    "Moves": "d3d6 f8d8 d6d8 f6d8",
    "Rating": "1447",
    "Themes": "advantage endgame short",
}


def test_real_row_parses_with_the_solver_position_as_key():
    puzzle = parse_puzzle(ROW)
    board = chess.Board(ROW["FEN"])
    board.push_uci("d3d6")
    assert puzzle.start_fen == board.fen()
    assert puzzle.key == position_key(board) and puzzle.key.endswith(" b")
    assert puzzle.solver_moves == ("f8d8", "f6d8")
    assert puzzle.solver_plies == 2
    assert puzzle.rating == 1447
    assert puzzle.themes == ("advantage", "endgame", "short")


def test_key_ignores_clocks_and_castling_rights():
    a = chess.Board("r3k2r/8/8/8/8/8/8/R3K2R w KQkq - 0 1")
    b = chess.Board("r3k2r/8/8/8/8/8/8/R3K2R w - - 12 40")
    assert position_key(a) == position_key(b)
    b.turn = chess.BLACK
    assert position_key(a) != position_key(b)


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ({"FEN": "not a fen"}, "invalid FEN"),
        ({"FEN": "8/8/8/8/8/8/8/8 w - - 0 1"}, "impossible position"),  # no kings
        ({"FEN": "P4rk1/1p3ppp/pq3b2/8/8/1P1Q1N2/P4PPP/3R2K1 w - - 2 27"}, "PAWNS_ON_BACKRANK"),
        ({"Moves": "d3d6 f8d8 d6d8 f6e9"}, r"move 4 \('f6e9'\) is not a UCI move"),
        ({"Moves": "d3d6 f8d8 d6d8 f6a1"}, r"move 4 \(f6a1\) is illegal in 3Q2k1"),
        ({"Moves": "d3d6 f8d8 d6d8"}, "must be even"),
        ({"Moves": "d3d6"}, "at least one solver move"),
        ({"Moves": ""}, "column Moves is missing or empty"),
        ({"Rating": "high"}, "Rating 'high' is not a number"),
    ],
)
def test_bad_rows_name_the_puzzle_and_the_problem(change, reason):
    with pytest.raises(PuzzleError, match=reason) as caught:
        parse_puzzle({**ROW, **change})
    assert caught.value.puzzle_id == "0000D"
    assert str(caught.value).startswith("puzzle 0000D: ")
    assert isinstance(caught.value, DomainError)


def test_row_without_id_is_reported_as_such():
    with pytest.raises(PuzzleError, match=r"puzzle \(no PuzzleId\): column PuzzleId"):
        parse_puzzle({**ROW, "PuzzleId": " "})


def test_json_values_are_accepted_like_csv_strings():
    assert parse_puzzle({**ROW, "Rating": 1447}).rating == 1447
