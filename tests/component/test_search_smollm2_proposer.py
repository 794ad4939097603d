"""A real local model as the proposer: SmolLM2-135M-Instruct served by the project's OpenAI-compatible
server over loopback HTTP, driven by the built-in agent loop. The model is far too small to write a
good harness; the point is that whatever it writes (text, broken code, nothing) is handled and the
phase ends with a result."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.component.test_search_phase import PHASE, RUN, SETTINGS, _request, _spec
from tests.fixtures.proposer_double import DigitSayerPolicyDouble
from whale.core import layout
from whale.metaharness.archive import Archive
from whale.metaharness.proposer.openai_agent import OpenAIAgentProposer, ProposerClient
from whale.store import open_store
from whale.workloads.search import run_search


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_smollm2_proposer_runs_one_iteration_end_to_end(tmp_path: Path, smollm2):
    from whale.inference.server import create_app, serve_in_thread
    from whale.inference.transformers_backend import TransformersClient

    model, tokenizer = smollm2
    served = TransformersClient(model, tokenizer, max_batch_size=1, model_name="smollm2-135m")
    store = open_store(str(tmp_path / "store"))
    with serve_in_thread(create_app(served, "smollm2-135m")) as url:
        spec = _spec(url)
        spec["harnessSearch"]["proposer"].update({"maxTurns": 1, "timeoutSeconds": 400})
        _request(store, spec, iterations=2)
        proposer = OpenAIAgentProposer(ProposerClient(url, "smollm2-135m", request_timeout_s=400), reply_tokens=48)
        result = run_search(store, RUN, PHASE, client=DigitSayerPolicyDouble(), proposer=proposer, settings=SETTINGS)

    assert result.iterations == 2
    assert store.exists(layout.result_key(RUN, PHASE))
    archive = Archive(store, layout.archive_prefix(RUN, 1))
    record = store.read_json(archive.iteration_key(2))
    assert record["backend"] == "openai" and record["complete"] is True
    assert record["turns"] >= 1 and record["tokens"] > 0
    transcript = store.read_text(archive.key("iterations", "02-transcript.jsonl"))
    assert '"role": "assistant"' in transcript  # the model's own words are archived
    # every candidate it produced (maybe none) reached a final status
    assert all(c.status.final for c in archive.candidates())
    lines = store.read_jsonl(layout.metrics_key(RUN, PHASE))
    assert [m["iteration"] for m in lines] == [1, 2]
