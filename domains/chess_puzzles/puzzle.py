"""One Lichess puzzle: parsing and validating a raw CSV row. Pure (python-chess only, no I/O).

A row is the official Lichess columns (``PuzzleId, FEN, Moves, Rating, ...``). ``FEN`` is the position
*before* the opponent's move ``Moves[0]``; the solver first sees the position after it, so that position
(board + side to move) is the puzzle's identity for de-duplication and split disjointness.

Every check that could fail during an episode is done here, so that bad data is reported when the splits
are prepared, naming the puzzle, and never in the middle of a rollout.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import chess

from whale.domain import DomainError

#: the columns a row must have (the other official columns are kept but not required)
REQUIRED_COLUMNS = ("PuzzleId", "FEN", "Moves")
#: the official Lichess puzzle CSV columns, in file order
LICHESS_COLUMNS = (
    "PuzzleId",
    "FEN",
    "Moves",
    "Rating",
    "RatingDeviation",
    "Popularity",
    "NbPlays",
    "Themes",
    "GameUrl",
    "OpeningTags",
)
#: solver plies (moves the model must find) a puzzle may have to enter a split
MIN_SOLVER_PLIES = 1
MAX_SOLVER_PLIES = 9


class PuzzleError(DomainError):
    """A row that cannot be a puzzle. ``puzzle_id`` names it; the message says what is wrong."""

    def __init__(self, puzzle_id: str, reason: str):
        self.puzzle_id, self.reason = puzzle_id, reason
        super().__init__(f"puzzle {puzzle_id}: {reason}")


@dataclass(frozen=True)
class Puzzle:
    """A validated puzzle. ``moves`` is the full stored line in UCI, ``moves[0]`` being the opponent's."""

    puzzle_id: str
    fen: str
    moves: tuple[str, ...]
    rating: int | None
    themes: tuple[str, ...]
    #: FEN of the position the solver first sees (after ``moves[0]``)
    start_fen: str
    #: board + side to move of ``start_fen``: the identity used for de-duplication and disjoint splits
    key: str

    @property
    def solver_moves(self) -> tuple[str, ...]:
        return self.moves[1::2]

    @property
    def solver_plies(self) -> int:
        return len(self.solver_moves)


def position_key(board: chess.Board) -> str:
    """Board placement + side to move: castling rights, en passant and clocks do not make a new puzzle."""
    return f"{board.board_fen()} {'w' if board.turn == chess.WHITE else 'b'}"


def _text(row: Mapping[str, Any], column: str) -> str:
    value = row.get(column)
    return "" if value is None else str(value).strip()


def parse_puzzle(row: Mapping[str, Any]) -> Puzzle:
    """Validate one raw row (CSV strings or JSON values) and return the puzzle, or raise PuzzleError."""
    puzzle_id = _text(row, "PuzzleId") or "(no PuzzleId)"
    for column in REQUIRED_COLUMNS:
        if not _text(row, column):
            raise PuzzleError(puzzle_id, f"column {column} is missing or empty")
    fen = _text(row, "FEN")
    try:
        board = chess.Board(fen)
    except ValueError as exc:
        raise PuzzleError(puzzle_id, f"invalid FEN {fen!r}: {exc}") from None
    status = board.status()
    if status != chess.STATUS_VALID:
        flags = [str(flag.name) for flag in chess.Status if flag and flag in status]
        raise PuzzleError(puzzle_id, f"impossible position in FEN {fen!r}: {', '.join(flags)}")

    moves = tuple(_text(row, "Moves").split())
    if len(moves) < 2:
        raise PuzzleError(
            puzzle_id, f"Moves {' '.join(moves)!r} needs the opponent's move and at least one solver move"
        )
    if len(moves) % 2:
        raise PuzzleError(
            puzzle_id, f"Moves has {len(moves)} plies; a puzzle line ends with the solver's move, so it must be even"
        )
    start_fen = key = ""
    for ply, uci in enumerate(moves):
        try:
            move = chess.Move.from_uci(uci)
        except ValueError:
            raise PuzzleError(puzzle_id, f"move {ply + 1} ({uci!r}) is not a UCI move") from None
        if not board.is_legal(move):
            raise PuzzleError(puzzle_id, f"move {ply + 1} ({uci}) is illegal in {board.fen()}")
        board.push(move)
        if ply == 0:
            start_fen, key = board.fen(), position_key(board)

    rating_text = _text(row, "Rating")
    try:
        rating = int(float(rating_text)) if rating_text else None
    except ValueError:
        raise PuzzleError(puzzle_id, f"Rating {rating_text!r} is not a number") from None
    return Puzzle(
        puzzle_id=puzzle_id,
        fen=fen,
        moves=moves,
        rating=rating,
        themes=tuple(_text(row, "Themes").split()),
        start_fen=start_fen,
        key=key,
    )


def raw_row(row: Mapping[str, Any]) -> dict[str, str]:
    """The row as the Lichess columns, all strings: the item format splits store and `whale replay` takes."""
    return {column: _text(row, column) for column in LICHESS_COLUMNS}
