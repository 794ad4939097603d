"""SmolLM2-135M-Instruct evaluated with the math h0 end to end on the CPU: real model, real harness
process, real code sandbox, real verifier. The model is far too small to solve AIME; the point is
that every episode runs to a verdict and leaves a complete trace."""

from __future__ import annotations

import asyncio
import json

import pytest

from math_reasoning import MathReasoning
from whale.harness.runner import run_episodes
from whale.inference.base import SamplingParams
from whale.inference.transformers_backend import TransformersClient
from whale.spec import Data
from whale.tools.code import CodeLimits, LocalCodeRunner

# the first test pays the shared SmolLM2 load (~20-50 s) in its setup
pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]


def test_smollm2_h0_eval_on_aime_items(smollm2, tmp_path, one_torch_thread):
    model, tokenizer = smollm2
    domain = MathReasoning(runner=LocalCodeRunner(CodeLimits(timeout_s=5)))
    items = domain.load_split("test", Data(testSize=1)) + [
        domain.item_from_raw({"id": "easy-1", "problem": "What is 2 + 3?", "answer": "5"})
    ]
    traces = tmp_path / "traces.jsonl"
    client = TransformersClient(model, tokenizer, model_name="smollm2-135m")
    episodes = asyncio.run(
        run_episodes(
            domain, domain.h0_path(), client, items, SamplingParams(temperature=0.0, max_tokens=32), traces=traces
        )
    )
    assert [e.item_id for e in episodes] == [i["id"] for i in items]
    for ep in episodes:
        assert ep.error is None, ep.error
        assert ep.reward in (0.0, 1.0)
        assert 1 <= ep.turns <= 2
        assert ep.completion_tokens > 0
        assert (
            ep.messages[0]["role"] == "user" and "\\boxed{'The final answer goes here.'}" in ep.messages[0]["content"]
        )
        assert any(m["role"] == "assistant" for m in ep.messages)
    lines = [json.loads(line) for line in traces.read_text().splitlines()]
    assert sorted(line["item_id"] for line in lines) == sorted(i["id"] for i in items)
    assert all("reward" in line and "messages" in line for line in lines)
