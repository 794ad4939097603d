"""The train workload end to end: ``python -m whale.workloads train`` on the synthetic domain with the
tiny model, sampling in-process through the harness runtime, everything through the store."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from pydantic.alias_generators import to_camel

from tests.component.rsft_support import RUN, spec, tiny_model_dir, write_request
from whale.core import layout
from whale.core.protocol import WeightPhaseResult, WeightStepMetrics
from whale.store import open_store

pytest.importorskip("transformers")
pytestmark = pytest.mark.slow

METRIC_KEYS = {to_camel(name) for name in WeightStepMetrics.model_fields}  # every field, on the wire


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory) -> Path:
    return tiny_model_dir(tmp_path_factory.getbasetemp())


def launch(store_dir: Path, phase: str) -> subprocess.Popen:
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "TOKENIZERS_PARALLELISM": "false"}
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "whale.workloads",
            "train",
            "--store",
            f"file://{store_dir}",
            "--run",
            RUN,
            "--phase",
            phase,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env=env,
        text=True,
    )


def run_to_end(store_dir: Path, phase: str, timeout_s: float = 110) -> str:
    proc = launch(store_dir, phase)
    out, _ = proc.communicate(timeout=timeout_s)
    assert proc.returncode == 0, out[-3000:]
    return out


def metrics(store, phase):
    return store.read_jsonl(layout.metrics_key(RUN, phase))


def kill_after_step_two(store, proc) -> str:
    """SIGKILL the phase process once its state says step 2 is done (bounded: 90 s); returns the state key."""
    latest = f"{layout.state_prefix(RUN, 'c01-weight')}/latest.json"
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        state = store.read_json_or_none(latest)
        if (state and state["step"] >= 2) or proc.poll() is not None:
            break
        time.sleep(0.05)
    assert proc.poll() is None, "the phase finished before it could be killed"
    proc.send_signal(signal.SIGKILL)
    proc.communicate(timeout=30)
    return latest


def test_several_rsft_steps_end_to_end_with_complete_metrics_and_checkpoints(tmp_path, model_dir):
    store = open_store(str(tmp_path))
    write_request(store, "c01-weight", spec(model_dir), target=3, save_steps=[2])
    run_to_end(tmp_path, "c01-weight")
    lines = metrics(store, "c01-weight")
    assert [line["step"] for line in lines] == [1, 2, 3]
    for line in lines:
        assert set(line) >= METRIC_KEYS
        parsed = WeightStepMetrics.model_validate(line)
        assert parsed.rollouts == 8 * 4 and 0 <= parsed.acceptance_rate <= 1
        assert parsed.kept == round(parsed.acceptance_rate * parsed.rollouts)
        assert (parsed.loss is None) == (parsed.kept == 0) and parsed.seconds_sampling > 0
        assert len(line["prompts"]) == 8
    result = WeightPhaseResult.model_validate(store.read_json(layout.result_key(RUN, "c01-weight")))
    assert (result.final_step, result.stopped_by, result.rollouts) == (3, "target", 96)
    for step in (2, 3):
        prefix = layout.checkpoint_prefix(RUN, step)
        names = {k.rsplit("/", 1)[-1] for k in store.list(prefix)}
        assert {"COMPLETE", "config.json", "model.safetensors", "tokenizer.json"} <= names
    assert not store.exists(layout.checkpoint_complete_key(RUN, 1))
    # a second launch of a finished phase changes nothing
    before = store.read_bytes(layout.metrics_key(RUN, "c01-weight"))
    run_to_end(tmp_path, "c01-weight")
    assert store.read_bytes(layout.metrics_key(RUN, "c01-weight")) == before


def test_a_killed_phase_resumes_with_the_same_data_order_and_step_count(tmp_path, model_dir):
    wire = spec(model_dir, checkpointEverySteps=1)
    reference_dir, killed_dir = tmp_path / "reference", tmp_path / "killed"
    ref_store, store = open_store(str(reference_dir)), open_store(str(killed_dir))
    for s in (ref_store, store):
        write_request(s, "c01-weight", wire, target=5)
    run_to_end(reference_dir, "c01-weight")

    proc = launch(killed_dir, "c01-weight")
    latest = kill_after_step_two(store, proc)
    assert not store.exists(layout.result_key(RUN, "c01-weight"))
    killed_at = store.read_json(latest)["step"]
    assert 2 <= killed_at < 5

    out = run_to_end(killed_dir, "c01-weight")
    assert f"resuming phase c01-weight at step {killed_at}" in out
    lines, ref_lines = metrics(store, "c01-weight"), metrics(ref_store, "c01-weight")
    assert [line["step"] for line in lines] == [1, 2, 3, 4, 5]  # one line per step, none twice
    assert [line["prompts"] for line in lines] == [line["prompts"] for line in ref_lines]
    result = store.read_json(layout.result_key(RUN, "c01-weight"))
    assert result["finalStep"] == 5 and result["rollouts"] == 5 * 32


def test_an_interrupted_phase_resumes_at_the_next_step_and_keeps_no_light_point(tmp_path, model_dir):
    """rsft.stepResume auto (the tiny model is small): a light resume point after every step, so a phase killed
    after step 2 resumes at step 3, never sampling step 2 again (before: from step 0, its last checkpoint); the
    light points go as later saves complete, so the phase leaves only its checkpoints (save step 4, target 5)."""
    store = open_store(str(tmp_path))
    write_request(store, "c01-weight", spec(model_dir), target=5, save_steps=[4])
    proc = launch(tmp_path, "c01-weight")
    latest = kill_after_step_two(store, proc)
    killed_at = store.read_json(latest)["step"]
    assert 2 <= killed_at < 4  # a light point: no save step or checkpointEverySteps asked for one

    out = run_to_end(tmp_path, "c01-weight")
    assert f"resuming phase c01-weight at step {killed_at}" in out
    assert f"step {killed_at}/5 reward" not in out and f"step {killed_at + 1}/5 reward" in out, out[-3000:]
    assert [line["step"] for line in metrics(store, "c01-weight")] == [1, 2, 3, 4, 5]  # none twice
    folders = {
        k.rstrip("/").rsplit("/", 1)[-1] for k in store.list(layout.checkpoints_prefix(RUN) + "/", recursive=False)
    }
    assert folders == {"step-000004", "step-000005"}


def test_a_step_with_no_accepted_trajectory_leaves_the_weights_untouched(tmp_path, model_dir):
    from safetensors.torch import load_file

    store = open_store(str(tmp_path))
    # a one-token reply cannot hold `<answer>digit</answer>` (digits are tokens of their own): every reward
    # is 0, and nothing is above the threshold (which lies in [0, 1): 1.0 is refused by the spec)
    write_request(store, "c01-weight", spec(model_dir, weightDecay=0.1, sampling={"maxResponseTokens": 1}), target=2)
    run_to_end(tmp_path, "c01-weight")
    lines = metrics(store, "c01-weight")
    assert [(line["kept"], line["loss"], line["tokensTrained"]) for line in lines] == [(0, None, 0)] * 2
    trained = load_file(str(tmp_path / layout.checkpoint_prefix(RUN, 2) / "model.safetensors"))
    base = load_file(str(model_dir / "model.safetensors"))
    assert trained.keys() == base.keys()
    assert all(trained[k].float().equal(base[k].float()) for k in base)


def test_stop_request_ends_the_phase_with_a_checkpoint_and_a_result(tmp_path, model_dir):
    store = open_store(str(tmp_path))
    write_request(store, "c02-weight", spec(model_dir), target=4, from_step=0)
    store.write_bytes(layout.stop_key(RUN, "c02-weight"), b"")
    run_to_end(tmp_path, "c02-weight")
    result = WeightPhaseResult.model_validate(store.read_json(layout.result_key(RUN, "c02-weight")))
    assert (result.final_step, result.stopped_by) == (0, "stop-request")
    assert store.exists(layout.checkpoint_complete_key(RUN, 0)) and metrics(store, "c02-weight") == []


def test_a_bad_request_fails_with_a_one_line_reason(tmp_path, model_dir):
    store = open_store(str(tmp_path))
    write_request(store, "c01-weight", spec(model_dir), target=1, from_step=3)
    proc = launch(tmp_path, "c01-weight")
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode != 0
    assert "targetStep (1) is before fromStep (3)" in out.strip().splitlines()[-1]
