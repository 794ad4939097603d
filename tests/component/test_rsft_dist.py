"""The weight phase on two ranks (gloo on the CPU), through the workload entrypoint.

* In-process ranks (``torch.multiprocessing``, torchrun's environment set by hand): rank 1 gets a
  store double that fails on any use, so the run finishing proves only rank 0 touched the store;
  both ranks end with the same weights, and those equal a single-process run's on the same data
  (greedy sampling: same prompts, same kept trajectories, checked on the metrics lines).
* The operator's launch command (``torchrun ... -m whale.workloads train``): SIGKILL of rank 1
  mid-phase fails the whole attempt (no result); the retry resumes from the last checkpoint and
  finishes with one metrics line per step.
"""

from __future__ import annotations

import faulthandler
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.component.rsft_support import RUN, spec, tiny_model_dir, write_request
from tests.fixtures.tolerance import assert_adam_trained_close
from whale.core import layout
from whale.store import open_store

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
import torch.multiprocessing as mp  # noqa: E402

PHASE = "c01-weight"
TARGET = 2


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory) -> Path:
    return tiny_model_dir(tmp_path_factory.getbasetemp())


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _greedy_spec(model_dir: Path, **rsft):
    knobs = {
        "promptsPerStep": 8,
        "rolloutsPerPrompt": 2,
        "miniBatchSize": 4,
        "microBatchSizePerGpu": 2,
        "learningRate": 1e-3,
        "scoreThreshold": 0.0,
        "sampling": {"temperature": 0.0, "maxResponseTokens": 12},
    }
    knobs.update(rsft)
    wire = spec(model_dir, **knobs)
    wire["inference"]["maxConcurrency"] = 1  # one sequence per generate call: batch padding cannot flip a token
    return wire


def _single_process_twin(wire: dict, ranks: int) -> dict:
    """The one-process spec that makes the same updates as ``wire`` (miniBatchScope perRank) on ``ranks``."""
    rsft = wire["rsft"]
    return {**wire, "rsft": {**rsft, "miniBatchScope": "global", "miniBatchSize": rsft["miniBatchSize"] * ranks}}


class ForbiddenStore:
    """Test double for a follower's store: any use is a failure of the rank-0-only rule."""

    def __getattr__(self, name: str):
        raise AssertionError(f"rank {os.environ.get('RANK')} used the store (.{name}); only rank 0 may")


def _rank_main(rank: int, world: int, port: int, store_root: str, out_dir: str) -> None:
    # a rank that aborts (a rare SIGABRT in gloo's teardown, once in CI) prints every thread's Python stack
    faulthandler.enable()
    os.environ.update(
        RANK=str(rank),
        LOCAL_RANK=str(rank),
        WORLD_SIZE=str(world),
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        WHALE_DIST_TIMEOUT_S="120",
    )
    from whale.rsft import dist
    from whale.workloads import train

    real_follow = dist.follow

    def follow_and_keep_weights(trainer):  # the follower's final weights, for the comparison
        calls = real_follow(trainer)
        torch.save({k: v.detach().clone() for k, v in trainer.model.state_dict().items()}, f"{out_dir}/rank{rank}.pt")
        return calls

    dist.follow = follow_and_keep_weights
    store = open_store(store_root) if rank == 0 else ForbiddenStore()
    result = train.run_train(store, RUN, PHASE)  # type: ignore[arg-type]  # ForbiddenStore: a double that raises on use
    assert (result is not None) == (rank == 0)


def _checkpoint_weights(root: Path, step: int) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    folder = open_store(str(root)).local_path(layout.checkpoint_prefix(RUN, step))
    assert folder is not None
    return load_file(folder / "model.safetensors")


def _optimizer_updates(root: Path, *phases: str) -> int:
    """The optimiser updates the phases' metrics lines count (default: PHASE's)."""
    store = open_store(str(root))
    return sum(
        ln["optimizerUpdates"]
        for phase in phases or (PHASE,)
        for ln in store.read_jsonl(layout.metrics_key(RUN, phase))
    )


