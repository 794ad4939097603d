"""The puzzle environment and verifier: one episode as a small state machine over python-chess. Pure.

Rules (the paper's chess domain):

* the environment plays the opponent's first move ``Moves[0]``; the solver must play ``Moves[1::2]`` and the
  environment answers each correct move with the next stored reply;
* only the stored move counts (the paper): any other legal move, even one that checkmates, ends the puzzle
  unsolved. With ``accept_any_mate`` (``spec.experiment.domainOptions.chessMove: anyMate``, Lichess's own rule) a move that
  checkmates on the spot is accepted even when it is not the stored one, and the puzzle is solved;
* a legal wrong move ends the puzzle unsolved;
* one malformed answer (no move, or text that is not a UCI move) and one illegal move are forgiven per
  episode: the solver is asked again; the second of either kind ends the puzzle unsolved;
* reward 1 only for a solved puzzle, 0 otherwise (also when the harness stops early).

The harness turns a model reply into a move string (or ``None``) and calls :meth:`PuzzleEpisode.play`;
:meth:`PuzzleEpisode.observation` gives it everything it may show the model (harness files cannot import
chess, so SAN, the ASCII board and the legal-move list come from here).
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import chess

from chess_puzzles.puzzle import Puzzle, parse_puzzle
from whale.domain import Environment, StepResult

#: answers that are not a UCI move, forgiven once per episode
MALFORMED_RETRIES = 1
#: illegal moves, forgiven once per episode
ILLEGAL_RETRIES = 1


class Verdict(str, enum.Enum):
    """What happened to one answer."""

    CORRECT = "correct"  # the stored move; the opponent replied and the puzzle goes on
    SOLVED = "solved"  # the last stored move (or, with accept_any_mate, any move that checkmates)
    WRONG = "wrong"  # legal but not the solution: the puzzle is lost
    MALFORMED = "malformed"  # no move / not UCI
    ILLEGAL = "illegal"  # UCI but not legal here


@dataclass(frozen=True)
class Judgement:
    """The environment's verdict on one answer."""

    verdict: Verdict
    #: the episode is over (solved, wrong, or a retry budget spent)
    done: bool
    #: a one-line message for the model (or the trace) saying what happened
    feedback: str
    #: the opponent's reply (UCI) when the move was correct and the line goes on
    reply: str | None = None
    reply_san: str | None = None


