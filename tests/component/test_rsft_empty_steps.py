"""A weight phase whose steps keep no trajectory: the real train workload (synthetic domain, tiny model,
harness process) under a harness that never submits the model's answer. Every step warns in the log,
logs ``kept: 0``, trains nothing, and the phase result lists the steps for the run's status."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.component.rsft_support import RUN, spec, tiny_model_dir, write_request
from whale.core import layout
from whale.core.protocol import WeightPhaseResult
from whale.store import open_store

pytestmark = [pytest.mark.slow, pytest.mark.timeout(400)]

#: reads the model's reply, then submits an answer that is never right (a digit is 0-9)
NEVER_RIGHT = """from whale.harness.api import BaseHarness, env_action


class Harness(BaseHarness):
    SYSTEM_PROMPT = "Answer inside <answer></answer>."
    USER_TEMPLATE = "{question}"
    MAX_TURNS = 1
    MAX_FORMAT_RETRIES = 0

    def parse_action(self, text, state):
        return env_action("<answer>ten</answer>")
"""


def test_steps_that_keep_nothing_warn_train_nothing_and_are_listed_in_the_result(
    tmp_path: Path, tmp_path_factory
) -> None:
    model_dir = tiny_model_dir(tmp_path_factory.getbasetemp())
    store = open_store(str(tmp_path))
    harness = layout.harness_key(RUN, "never-right")
    store.write_text(harness, NEVER_RIGHT)
    request = write_request(store, "c01-weight", spec(model_dir), target=2)
    store.write_json(
        layout.request_key(RUN, "c01-weight"),
        request.model_copy(update={"weight": request.weight.model_copy(update={"harness": harness})}).to_wire(),
    )
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "TOKENIZERS_PARALLELISM": "false"}
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "whale.workloads",
            "train",
            "--store",
            f"file://{tmp_path}",
            "--run",
            RUN,
            "--phase",
            "c01-weight",
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    log = done.stdout + done.stderr
    # a workload process freezes its long-lived objects before the first step and after it (whale.rsft.heap)
    assert log.count("long-lived objects out of garbage collection") == 2
    for step in (1, 2):
        assert (
            f"step {step} kept no trajectory: no reward of its 32 rollouts is above scoreThreshold 0.5 "
            "(reward mean 0.000); SFT skipped, the weights did not move"
        ) in log
    lines = store.read_jsonl(layout.metrics_key(RUN, "c01-weight"))
    assert [(line["kept"], line["loss"], line["tokensTrained"]) for line in lines] == [(0, None, 0), (0, None, 0)]
    result = WeightPhaseResult.model_validate(store.read_json(layout.result_key(RUN, "c01-weight")))
    assert result.empty_steps == [1, 2] and result.final_step == 2
    # nothing trained: the final checkpoint holds the base model's weights, byte for byte
    folder = store.local_path(layout.checkpoint_prefix(RUN, 2))
    assert folder is not None
    final = folder / "model.safetensors"
    from safetensors.torch import load_file

    base, after = load_file(model_dir / "model.safetensors"), load_file(final)
    assert base.keys() == after.keys() and all(base[k].equal(after[k]) for k in base)