def _data_of(root: Path, phase: str = PHASE) -> list[tuple]:
    lines = open_store(str(root)).read_jsonl(layout.metrics_key(RUN, phase))
    return [(ln["step"], ln["prompts"], ln["kept"], ln["tokensTrained"], round(ln["rewardMean"], 6)) for ln in lines]


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_two_ranks_train_like_one_process_and_only_rank0_uses_the_store(tmp_path, model_dir):
    from whale.workloads.train import run_train

    wire = _greedy_spec(model_dir)  # miniBatchSize 4 per rank (perRank, the paper's scope)
    single, multi = tmp_path / "single", tmp_path / "multi"
    # per rank on 2 ranks = global with 2 x miniBatchSize: the same minibatches, the same token-mean update
    write_request(open_store(str(single)), PHASE, _single_process_twin(wire, ranks=2), target=TARGET)
    write_request(open_store(str(multi)), PHASE, wire, target=TARGET)

    run_train(open_store(str(single)), RUN, PHASE)
    mp.spawn(_rank_main, args=(2, _free_port(), str(multi), str(tmp_path)), nprocs=2, join=True)

    result = open_store(str(multi)).read_json(layout.result_key(RUN, PHASE))
    assert result["finalStep"] == TARGET
    data = _data_of(multi)
    assert data == _data_of(single), "the two runs did not train on the same data"
    assert sum(d[3] for d in data) > 0, "nothing was trained: the comparison would be vacuous"

    rank0 = _checkpoint_weights(multi, TARGET)
    rank1 = torch.load(tmp_path / "rank1.pt")
    reference = _checkpoint_weights(single, TARGET)
    start = _checkpoint_weights_from_dir(model_dir)
    moved = max(float((reference[k] - start[k]).abs().max()) for k in reference)
    assert moved > 1e-4, "training did not change the weights"
    updates = _optimizer_updates(single)
    assert updates == _optimizer_updates(multi) > 0
    lr = wire["rsft"]["learningRate"]
    for name, value in rank0.items():
        # every rank applies the same all-reduced gradient: the same bits
        torch.testing.assert_close(rank1[name], value, rtol=0, atol=0, msg=f"ranks differ on {name}")
        assert_adam_trained_close(
            value, reference[name], lr=lr, updates=updates, msg=f"2-rank and 1-process weights differ on {name}"
        )


def _checkpoint_weights_from_dir(folder: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(folder / "model.safetensors")


# ----- the operator's torchrun command: a dying rank fails the attempt ----------------------------------


def _torchrun(store_root: Path, port: int) -> list[str]:
    """The operator's train command for gpusPerNode=2 on one node, with the ``--`` that keeps torchrun
    from taking the workload's ``--run`` as an abbreviation of its own ``--run-path``."""
    torchrun = Path(sys.executable).with_name("torchrun")
    return [
        str(torchrun),
        "--nnodes=1",
        "--nproc-per-node=2",
        "--node-rank=0",
        "--master-addr=127.0.0.1",
        f"--master-port={port}",
        "-m",
        "--",
        "whale.workloads",
        "train",
        "--store",
        f"file://{store_root}",
        "--run",
        RUN,
        "--phase",
        PHASE,
    ]


def _children(pid: int) -> list[int]:
    out: list[int] = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        text = (task / "children").read_text().split()
        out += [int(c) for c in text]
    return out


def _rank_pid(torchrun_pid: int, rank: int) -> int | None:
    for child in _children(torchrun_pid):
        try:
            env = Path(f"/proc/{child}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if f"RANK={rank}".encode() in env:
            return child
    return None


def _wait(predicate, deadline_s: float, what: str):
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.mark.slow
@pytest.mark.timeout(150 + 90 + 150 + 60)  # its own bounds (first checkpoint, the kill, the retry) and set-up
def test_a_dying_rank_fails_the_attempt_and_the_retry_resumes(tmp_path, model_dir):
    root = tmp_path / "store"
    store = open_store(str(root))
    target = 6
    write_request(store, PHASE, _greedy_spec(model_dir, checkpointEverySteps=1), target=target)
    env = {**os.environ, "WHALE_DIST_TIMEOUT_S": "60", "PYTHONPATH": os.getcwd()}
    log = tmp_path / "attempt1.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(_torchrun(root, _free_port()), env=env, stdout=out, stderr=subprocess.STDOUT)
        try:
            _wait(
                lambda: store.exists(layout.checkpoint_complete_key(RUN, 1)) or proc.poll() is not None,
                150,
                "the first checkpoint",
            )
            assert proc.poll() is None, f"attempt 1 ended early:\n{log.read_text()[-3000:]}"
            victim = _rank_pid(proc.pid, 1)
            assert victim is not None, "rank 1 not found among torchrun's children"
            os.kill(victim, 9)
            rc = proc.wait(timeout=90)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    assert rc != 0, "torchrun succeeded although rank 1 was killed"
    assert not store.exists(layout.result_key(RUN, PHASE)), "a result was written by a failed attempt"
    steps_before = len(store.read_jsonl(layout.metrics_key(RUN, PHASE)))
    assert steps_before < target

    retry = subprocess.run(_torchrun(root, _free_port()), env=env, capture_output=True, text=True, timeout=150)
    assert retry.returncode == 0, retry.stderr[-3000:]
    assert "resuming phase" in retry.stderr, "the retry did not resume from the checkpoint"
    result = store.read_json(layout.result_key(RUN, PHASE))
    assert result["finalStep"] == target
    steps = [line["step"] for line in store.read_jsonl(layout.metrics_key(RUN, PHASE))]
    assert steps == list(range(1, target + 1))
