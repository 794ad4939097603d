"""Split preparation: deterministic, disjoint by position + side to move, sized as documented, and
loud about bad rows (every bad row listed by line and PuzzleId)."""

from __future__ import annotations

import functools
import random

import chess
import pytest

from chess_puzzles import prep
from chess_puzzles.prep import BadRowsError, ChessDataError, Sizes, make_splits, parse_csv
from whale.core.spec import Data
from whale.domain import default_data_root

HEADER = "PuzzleId,FEN,Moves,Rating,RatingDeviation,Popularity,NbPlays,Themes,GameUrl,OpeningTags"


@functools.cache
def real_text() -> str:
    return (default_data_root() / "chess_puzzles" / prep.SOURCE_FILE).read_text(encoding="utf-8")


@functools.cache
def real_items() -> tuple[prep.Item, ...]:
    return tuple(parse_csv(real_text()))


def real_lines(n: int) -> list[str]:
    return real_text().splitlines()[1 : n + 1]


def ids(items) -> list[str]:
    return [it.puzzle.puzzle_id for it in items]


def test_real_sample_splits_into_paper_sized_disjoint_sets():
    splits = make_splits(real_items(), Sizes(seed=0, harness=256, test=256, weight_cap=None))
    sizes = {name: len(items) for name, items in splits.items.items()}
    assert sizes == {"weight": len(real_items()) - 512, "harness": 256, "test": 256}
    keys = {name: {it.puzzle.key for it in items} for name, items in splits.items.items()}
    assert sum(len(k) for k in keys.values()) == len(real_items())  # every position once
    assert not keys["weight"] & keys["harness"] and not keys["weight"] & keys["test"]
    assert not keys["harness"] & keys["test"]
    assert all(1 <= it.puzzle.solver_plies <= 9 for items in splits.items.values() for it in items)


def test_splits_are_deterministic_in_the_seed():
    sizes = Sizes(seed=0, harness=256, test=256, weight_cap=None)
    again = make_splits(list(reversed(parse_csv(real_text()))), sizes)  # input order does not matter
    first = make_splits(real_items(), sizes)
    assert {n: ids(i) for n, i in first.items.items()} == {n: ids(i) for n, i in again.items.items()}
    other = make_splits(real_items(), Sizes(seed=1, harness=256, test=256, weight_cap=None))
    assert ids(other.items["test"]) != ids(first.items["test"])


def test_test_split_does_not_move_when_harness_or_weight_sizes_change():
    base = make_splits(real_items(), Sizes(seed=0, harness=256, test=256, weight_cap=None))
    smaller = make_splits(real_items(), Sizes(seed=0, harness=64, test=256, weight_cap=100))
    assert ids(smaller.items["test"]) == ids(base.items["test"])
    assert ids(smaller.items["harness"]) == ids(base.items["harness"])[:64]
    assert len(smaller.items["weight"]) == 100


def test_duplicate_positions_are_dropped_and_counted():
    line = real_lines(1)[0]  # puzzle 00008
    fields = line.split(",")
    twin = ",".join(["zzDup", fields[1].rsplit(" ", 2)[0] + " 5 60", *fields[2:]])  # other clocks, same position
    items = parse_csv("\n".join([HEADER, *real_lines(40), twin]) + "\n")
    splits = make_splits(items, Sizes(seed=0, harness=10, test=10, weight_cap=None))
    assert splits.dropped == {"duplicate_position": 1}
    all_ids = [i for part in splits.items.values() for i in ids(part)]
    assert "00008" in all_ids and "zzDup" not in all_ids


def long_line_row(puzzle_id: str, solver_plies: int) -> str:
    """A legal line of the given length from a real position (random legal moves, fixed seed)."""
    fen = real_lines(1)[0].split(",")[1]
    rng, board = random.Random(7), chess.Board(fen)
    moves: list[str] = []
    while len(moves) < 2 * solver_plies:
        legal = sorted(board.legal_moves, key=lambda m: m.uci())
        move = rng.choice(legal)
        board.push(move)
        if board.is_game_over():
            board.pop()
            continue
        moves.append(move.uci())
    return f"{puzzle_id},{fen},{' '.join(moves)},1500,75,90,100,long,,"


