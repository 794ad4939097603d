"""The chess verifier/environment on real Lichess puzzles: the stored line wins, wrong moves lose,
any mate wins, malformed and illegal answers get exactly one retry each."""

from __future__ import annotations

import csv
import functools

import chess
import pytest

from chess_puzzles.env import ChessEnvironment, PuzzleEpisode, Verdict, score_line
from chess_puzzles.prep import SOURCE_FILE
from chess_puzzles.puzzle import parse_puzzle
from whale.domain import default_data_root


@functools.cache
def real_rows() -> dict[str, dict[str, str]]:
    path = default_data_root() / "chess_puzzles" / SOURCE_FILE
    with path.open(newline="", encoding="utf-8") as handle:
        return {row["PuzzleId"]: row for row in csv.DictReader(handle)}


def solver_line(row):
    return row["Moves"].split()[1::2]


def mates_after(row, plies: int) -> list[str]:
    """Every mating move of the solver at its move number ``plies`` of the stored line."""
    board = chess.Board(row["FEN"])
    for uci in row["Moves"].split()[: 2 * plies + 1]:
        board.push_uci(uci)
    out = []
    for move in board.legal_moves:
        board.push(move)
        if board.is_checkmate():
            out.append(move.uci())
        board.pop()
    return sorted(out)


def test_stored_line_scores_one_on_every_real_puzzle():
    rows = list(real_rows().values())
    assert len(rows) > 2900
    rewards = [score_line(row, solver_line(row)) for row in rows]
    assert rewards == [1.0] * len(rows)


@pytest.mark.parametrize("puzzle_id", ["00008", "0000D", "0009B", "000Vc", "001KR", "00LRq"])
def test_every_wrong_legal_first_move_scores_zero_unless_mates_are_accepted_and_it_mates(puzzle_id):
    row = real_rows()[puzzle_id]
    episode = PuzzleEpisode.from_row(row)
    stored = solver_line(row)[0]
    others = [m.uci() for m in episode.board.legal_moves if m.uci() != stored]
    assert others
    mating = set(mates_after(row, 0))
    for move in others:
        assert score_line(row, [move]) == 0.0, move  # the paper: only the stored move counts
        assert score_line(row, [move], accept_any_mate=True) == (1.0 if move in mating else 0.0), move
    # the losing verdict ends the episode at once
    loser = next(m for m in others if m not in mating)
    episode = PuzzleEpisode.from_row(row)
    result = episode.play(loser)
    assert (result.verdict, result.done, episode.reward) == (Verdict.WRONG, True, 0.0)


#: real puzzles where the stored last move mates and another move mates too
ALTERNATIVE_MATES = [("001KR", "d1d8"), ("004kB", "f8f1"), ("00Lvv", "e8d8"), ("00LRq", "a7b8r")]


@pytest.mark.parametrize(("puzzle_id", "alternative"), ALTERNATIVE_MATES)
def test_alternative_mate_is_wrong_by_default_and_solves_with_any_mate(puzzle_id, alternative):
    """The paper counts only the stored move; Lichess (``spec.experiment.domainOptions.chessMove: anyMate``) accepts both."""
    row = real_rows()[puzzle_id]
    line = solver_line(row)
    assert alternative != line[-1]
    assert alternative in mates_after(row, len(line) - 1)
    for any_mate, verdict, reward in [(False, Verdict.WRONG, 0.0), (True, Verdict.SOLVED, 1.0)]:
        episode = PuzzleEpisode.from_row(row, accept_any_mate=any_mate)
        for move in line[:-1]:
            assert episode.play(move).verdict is Verdict.CORRECT
        result = episode.play(alternative)
        assert (result.verdict, result.done, episode.reward) == (verdict, True, reward)
        # the stored move still solves it either way
        assert score_line(row, line, accept_any_mate=any_mate) == 1.0


def test_an_underpromotion_that_mates_is_accepted_only_with_any_mate():
    """00LRq ends with a7b8q; the rook promotion mates too."""
    row = real_rows()["00LRq"]
    line = solver_line(row)
    assert line[-1] == "a7b8q"
    assert score_line(row, [*line[:-1], "a7b8r"]) == 0.0
    assert score_line(row, [*line[:-1], "a7b8r"], accept_any_mate=True) == 1.0