@dataclass
class PuzzleEpisode:
    """One attempt at one puzzle. Build it with :meth:`from_row`; drive it with :meth:`play`."""

    puzzle: Puzzle
    #: also accept a move that checkmates on the spot when it is not the stored one (Lichess; not the paper)
    accept_any_mate: bool = False
    board: chess.Board = field(init=False)
    #: the solver's accepted moves, UCI
    accepted: list[str] = field(default_factory=list, init=False)
    accepted_san: list[str] = field(default_factory=list, init=False)
    #: the environment's moves so far (opponent's first move included), UCI
    replies: list[str] = field(default_factory=list, init=False)
    last_reply_san: str = field(default="", init=False)
    malformed: int = field(default=0, init=False)
    illegal: int = field(default=0, init=False)
    done: bool = field(default=False, init=False)
    solved: bool = field(default=False, init=False)
    #: every answer the environment judged, in order (for traces)
    history: list[dict[str, Any]] = field(default_factory=list, init=False)
    _ply: int = field(default=1, init=False)  # index in puzzle.moves of the move the solver must find

    def __post_init__(self) -> None:
        self.board = chess.Board(self.puzzle.fen)
        self._push_reply(self.puzzle.moves[0])

    @classmethod
    def from_row(cls, row: Mapping[str, Any], accept_any_mate: bool = False) -> PuzzleEpisode:
        """From a raw Lichess row; a bad row raises PuzzleError (splits are validated before any episode)."""
        return cls(parse_puzzle(row), accept_any_mate)

    @property
    def reward(self) -> float:
        return 1.0 if self.solved else 0.0

    def _push_reply(self, uci: str) -> None:
        move = chess.Move.from_uci(uci)
        self.last_reply_san = self.board.san(move)
        self.board.push(move)
        self.replies.append(uci)

    def observation(self) -> dict[str, Any]:
        """What the solver may see now, as plain JSON (a harness formats it). No puzzle id, no solution."""
        board = self.board
        return {
            "side_to_move": "white" if board.turn == chess.WHITE else "black",
            "fen": board.fen(),
            "board": str(board),
            "accepted_moves": list(self.accepted),
            "accepted_moves_san": list(self.accepted_san),
            "last_reply": self.replies[-1] if self.replies else None,
            "last_reply_san": self.last_reply_san or None,
            # SAN for every legal move is most of the cost of a step; nobody reads it once the episode is over
            "legal_moves": []
            if self.done
            else [
                {"uci": move.uci(), "san": board.san(move)} for move in sorted(board.legal_moves, key=lambda m: m.uci())
            ],
            "in_check": board.is_check(),
            "malformed_retries_left": max(0, MALFORMED_RETRIES - self.malformed),
            "illegal_retries_left": max(0, ILLEGAL_RETRIES - self.illegal),
            "done": self.done,
            "solved": self.solved,
        }

    def play(self, answer: Any) -> Judgement:
        """Judge one answer: the solver's move in UCI (``None``, non-text, or text that is not UCI = malformed)."""
        if self.done:
            raise RuntimeError(f"puzzle {self.puzzle.puzzle_id}: the episode is over; no more moves are judged")
        text = answer.strip() if isinstance(answer, str) else ""
        try:
            move = chess.Move.from_uci(text.lower()) if text else None
        except ValueError:
            move = None
        if move is None or not move:  # `not move` = the null move 0000
            self.malformed += 1
            return self._record(
                text,
                Verdict.MALFORMED,
                self.malformed > MALFORMED_RETRIES,
                (f"{text[:40]!r} is not a move in UCI notation" if text else "No move was found in the answer")
                + " (UCI looks like e2e4, or e7e8q for a promotion).",
            )
        if not self.board.is_legal(move):
            self.illegal += 1
            return self._record(
                move.uci(),
                Verdict.ILLEGAL,
                self.illegal > ILLEGAL_RETRIES,
                f"{move.uci()} is not a legal move in this position; choose one of the legal moves.",
            )
        san = self.board.san(move)
        expected = self.puzzle.moves[self._ply]
        self.board.push(move)
        stored = move.uci() == expected
        if (stored and self._ply == len(self.puzzle.moves) - 1) or (self.accept_any_mate and self.board.is_checkmate()):
            self.accepted.append(move.uci())
            self.accepted_san.append(san)
            self.solved = True
            return self._record(move.uci(), Verdict.SOLVED, True, f"{san} is correct: puzzle solved.")
        if not stored:
            self.board.pop()
            return self._record(move.uci(), Verdict.WRONG, True, f"{san} is not the solution: puzzle failed.")
        self.accepted.append(move.uci())
        self.accepted_san.append(san)
        reply = self.puzzle.moves[self._ply + 1]
        self._push_reply(reply)
        self._ply += 2
        return self._record(
            move.uci(),
            Verdict.CORRECT,
            False,
            f"{san} is correct. The opponent replied {self.last_reply_san} ({reply}); your move.",
            reply=reply,
            reply_san=self.last_reply_san,
        )

    def _record(self, answer: str, verdict: Verdict, done: bool, feedback: str, **extra: Any) -> Judgement:
        self.done = done
        self.history.append({"answer": answer[:200], "verdict": verdict.value, "done": done, **extra})
        return Judgement(verdict=verdict, done=done, feedback=feedback, **extra)


class ChessEnvironment(Environment):
    """The runtime's view of a :class:`PuzzleEpisode`: ``step(action)`` takes the move (UCI text)."""

    def __init__(self, puzzle: Puzzle, accept_any_mate: bool = False):
        self.episode = PuzzleEpisode(puzzle, accept_any_mate)

    def reset(self) -> dict[str, Any]:
        return self.episode.observation()

    def step(self, action: Any) -> StepResult:
        before = self.episode.board.copy(stack=False)
        judgement = self.episode.play(action)
        observation = self.episode.observation()
        observation["verdict"] = judgement.verdict.value
        observation["feedback"] = judgement.feedback
        if judgement.verdict in (Verdict.MALFORMED, Verdict.ILLEGAL):
            observation["error"] = judgement.feedback
        info = {"puzzle_id": self.episode.puzzle.puzzle_id, **self.episode.history[-1]}
        return StepResult(
            observation=observation,
            done=judgement.done,
            info=info,
            graded=_spellings(before, info["answer"], judgement.verdict),
        )

    def gold_answers(self) -> tuple[str, ...]:
        """The solver's moves of the stored line, UCI."""
        return self.episode.puzzle.solver_moves

    def reward(self) -> float:
        return self.episode.reward


def _spellings(board: chess.Board, uci: str, verdict: Verdict) -> tuple[str, ...]:
    """The judged move as the model may have written it: UCI, SAN, SAN without ``+``/``#`` (none for
    a malformed answer: no move was judged)."""
    if verdict is Verdict.MALFORMED:
        return ()
    if verdict is Verdict.ILLEGAL:
        return (uci,)
    san = board.san(chess.Move.from_uci(uci))
    return tuple(dict.fromkeys((uci, san, san.rstrip("+#"))))


def score_line(row: Mapping[str, Any], answers: list[str | None], accept_any_mate: bool = False) -> float:
    """Reward of an episode whose answers are ``answers`` in order (unused ones ignored; too few = unsolved)."""
    episode = PuzzleEpisode.from_row(row, accept_any_mate)
    for answer in answers:
        if episode.done:
            break
        episode.play(answer)
    return episode.reward