def test_lines_longer_than_nine_solver_plies_are_dropped():
    text = "\n".join([HEADER, *real_lines(40), long_line_row("zzLong", 10), long_line_row("zzNine", 9)]) + "\n"
    items = parse_csv(text)
    assert {"zzLong", "zzNine"} <= set(ids(items))
    splits = make_splits(items, Sizes(seed=0, harness=10, test=10, weight_cap=None))
    all_ids = [i for part in splits.items.values() for i in ids(part)]
    assert splits.dropped == {"solver_plies_out_of_range": 1}
    assert "zzNine" in all_ids and "zzLong" not in all_ids


def test_every_bad_row_is_listed_with_its_line_and_puzzle_id():
    good = real_lines(5)
    bad = [
        "bad01,5rk1/1p3ppp/pq3b2/8/8/1P1Q1N2/P4PPP/3R2K1 w - - 2 27,d3d6 f8d8",  # too few fields
        "bad02,8/8/8/8/8/8/8/8 w - - 0 1,e2e4 e7e5,1500,75,90,100,x,,",  # no kings
        "bad03,5rk1/1p3ppp/pq3b2/8/8/1P1Q1N2/P4PPP/3R2K1 w - - 2 27,d3d6 f8a1,1500,75,90,100,x,,",  # illegal
        "bad04,5rk1/1p3ppp/pq3b2/8/8/1P1Q1N2/P4PPP/3R2K1 w - - 2 27,d3d6 f8d8,1,2,3,4,5,6,7,8",  # extra fields
        good[0],  # duplicate PuzzleId
    ]
    text = "\n".join([HEADER, *good, *bad]) + "\n"
    with pytest.raises(BadRowsError) as caught:
        parse_csv(text, where="puzzles.csv")
    error = caught.value
    assert [(b.line, b.puzzle_id) for b in error.bad] == [
        (7, "bad01"),
        (8, "bad02"),
        (9, "bad03"),
        (10, "bad04"),
        (11, "00008"),
    ]
    message = str(error)
    assert message.startswith("5 bad row(s) in puzzles.csv")
    assert "line 7, puzzle bad01: 3 fields, the header has 10" in message
    assert "line 8, puzzle bad02: impossible position" in message
    assert "line 9, puzzle bad03: move 2 (f8a1) is illegal" in message
    assert "line 10, puzzle bad04: 11 fields, the header has 10" in message
    assert "line 11, puzzle 00008: duplicate PuzzleId (first on line 2)" in message
    assert "Fix or delete these rows" in message


def test_missing_columns_and_missing_files_say_what_to_do(tmp_path):
    with pytest.raises(ChessDataError, match="header lacks column.s. Moves"):
        parse_csv("PuzzleId,FEN\n1,x\n", where="f.csv")
    with pytest.raises(ChessDataError, match=r"does not exist.*spec.experiment.data.dataDir"):
        prep.split_sizes(Data(data_dir=str(tmp_path)))


def test_too_few_puzzles_for_the_requested_sizes(tmp_path):
    (tmp_path / "chess_puzzles").mkdir()
    (tmp_path / "chess_puzzles" / prep.SOURCE_FILE).write_text("\n".join([HEADER, *real_lines(30)]) + "\n")
    with pytest.raises(ChessDataError, match=r"only 30 usable chess puzzles.*lower spec.experiment.data.testSize"):
        prep.split_sizes(Data(data_dir=str(tmp_path)))
    assert prep.split_sizes(Data(data_dir=str(tmp_path), harness_size=10, test_size=8)) == {
        "weight": 12,
        "harness": 10,
        "test": 8,
    }


def test_split_sizes_of_the_real_sample_and_caps():
    assert prep.split_sizes(Data()) == {"weight": 2483, "harness": 256, "test": 256}
    assert prep.split_sizes(Data(weight_size=500, test_size=100)) == {"weight": 500, "harness": 256, "test": 100}