def test_the_spec_picks_the_move_rule():
    """spec.experiment.domainOptions.chessMove reaches every environment the domain makes (training, search and eval)."""
    from chess_puzzles import ChessPuzzles, to_item

    row = real_rows()["001KR"]
    line = solver_line(row)
    domain = ChessPuzzles()
    assert domain.accept_any_mate is False  # the paper's rule unless the spec says otherwise
    rewards = {}
    for rule in ("stored", "anyMate"):
        env = domain.with_options({"chessMove": rule}).make_env(to_item(row))
        for move in line[:-1]:
            env.step(move)
        result = env.step("d1d8")
        assert result.done
        rewards[rule] = env.reward()
    assert rewards == {"stored": 0.0, "anyMate": 1.0}


def test_environment_replies_with_the_stored_line():
    row = real_rows()["00008"]  # f2g3 e6e7 b2b1 b3c1 b1c1 h6c1
    episode = PuzzleEpisode.from_row(row)
    assert episode.replies == ["f2g3"]
    first = episode.play("e6e7")
    assert (first.verdict, first.done, first.reply) == (Verdict.CORRECT, False, "b2b1")
    assert episode.accepted == ["e6e7"] and episode.replies == ["f2g3", "b2b1"]
    second = episode.play("b3c1")
    assert second.reply == "b1c1" and not second.done
    assert episode.play("h6c1").verdict is Verdict.SOLVED
    with pytest.raises(RuntimeError, match="episode is over"):
        episode.play("h6c1")


@pytest.mark.parametrize("junk", [None, "", "   ", "Nf3 please", "e9e4", "0000", 42, {"move": "e6e7"}])
def test_one_malformed_answer_is_forgiven_and_the_position_is_unchanged(junk):
    row = real_rows()["00008"]
    episode = PuzzleEpisode.from_row(row)
    before = episode.board.fen()
    result = episode.play(junk)
    assert (result.verdict, result.done) == (Verdict.MALFORMED, False)
    assert "UCI" in result.feedback
    assert episode.board.fen() == before
    assert score_line(row, [junk, *solver_line(row)]) == 1.0


def test_a_second_malformed_answer_ends_the_puzzle():
    row = real_rows()["00008"]
    assert score_line(row, ["hmm", "e6e7", "still thinking", *solver_line(row)[1:]]) == 0.0
    episode = PuzzleEpisode.from_row(row)
    episode.play("hmm")
    result = episode.play("no idea")
    assert (result.verdict, result.done) == (Verdict.MALFORMED, True)


def test_one_illegal_move_is_forgiven_a_second_ends_the_puzzle():
    row = real_rows()["00008"]
    line = solver_line(row)
    assert score_line(row, ["a1a8", *line]) == 1.0  # a1 is empty: illegal
    assert score_line(row, ["a1a8", line[0], "a1a8", *line[1:]]) == 0.0
    episode = PuzzleEpisode.from_row(row)
    first = episode.play("a1a8")
    assert (first.verdict, first.done) == (Verdict.ILLEGAL, False)
    assert "not a legal move" in first.feedback


def test_malformed_and_illegal_budgets_are_separate():
    row = real_rows()["00008"]
    assert score_line(row, ["??", "a1a8", *solver_line(row)]) == 1.0


def test_uppercase_and_spaces_are_read_as_uci():
    row = real_rows()["00008"]
    assert score_line(row, [" E6E7 ", *solver_line(row)[1:]]) == 1.0


def test_too_few_answers_leave_the_puzzle_unsolved():
    row = real_rows()["00008"]
    assert score_line(row, solver_line(row)[:-1]) == 0.0


def test_environment_adapter_shows_the_position_but_never_the_solution():
    row = real_rows()["0000D"]
    env = ChessEnvironment(parse_puzzle(row))
    task = env.reset()
    assert task["side_to_move"] == "black"
    assert task["last_reply"] == "d3d6" and task["last_reply_san"] == "Qd6"
    assert {"uci": "f8d8", "san": "Rd8"} in task["legal_moves"]
    assert task["board"].count("\n") == 7
    assert "0000D" not in str(task) and "f6d8" not in str(task.get("accepted_moves"))
    illegal = env.step("a1a2")
    assert not illegal.done and illegal.observation["verdict"] == "illegal"
    assert "a1a2" in illegal.observation["error"]
    assert illegal.info["puzzle_id"] == "0000D"
    ok = env.step("f8d8")
    assert not ok.done and "error" not in ok.observation
    assert ok.observation["accepted_moves_san"] == ["Rd8"] and ok.observation["last_reply"] == "d6d8"
    done = env.step("f6d8")
    assert done.done and done.observation["solved"] and env.reward() == 1.0
    assert done.observation["legal_moves"] == []  # not computed once the episode is over
