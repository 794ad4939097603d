"""The train workload end to end: ``python -m whale.workloads train`` on the synthetic domain with the
tiny model, sampling in-process through the harness runtime, everything through the store."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from pydantic.alias_generators import to_camel

from tests.component.rsft_support import RUN, spec, tiny_model_dir, write_request
from whale.core import layout
from whale.core.protocol import WeightPhaseResult, WeightStepMetrics
from whale.store import open_store

pytest.importorskip("transformers")
#: each test launches the workload up to three times (20-70 s a launch on an idle machine; a loaded one takes
#: several times that): bounded, with room for the load
pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]
#: one launch of the workload, to its end
LAUNCH_TIMEOUT_S = 300

METRIC_KEYS = {to_camel(name) for name in WeightStepMetrics.model_fields}  # every field, on the wire


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory) -> Path:
    return tiny_model_dir(tmp_path_factory.getbasetemp())


def launch(store_dir: Path | str, phase: str, env: dict[str, str] | None = None) -> subprocess.Popen:
    """The phase's workload process on the store at ``store_dir`` (a folder, or a URI such as ``s3://…`` with
    the ``env`` that reaches it)."""
    uri = store_dir if isinstance(store_dir, str) else f"file://{store_dir}"
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "TOKENIZERS_PARALLELISM": "false", **(env or {})}
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "whale.workloads",
            "train",
            "--store",
            uri,
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


def run_to_end(
    store_dir: Path | str, phase: str, timeout_s: float = LAUNCH_TIMEOUT_S, env: dict[str, str] | None = None
) -> str:
    proc = launch(store_dir, phase, env)
    out, _ = proc.communicate(timeout=timeout_s)
    assert proc.returncode == 0, out[-3000:]
    return out


def metrics(store, phase):
    return store.read_jsonl(layout.metrics_key(RUN, phase))


def kill_after_step_two(store, proc, by: str = "state") -> str:
    """SIGKILL the phase process once its state (``by="metrics"``: its metrics lines) says step 2 is done
    (bounded: a launch's timeout); returns the state key."""
    latest = f"{layout.state_prefix(RUN, 'c01-weight')}/latest.json"

    def done() -> int:
        if by == "metrics":
            return max((line["step"] for line in metrics(store, "c01-weight")), default=0)
        state = store.read_json_or_none(latest)
        return state["step"] if state else 0

    deadline = time.monotonic() + LAUNCH_TIMEOUT_S
    while time.monotonic() < deadline:
        if done() >= 2 or proc.poll() is not None:
            break
        time.sleep(0.05)  # a poll interval under a deadline, not a wait for an event
    assert proc.poll() is None, "the phase finished before it could be killed"
    proc.send_signal(signal.SIGKILL)
    proc.communicate(timeout=60)
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


def test_a_large_model_resumes_at_the_next_step_by_replaying_the_steps_since_its_checkpoint(
    tmp_path, model_dir, s3_server, s3_store
):
    """rsft.stepResume replay (auto's choice for weights and Adam moments over 4 GiB, asked for here on the tiny
    model), on S3: every step leaves its kept sequences before its metrics line, so a phase killed after step 2
    loads its checkpoint (step 1) and trains the steps since again from those records, sampling none of them
    again, and ends with the weights and data of a phase never killed (greedy sampling, one sequence per call:
    the same weights sample the same rollouts)."""
    from safetensors.torch import load_file

    from tests.fixtures.tolerance import assert_adam_trained_close

    wire = spec(
        model_dir,
        stepResume="replay",
        rolloutsPerPrompt=2,
        miniBatchSize=4,
        microBatchSizePerGpu=2,
        learningRate=1e-3,
        scoreThreshold=0.0,
        sampling={"temperature": 0.0, "maxResponseTokens": 12},
    )
    wire["inference"]["maxConcurrency"] = 1  # one sequence per generate call: batch padding cannot flip a token
    reference = open_store(str(tmp_path))
    for store in (reference, s3_store):
        write_request(store, "c01-weight", wire, target=5, save_steps=[1])
    run_to_end(tmp_path, "c01-weight")

    env = s3_server.env()
    proc = launch(s3_store.uri, "c01-weight", env)
    kill_after_step_two(s3_store, proc, by="metrics")
    assert not s3_store.exists(layout.result_key(RUN, "c01-weight"))
    killed_at = max(line["step"] for line in metrics(s3_store, "c01-weight"))
    assert 2 <= killed_at < 5
    records = set(s3_store.list(layout.replay_prefix(RUN, "c01-weight") + "/"))
    assert {layout.replay_key(RUN, "c01-weight", n) for n in range(2, killed_at + 1)} <= records

    out = run_to_end(s3_store.uri, "c01-weight", env=env)
    replayed = re.search(r"trained steps (\d+)-(\d+) again from their replay records", out)
    assert replayed is not None, out[-3000:]
    # from the checkpoint of step 1 (step 0, the base model, when its write had not finished)
    assert int(replayed[1]) in (1, 2) and int(replayed[2]) == killed_at
    for n in range(1, killed_at + 1):  # no step done before the kill is sampled again
        assert f"step {n}/5 reward" not in out, out[-3000:]
    assert f"step {killed_at + 1}/5 reward" in out, out[-3000:]

    lines, ref_lines = metrics(s3_store, "c01-weight"), metrics(reference, "c01-weight")
    assert [line["step"] for line in lines] == [1, 2, 3, 4, 5]  # one line per step, none twice
    data = [(ln["prompts"], ln["kept"], ln["tokensTrained"], round(ln["rewardMean"], 6)) for ln in lines]
    assert data == [(ln["prompts"], ln["kept"], ln["tokensTrained"], round(ln["rewardMean"], 6)) for ln in ref_lines]
    assert sum(ln["tokensTrained"] for ln in lines[int(replayed[1]) - 1 : killed_at]) > 0, "nothing to replay"
    with tempfile.TemporaryDirectory() as tmp:
        key = layout.checkpoint_prefix(RUN, 5) + "/model.safetensors"
        got = load_file(s3_store.download_file(key, Path(tmp) / "model.safetensors"))
    want = load_file(tmp_path / layout.checkpoint_prefix(RUN, 5) / "model.safetensors")
    updates = sum(ln["optimizerUpdates"] for ln in ref_lines)
    for name, value in want.items():
        assert_adam_trained_close(got[name], value, lr=1e-3, updates=updates, msg=name)
    assert s3_store.list(layout.replay_prefix(RUN, "c01-weight") + "/") == []  # the checkpoints hold them now


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
    out, _ = proc.communicate(timeout=LAUNCH_TIMEOUT_S)
    assert proc.returncode != 0
    assert "targetStep (1) is before fromStep (3)" in out.strip().splitlines()[-1]
