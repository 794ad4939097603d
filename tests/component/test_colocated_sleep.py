"""Colocated placement, the trainer's side: the vLLM server sleeps during each SFT update and is woken
before the next generation, through vLLM's dev-mode sleep endpoints.

The server is ``tests/fixtures/vllm_double.py``, a loopback *test double* that records every request
and keeps vLLM's sleep contract (no vLLM here, nor on the GPU machine: it cannot be carried); the
weight sync is the real ``VLLMReloadSync`` writing the tiny model's real checkpoint. The trainer is a
*recording stub* (what matters is when the server sleeps relative to the update, which it records)."""

from __future__ import annotations

from typing import Any

import pytest

from tests.fixtures.specs import flat
from tests.fixtures.vllm_double import running_vllm_double
from whale.core.spec import WhaleRunSpec
from whale.inference.vllm_control import VLLMControl, WeightSyncError
from whale.rsft.colocated import SleepDuringTraining, colocate

pytest.importorskip("torch")


def spec(**inference: Any) -> WhaleRunSpec:
    return WhaleRunSpec.model_validate(
        {
            "domain": "synthetic",
            "condition": "rsft_only",
            "model": {"name": "tiny"},
            "schedule": {"totalSteps": 2},
            "inference": {"backend": "vllm", **inference},
        }
    )


class RecordingTrainer:
    """A stub trainer: records what the server's sleep state was when the update ran."""

    def __init__(self, server: Any, fail: bool = False):
        self.server = server
        self.fail = fail
        self.asleep_during_update: list[set[str]] = []

    def train(self, examples: Any, *, lr: float, seed: int) -> str:
        self.asleep_during_update.append(set(self.server.asleep))
        if self.fail:
            raise RuntimeError("CUDA out of memory (stub)")
        return f"stats of {len(examples)}"

    def optimizer_state(self) -> dict[str, Any]:
        return {"state": {}, "param_groups": []}


def paths(server: Any) -> list[str]:
    return [path for path, _ in server.calls]


def test_the_control_client_sends_vllms_sleep_requests():
    with running_vllm_double() as server:
        control = VLLMControl(server.url)
        assert not control.is_sleeping()
        control.sleep(2)
        assert control.is_sleeping() and server.asleep == {"weights", "kv_cache"}
        control.wake_up(("weights",))
        assert server.asleep == {"kv_cache"} and control.is_sleeping()
        control.wake_up()
        assert not control.is_sleeping()
        assert paths(server) == ["/sleep?level=2", "/wake_up?tags=weights", "/wake_up"]
        with pytest.raises(ValueError, match="level must be 1 or 2"):
            control.sleep(3)


def test_a_server_without_sleep_mode_fails_naming_the_flag():
    with running_vllm_double(sleep_mode=False) as server:
        with pytest.raises(WeightSyncError, match=r"--enable-sleep-mode and VLLM_SERVER_DEV_MODE=1"):
            VLLMControl(server.url).sleep(1)


def colocated_with(server: Any, sync_dir: Any, **inference: Any) -> tuple[RecordingTrainer, Any, Any]:
    """(the recording stub, the trainer and the folder sync as the colocated placement wraps them)."""
    from whale.rsft.sync import VLLMReloadSync

    stub = RecordingTrainer(server)
    trainer, sync = colocate(
        spec(placement="colocated", **inference), stub, VLLMReloadSync(server.url, sync_dir), server.url
    )
    return stub, trainer, sync


def test_level_1_sleeps_during_the_update_and_wakes_before_the_sync(tiny_qwen3, tmp_path):
    model, tokenizer = tiny_qwen3
    with running_vllm_double() as server:
        stub, trainer, sync = colocated_with(server, tmp_path / "sync")
        assert trainer.train(["a", "b"], lr=1e-5, seed=1) == "stats of 2"
        sync.sync(model, tokenizer, 1)
        assert stub.asleep_during_update == [{"weights", "kv_cache"}]
        assert paths(server) == ["/sleep?level=1", "/wake_up", "/collective_rpc", "/reset_prefix_cache"]
        assert server.asleep == set() and server.loaded == [str(tmp_path / "sync" / "slot-1")]
        assert trainer.optimizer_state() == stub.optimizer_state()  # the rest is the trainer's


