"""SmolLM2-135M-Instruct evaluated with the search h0 end to end on the CPU: real model, real harness
process, real BM25 index over the shared corpus, real verifier, one item per available benchmark."""

from __future__ import annotations

import asyncio
import collections
import json

import pytest

from search_qa import SearchQA
from search_qa.data import missing_benchmarks
from whale.domain import default_data_root
from whale.harness.runner import run_episodes
from whale.inference.base import SamplingParams
from whale.inference.transformers_backend import TransformersClient
from whale.spec import Data

# the first test pays the shared SmolLM2 load (~20-50 s) in its setup
pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]


def test_smollm2_h0_eval_one_item_per_benchmark(smollm2, bm25_retriever, tmp_path, one_torch_thread):
    model, tokenizer = smollm2
    domain = SearchQA(retriever=bm25_retriever)
    test = domain.load_split("test", Data(testSize=1))
    assert len(test) == 6 and "triviaqa" in missing_benchmarks(default_data_root())
    traces = tmp_path / "traces.jsonl"
    client = TransformersClient(model, tokenizer, model_name="smollm2-135m")
    episodes = asyncio.run(
        run_episodes(
            domain, domain.h0_path(), client, test, SamplingParams(temperature=0.0, max_tokens=32), traces=traces
        )
    )
    per = collections.Counter(e.subset for e in episodes)
    assert set(per) == {i["subset"] for i in test}
    for ep in episodes:
        assert ep.error is None, ep.error
        assert ep.reward in (0.0, 1.0) and 1 <= ep.turns <= 2
        assert ep.messages[0] == {"role": "system", "content": "Answer factual questions using search when needed."}
    assert len(traces.read_text().splitlines()) == 6
    assert all(json.loads(line)["subset"] for line in traces.read_text().splitlines())
