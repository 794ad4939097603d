"""chess_puzzles' options (``spec.experiment.domainOptions``): which moves solve a puzzle."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from whale.domain import DomainOptions


class ChessOptions(DomainOptions):
    chess_move: Literal["stored", "anyMate"] = Field(
        "stored",
        description="stored (the paper's) = only the puzzle's stored move counts at each step; anyMate = also accept "
        "any move that checkmates on the spot and count the puzzle solved (Lichess's own rule)",
    )
