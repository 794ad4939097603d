"""The learning check: on the synthetic domain the tiny model's *training reward rises* under RSFT.

It can fail: the model starts well below perfect (a short warm-up taught it the format and a
little of the task), and the reward only rises if rejection sampling keeps the right rollouts,
SFT trains on exactly the generated tokens and the next step samples from the new weights. The
whole loop runs through the workload entrypoint in-process (``run_train``) and the store.
"""

from __future__ import annotations

import statistics
from pathlib import Path

import pytest

from tests.component.rsft_support import RUN, spec, tiny_model_dir, write_request
from whale.core import layout
from whale.store import open_store

pytest.importorskip("transformers")


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory) -> Path:
    return tiny_model_dir(tmp_path_factory.getbasetemp())


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_training_reward_rises_over_rsft_steps(tmp_path, model_dir):
    from whale.workloads.train import run_train

    store = open_store(str(tmp_path))
    wire = spec(
        model_dir,
        promptsPerStep=32,
        rolloutsPerPrompt=8,
        miniBatchSize=32,
        microBatchSizePerGpu=32,
        learningRate=3e-4,
        sftEpochs=4,
    )
    write_request(store, "c01-weight", wire, target=10)  # h0 as it is: the tiny model is taught under its prompt
    result = run_train(store, RUN, "c01-weight")
    rewards = [line["rewardMean"] for line in store.read_jsonl(layout.metrics_key(RUN, "c01-weight"))]
    assert result.final_step == 10 and len(rewards) == 10
    first, last = statistics.mean(rewards[:3]), statistics.mean(rewards[-3:])
    # 256 rollouts a step: the standard error of a 3-step mean is about 0.015 at these rewards
    assert last > first + 0.06, f"training reward did not rise: {[round(r, 3) for r in rewards]}"
