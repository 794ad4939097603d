"""No gold answer ever enters the harness process, in any of the four domains.

The runtime talks to the harness process only through ``HarnessProcess._request`` (the task from
``Environment.reset()``, environment observations, tool results, model replies and the episode's state;
``StepResult.info`` stays in the trace). :class:`WireTap` is a real harness process whose outgoing
requests are also recorded; each test runs a whole episode of the domain's h0 through it, with the
domain's real environment, tools and verifier and a scripted model, and asserts that no gold string
(the answer, ``golden_answers``, the puzzle's solution beyond what was played, its id) is in any request.
The environment observations in the trace are checked too, the final one included (the runtime never
sends that one: the episode ends on it).
"""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any

import chess
import pytest

from chess_puzzles import DOMAIN as CHESS
from chess_puzzles.prep import SOURCE_FILE
from math_reasoning import MathReasoning
from search_qa import SearchQA
from synthetic import DOMAIN as SYNTHETIC
from whale.domain import Domain, default_data_root
from whale.harness.process import HarnessProcess
from whale.harness.runner import EpisodeRunner
from whale.harness.trace import Episode
from whale.inference.base import SamplingParams
from whale.inference.scripted import ScriptedClient
from whale.tools.code import CodeLimits, LocalCodeRunner
from whale.tools.retrieval_index import BM25Retriever, Passage


class WireTap(HarnessProcess):
    """A real harness process that also records every request sent to it (function + JSON arguments)."""

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.sent: list[str] = []

    async def _request(self, fn: str, kwargs: dict[str, Any], timeout_s: float) -> Any:
        self.sent.append(json.dumps({"fn": fn, "kwargs": kwargs}))
        return await super()._request(fn, kwargs, timeout_s)


async def episode_through_tap(domain: Domain, item: dict[str, Any], replies: list[Any]) -> tuple[Episode, WireTap]:
    tap = WireTap(domain.h0_path(), domain.allowed_imports)
    async with tap:
        episode = await EpisodeRunner(domain, tap, ScriptedClient(replies), SamplingParams()).run_episode(item)
    assert episode.error is None, episode.error
    return episode, tap


def observations(episode: Episode) -> list[str]:
    return [json.dumps(s["result"]) for s in episode.steps if s["type"] == "action" and s["result"]["kind"] == "env"]


def keys(payload: Any) -> set[str]:
    """Every dict key anywhere in a JSON value."""
    if isinstance(payload, dict):
        return set(payload) | {k for v in payload.values() for k in keys(v)}
    if isinstance(payload, list):
        return {k for v in payload for k in keys(v)}
    return set()


def tool_call(name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    return {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": name, "arguments": json.dumps(arguments)}}
        ],
    }


async def test_math_gold_answer_never_reaches_the_harness() -> None:
    gold = "98765"
    item = {"id": "gold-math-1", "problem": "What is six times seven?", "answer": gold}
    domain = MathReasoning(runner=LocalCodeRunner(CodeLimits(timeout_s=10)))
    replies = [tool_call("code_interpreter", {"code": "print(6 * 7)"}), "It is \\boxed{42}."]
    episode, tap = await episode_through_tap(domain, item, replies)
    assert [m["content"] for m in episode.messages if m["role"] == "tool"] == ["42\n"]  # the tool ran
    assert episode.reward == 0.0 and any(s.get("info", {}).get("gold") == gold for s in episode.steps)
    assert len(tap.sent) >= 4  # describe, start, parse, observe, parse
    assert any(item["problem"] in line for line in tap.sent)  # the tap sees what is sent: the task is
    assert any('"42\\n"' in line for line in tap.sent)  # and so is the tool result
    assert all(gold not in line for line in tap.sent + observations(episode))


async def test_search_golden_answers_never_reach_the_harness(tmp_path: Path) -> None:
    golden = ["Zanzibar Quokka", "quokka of zanzibar"]
    item = {
        "id": "gold-search-1",
        "question": "Which animal is on the coat of arms of Westeria?",
        "golden_answers": golden,
    }
    passages = [
        Passage(str(i), title, text, f"{title}\n{text}")
        for i, (title, text) in enumerate(
            [
                ("Westeria", "Westeria is a fictional country with a coat of arms showing a lion."),
                ("Coat of arms", "A coat of arms is a heraldic visual design on an escutcheon."),
            ]
        )
    ]
    domain = SearchQA(retriever=BM25Retriever(passages, tmp_path / "index"))
    replies = [tool_call("search", {"query_list": ["Westeria coat of arms"]}), "<answer>a lion</answer>"]
    episode, tap = await episode_through_tap(domain, item, replies)
    assert any("Westeria" in (m["content"] or "") for m in episode.messages if m["role"] == "tool")
    assert episode.reward == 0.0 and any(item["question"] in line for line in tap.sent)
    assert any(s.get("info", {}).get("golden_answers") == golden for s in episode.steps)
    for line in tap.sent + observations(episode):
        assert all(answer.lower() not in line.lower() for answer in golden), line


def long_puzzle() -> dict[str, str]:
    """A real Lichess puzzle whose solver plays at least three moves."""
    path = default_data_root() / "chess_puzzles" / SOURCE_FILE
    if not path.is_file():
        pytest.skip(f"{path} is not on this machine")
    with path.open(newline="", encoding="utf-8") as handle:
        for row in csv.DictReader(handle):
            if len(row["Moves"].split()) >= 6:
                return row
    raise AssertionError(f"{path}: no puzzle with three solver moves")


async def test_chess_solution_beyond_what_was_played_never_reaches_the_harness() -> None:
    row = long_puzzle()
    moves = row["Moves"].split()
    item = CHESS.item_from_raw(row)
    # the solver finds the first move, then answers twice with no move: the puzzle ends unsolved
    episode, tap = await episode_through_tap(CHESS, item, [f"<move>{moves[1]}</move>", "no idea", "still no idea"])
    assert episode.reward == 0.0 and episode.turns == 3
    assert [a["action"] for a in episode.actions] == [moves[1], None, None]
    assert sum(moves[2] in line for line in tap.sent) >= 1  # the opponent's reply to the played move is sent
    future = moves[3::2]  # the solver's moves not played yet
    sequences = [" ".join(moves[3:]), json.dumps(moves[3:])[1:-1], " ".join(future), json.dumps(future)[1:-1]]
    for line in tap.sent + observations(episode):
        assert row["Moves"] not in line and row["PuzzleId"] not in line
        assert all(seq not in line for seq in sequences), line
        payload = json.loads(line)
        assert not keys(payload) & {"Moves", "PuzzleId", "Themes", "Rating", "puzzle_id", "solution", "moves"}
    # the next solution move appears only as one of all the legal moves, as the position allows
    board = chess.Board(row["FEN"])
    for uci in moves[:3]:
        board.push_uci(uci)
    legal = {m.uci() for m in board.legal_moves}
    assert moves[3] in legal and len(legal) > 1


async def test_synthetic_task_carries_no_answer_field() -> None:
    """The synthetic task (repeat the digit) shows its answer by design; the answer field and the
    verifier's expectation still never cross."""
    item = {"id": "gold-syn-1", "digit": 4, "answer": "4"}
    episode, tap = await episode_through_tap(SYNTHETIC, item, ["<answer>4</answer>"])
    assert episode.reward == 1.0
    start = json.loads(next(line for line in tap.sent if json.loads(line)["fn"] == "start"))
    assert set(start["kwargs"]["task"]) == {"id", "digit", "question"}
    assert all(not keys(json.loads(line)) & {"answer", "expected"} for line in tap.sent)
