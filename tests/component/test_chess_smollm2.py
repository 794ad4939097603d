"""SmolLM2-135M-Instruct evaluated with the chess h0 on the CPU: real model (in-process transformers
backend), real sandboxed harness, real environment and verifier, real test-split puzzles. The model is
far too small to solve puzzles; the point is that every episode reaches a verdict and leaves a
complete trace."""

from __future__ import annotations

import asyncio
import json

import chess
import pytest

from chess_puzzles.puzzle import parse_puzzle
from whale import domains
from whale.harness.runner import run_episodes
from whale.inference.base import SamplingParams
from whale.inference.transformers_backend import TransformersClient
from whale.spec import Data

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

VERDICTS = {"correct", "solved", "wrong", "malformed", "illegal"}


def legal_move_count(item) -> int:
    return chess.Board(parse_puzzle(item).start_fen).legal_moves.count()


def test_smollm2_h0_eval_on_test_puzzles(smollm2, tmp_path):
    model, tokenizer = smollm2
    domain = domains.load("chess_puzzles")
    # the two test puzzles with the fewest legal moves: the shortest h0 prompts, so the CPU run stays short
    items = sorted(domain.load_split("test", Data()), key=lambda item: (legal_move_count(item), item["id"]))[:2]
    traces = tmp_path / "traces.jsonl"
    client = TransformersClient(model, tokenizer, model_name="smollm2-135m")
    episodes = asyncio.run(
        run_episodes(
            domain, domain.h0_path(), client, items, SamplingParams(temperature=0.0, max_tokens=12), traces=traces
        )
    )
    assert [e.item_id for e in episodes] == [i["id"] for i in items]
    lines = {line["item_id"]: line for line in map(json.loads, traces.read_text().splitlines())}
    assert sorted(lines) == sorted(i["id"] for i in items)
    for episode in episodes:
        trace = lines[episode.item_id]
        assert episode.error is None, episode.error
        assert trace["reward"] == episode.reward and episode.reward in (0.0, 1.0)
        assert trace["end"] in ("env_done", "max_turns") and 1 <= trace["turns"] <= 9
        assert trace["prompt_tokens"] > 0 and trace["completion_tokens"] > 0
        assert trace["domain"] == "chess_puzzles" and trace["model"] == "smollm2-135m"
        messages, steps = trace["messages"], trace["steps"]
        assert messages[0]["role"] == "system" and "FEN: " in messages[1]["content"]
        model_steps = [s for s in steps if s["type"] == "model"]
        assert len(model_steps) == trace["turns"]
        assert all(messages[s["message_index"]]["role"] == "assistant" for s in model_steps)
        actions = [s for s in steps if s["type"] == "action"]
        assert len(actions) == trace["turns"]  # h0 turns every reply into exactly one move attempt
        assert all(a["result"]["observation"]["verdict"] in VERDICTS for a in actions)
        assert all(a["info"]["puzzle_id"] == episode.item_id for a in actions)
        last = actions[-1]["result"]
        if trace["end"] == "env_done":
            assert last["done"] and last["observation"]["solved"] == (episode.reward == 1.0)
