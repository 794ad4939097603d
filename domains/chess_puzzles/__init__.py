"""The chess_puzzles domain: Lichess puzzles solved move by move (docs/data.md#chess_puzzles).

Registered under the ``whale.domains`` entry-point group as ``chess_puzzles = "chess_puzzles:DOMAIN"``.
Items are the raw Lichess CSV columns (all strings) plus ``"id"`` (= PuzzleId). An action is the
solver's move as UCI text; the environment plays the opponent's replies and judges every answer
(``chess_puzzles.env``). Heavy work (reading and validating the CSV) happens in ``chess_puzzles.prep``,
at preparation time only.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from chess_puzzles.options import ChessOptions
from chess_puzzles.puzzle import MAX_SOLVER_PLIES, parse_puzzle, raw_row
from whale.domain import DEFAULT_ALLOWED_IMPORTS, Domain

if TYPE_CHECKING:
    from chess_puzzles.env import ChessEnvironment
    from whale.domain import Data, FullData, Store

HERE = Path(__file__).resolve().parent


def to_item(row: dict[str, Any]) -> dict[str, Any]:
    """A raw row -> an item: the Lichess columns as strings plus ``id``."""
    raw = raw_row(row)
    return {"id": raw["PuzzleId"], **raw}


class ChessPuzzles(Domain):
    name = "chess_puzzles"
    #: the paper's list: no engine, no search library
    allowed_imports = DEFAULT_ALLOWED_IMPORTS
    #: h0 uses 9; a candidate may spend more turns on retries, never more than this: the reference's
    #: ``max_turns_cap`` 18 (docs/reproducing.md, turn caps)
    max_turns_limit = 2 * MAX_SOLVER_PLIES
    #: the proposer may try moves as the model does, turn by turn: the environment service answers them
    #: (``whale.tools.env_service``) and ``try_harness`` plays them (docs/metaharness.md, prototyping kit)
    prototype_steps = True

    options_model = ChessOptions

    @property
    def accept_any_mate(self) -> bool:
        """``spec.experiment.domainOptions.chessMove: anyMate``: a mate that is not the stored move also solves the
        puzzle (Lichess's rule); stored (the paper's) by default."""
        return bool(self.options.chess_move == "anyMate")

    def full_data(self) -> FullData:
        from chess_puzzles.full import FULL

        return FULL

    def split_sizes(self, data: Data) -> dict[str, int]:
        if data.source == "full":
            return self.full_data().sizes(data)
        from chess_puzzles.prep import split_sizes

        return split_sizes(data)

    def load_split(self, split: str, data: Data, store: Store | None = None) -> list[dict[str, Any]]:
        if data.source == "full":  # the Lichess database, prepared into the run's store (chess_puzzles.full)
            from whale.domain import load_full_split

            return [to_item(row) for row in load_full_split(store, self.full_data(), data, split)]
        from chess_puzzles import prep

        rows = prep.load_split(store, data, split) if store is not None else prep.rows_in_memory(data, split)
        return [to_item(row) for row in rows]

    def item_from_raw(self, raw: dict[str, Any]) -> dict[str, Any]:
        parse_puzzle(raw)  # PuzzleError (a DomainError) names the puzzle and what is wrong
        return to_item(raw)

    def make_env(self, item: dict[str, Any]) -> ChessEnvironment:
        from chess_puzzles.env import ChessEnvironment

        return ChessEnvironment(parse_puzzle(item), self.accept_any_mate)

    def h0_path(self) -> Path:
        return HERE / "h0.py"

    def skill_path(self) -> Path:
        return HERE / "SKILL.md"


DOMAIN = ChessPuzzles()