def test_level_2_wakes_the_weights_for_the_reload_then_the_kv_cache(tiny_qwen3, tmp_path):
    model, tokenizer = tiny_qwen3
    with running_vllm_double() as server:
        _, trainer, sync = colocated_with(server, tmp_path / "sync", sleepLevel=2)
        trainer.train(["a"], lr=1e-5, seed=1)
        assert server.asleep == {"kv_cache"}  # only the weights are back: the reload has room, no KV cache yet
        sync.sync(model, tokenizer, 1)
        assert paths(server) == [
            "/sleep?level=2",
            "/wake_up?tags=weights",
            "/collective_rpc",
            "/reset_prefix_cache",
            "/wake_up?tags=kv_cache",
        ]
        assert server.asleep == set() and len(server.loaded) == 1


def test_level_0_never_sleeps_and_only_syncs(tiny_qwen3, tmp_path):
    """verl's free_cache_engine false: the server keeps its memory through the update."""
    model, tokenizer = tiny_qwen3
    with running_vllm_double() as server:
        stub, trainer, sync = colocated_with(server, tmp_path / "sync", sleepLevel=0)
        assert trainer is stub  # no sleep wrapper
        trainer.train(["a"], lr=1e-5, seed=1)
        sync.sync(model, tokenizer, 1)
        assert stub.asleep_during_update == [set()]  # awake while the trainer updated
        assert paths(server) == ["/collective_rpc", "/reset_prefix_cache"]
        assert server.loaded == [str(tmp_path / "sync" / "slot-1")]


def test_a_reload_into_sleeping_weights_is_refused_by_the_double(tiny_qwen3, tmp_path):
    """What the wake-before-sync order prevents: the double refuses it, as a sleeping server would."""
    from whale.rsft.sync import VLLMReloadSync

    model, tokenizer = tiny_qwen3
    with running_vllm_double() as server:
        VLLMControl(server.url).sleep(2)
        with pytest.raises(WeightSyncError, match="asleep"):
            VLLMReloadSync(server.url, tmp_path / "sync").sync(model, tokenizer, 1)


def test_a_failed_update_still_wakes_the_server():
    with running_vllm_double() as server:
        trainer = SleepDuringTraining(RecordingTrainer(server, fail=True), VLLMControl(server.url), 1)
        with pytest.raises(RuntimeError, match="out of memory"):
            trainer.train(["a"], lr=1e-5, seed=1)
        assert server.asleep == set() and paths(server) == ["/sleep?level=1", "/wake_up"]


def test_separate_and_in_process_placements_are_left_alone(monkeypatch):
    trainer, sync = object(), object()
    assert colocate(spec(), trainer, sync, "http://127.0.0.1:1/v1") == (trainer, sync)
    monkeypatch.delenv("WHALE_INFERENCE_URL", raising=False)
    auto = WhaleRunSpec.model_validate(
        {
            **flat(spec().model_dump(by_alias=True, exclude_none=True)),
            "inference": {"backend": "auto", "placement": "colocated"},
        }
    )
    assert colocate(auto, trainer, sync) == (trainer, sync)  # in process: already on the trainer's GPU


def test_the_spec_refuses_colocated_without_a_vllm_server():
    with pytest.raises(ValueError, match="placement colocated .* backend 'transformers'"):
        spec(backend="transformers", placement="colocated")


@pytest.mark.skipif(__import__("importlib.util").util.find_spec("vllm") is not None, reason="vLLM is here: run it")
def test_the_benchmark_says_it_needs_vllm():
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    proc = subprocess.run(
        [sys.executable, str(root / "benchmarks" / "colocated_step.py"), "--steps", "2"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        cwd=root,
    )
    assert proc.returncode == 1 and "needs vLLM importable" in proc.stderr
