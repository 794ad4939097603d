"""The paper's hybrid served by vLLM and synced from the trainer (GPU and vLLM; opt-in: ``-m gpu --run-gpu``).

A Qwen3.5 of the 2B's width (hidden 2048, its heads; four layers: three gated delta-net linear-attention layers
and one gated full-attention layer) in the hub's multimodal form, served as the operator serves it (CUDA graphs
and torch.compile on, sleep mode, the CUDA IPC weight-transfer engine, the dev-mode reload endpoints). The trainer
loads its language model as the train workload does. After each way new weights reach the server (CUDA IPC after a
level-2 sleep, which drops the server's weights, so a tensor the sync missed is garbage; the folder reload; a
level-1 sleep and wake), the server's log-probabilities of fixed prompts must be the trainer's within bf16 noise and
far from the weights before.

**bf16 noise** is measured in the same run: the mean gap from the trainer's fp32 log-probabilities of the same
prompts to its bf16-autocast ones and to those of its weights rounded to bf16 (as the server holds them), the larger
(the rounding any bf16 computation of these weights puts on them). The server may be at most
:data:`NOISE_FACTOR` times that from the trainer's fp32 log-probabilities; the weights before the update must be
at least :data:`SEPARATION` times further.

    python3 -m pytest -m gpu --run-gpu -s tests/component/test_vllm_qwen35_gpu.py
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
httpx = pytest.importorskip("httpx")

from tests.fixtures.models import build_tiny_qwen35_hub, build_tiny_tokenizer, write_hub_processor  # noqa: E402

pytestmark = [pytest.mark.gpu, pytest.mark.timeout(1800)]

#: Qwen3.5-2B's language model, four layers of it (``layer_types``: linear, linear, linear, full)
TEXT_SHAPE: dict[str, Any] = {
    "hidden_size": 2048,
    "intermediate_size": 6144,
    "num_hidden_layers": 4,
    "num_attention_heads": 8,
    "num_key_value_heads": 2,
    "head_dim": 256,
    "linear_num_key_heads": 16,
    "linear_num_value_heads": 16,
    "linear_key_head_dim": 128,
    "linear_value_head_dim": 128,
    "linear_conv_kernel_dim": 4,
    "max_position_embeddings": 4096,
    "tie_word_embeddings": True,
    "rms_norm_eps": 1e-6,
}
VISION_SHAPE: dict[str, Any] = {"depth": 1, "hidden_size": 128, "intermediate_size": 256, "num_heads": 2}
SERVED = "hybrid"
PORT = 8791
#: the server's gap to the trainer's fp32 log-probabilities, in units of the bf16 noise (:class:`Reference`)
NOISE_FACTOR = 3.0
#: the weights before an update must be this many times further from what the server answers than the new ones
SEPARATION = 5.0
#: fixed prompts: lengths across the kernels' 64-token chunks and the conv's window
PROMPT_LENGTHS = (5, 63, 64, 65, 200, 517)
REPORT: dict[str, Any] = {}


def _report(key: str, value: Any) -> None:
    REPORT[key] = value
    print(f"[qwen35-vllm] {key}: {json.dumps(value)}", flush=True)


@pytest.fixture(scope="module")
def gpu() -> torch.device:
    if not torch.cuda.is_available():
        pytest.fail("-m gpu needs a CUDA GPU")
    pytest.importorskip("vllm")
    return torch.device("cuda")


@pytest.fixture(scope="module")
def hub_dir(tmp_path_factory: pytest.TempPathFactory, gpu: torch.device) -> Path:
    path = tmp_path_factory.mktemp("qwen35-hub")
    tokenizer = build_tiny_tokenizer()
    model = build_tiny_qwen35_hub(len(tokenizer), seed=0, text_shape=TEXT_SHAPE, vision_shape=VISION_SHAPE)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    write_hub_processor(path)
    return path


@pytest.fixture(scope="module")
def trainer(hub_dir: Path, gpu: torch.device) -> tuple[Any, Any]:
    """The language model as the train workload loads it (fp32 master weights, ``Qwen3_5ForCausalLM``)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from whale.workloads.train import keep_hub_form

    model = AutoModelForCausalLM.from_pretrained(hub_dir, dtype=torch.float32)
    assert type(model).__name__ == "Qwen3_5ForCausalLM"
    keep_hub_form(model, str(hub_dir), {})
    model = model.to(gpu).eval()
    return model, AutoTokenizer.from_pretrained(hub_dir)


@pytest.fixture(scope="module")
def prompts(trainer: tuple[Any, Any]) -> list[list[int]]:
    generator = torch.Generator().manual_seed(7)
    vocab = len(trainer[1])
    return [torch.randint(0, vocab, (n,), generator=generator).tolist() for n in PROMPT_LENGTHS]


class VLLMServer:
    """``vllm serve`` as the operator's colocated pod runs it, in a process group of its own."""

    def __init__(self, model_dir: Path, log_path: Path, port: int = PORT, extra: tuple[str, ...] = ()) -> None:
        from whale.inference.vllm_control import (
            IPC_WEIGHT_TRANSFER_ARGS,
            IPC_WEIGHT_TRANSFER_ENV,
            linear_attention_kernel_args,
        )

        self.url = f"http://127.0.0.1:{port}"
        self.log_path = log_path
        env = {**os.environ, **IPC_WEIGHT_TRANSFER_ENV, "VLLM_SERVER_DEV_MODE": "1", "VLLM_USE_FLASHINFER_SAMPLER": "0"}
        cmd = [
            sys.executable,
            "-m",
            "vllm.entrypoints.openai.api_server",
            "--model",
            str(model_dir),
            "--served-model-name",
            SERVED,
            "--port",
            str(port),
            "--dtype",
            "bfloat16",
            "--max-model-len",
            "2048",
            "--gpu-memory-utilization",
            "0.3",
            "--enable-sleep-mode",
            *IPC_WEIGHT_TRANSFER_ARGS,
            *linear_attention_kernel_args(),
            *extra,
        ]
        self.log = open(log_path, "ab")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(cmd, env=env, stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True)

    def wait_healthy(self, timeout_s: float = 600.0) -> float:
        start = time.monotonic()
        while time.monotonic() - start < timeout_s:
            if self.proc.poll() is not None:
                raise RuntimeError(f"vLLM exited with {self.proc.returncode}:\n{self.tail()}")
            try:
                if httpx.get(f"{self.url}/health", timeout=2.0).status_code == 200:
                    return time.monotonic() - start
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        raise RuntimeError(f"vLLM not healthy after {timeout_s:.0f} s:\n{self.tail()}")

    def tail(self, n: int = 80) -> str:
        self.log.flush()
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, 15)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, 9)
                self.proc.wait(timeout=30)
        self.log.close()


@pytest.fixture(scope="module")
def server(hub_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[VLLMServer]:
    running = VLLMServer(hub_dir, tmp_path_factory.mktemp("vllm-log") / "vllm.log")
    try:
        _report("server_start_s", round(running.wait_healthy(), 1))
        yield running
    finally:
        running.stop()


def served_log_probs(url: str, prompt: list[int]) -> torch.Tensor:
    """The server's log-probability of each prompt token after the ones before it (positions 1..n-1)."""
    body = {"model": SERVED, "prompt": prompt, "max_tokens": 1, "temperature": 0.0, "prompt_logprobs": 0}
    response = httpx.post(f"{url}/v1/completions", json=body, timeout=120.0)
    assert response.status_code == 200, response.text
    rows = response.json()["choices"][0]["prompt_logprobs"]
    assert rows[0] is None and len(rows) == len(prompt)
    return torch.tensor([row[str(token)]["logprob"] for row, token in zip(rows[1:], prompt[1:], strict=True)])


@torch.no_grad()
def trainer_log_probs(model: Any, prompt: list[int], bf16: bool) -> torch.Tensor:
    ids = torch.tensor([prompt], device=next(model.parameters()).device)
    with torch.autocast("cuda", dtype=torch.bfloat16, enabled=bf16):
        logits = model(ids).logits[0, :-1].float()
    return logits.log_softmax(-1).gather(-1, ids[0, 1:, None])[:, 0].cpu()


def mean_gap(a: list[torch.Tensor], b: list[torch.Tensor]) -> float:
    return float(torch.cat([x - y for x, y in zip(a, b, strict=True)]).abs().mean())


class Reference:
    """The trainer's fp32 log-probabilities of the prompts for one set of weights, and the bf16 noise on them: the
    larger gap of the trainer's bf16 autocast and of the same weights rounded to bf16 and run in bf16 (as a server
    holds them), each from fp32."""

    def __init__(self, model: Any, prompts: list[list[int]]) -> None:
        import copy

        self.fp32 = [trainer_log_probs(model, p, bf16=False) for p in prompts]
        autocast = mean_gap([trainer_log_probs(model, p, bf16=True) for p in prompts], self.fp32)
        rounded = copy.deepcopy(model).to(torch.bfloat16)
        bf16 = mean_gap([trainer_log_probs(rounded, p, bf16=False) for p in prompts], self.fp32)
        del rounded
        self.noise = max(autocast, bf16)
        self.parts = {"autocast": round(autocast, 5), "bf16_weights": round(bf16, 5)}


def check_served(label: str, url: str, prompts: list[list[int]], now: Reference, before: Reference) -> None:
    served = [served_log_probs(url, p) for p in prompts]
    gap, old_gap = mean_gap(served, now.fp32), mean_gap(served, before.fp32)
    _report(label, {"gap": round(gap, 5), "bf16_noise": now.parts, "gap_to_old_weights": round(old_gap, 4)})
    assert gap <= NOISE_FACTOR * now.noise, (
        f"{label}: served log-probs {gap:.4f} from the trainer's (noise {now.noise:.4f})"
    )
    assert old_gap >= SEPARATION * gap, f"{label}: the old weights are as close ({old_gap:.4f} vs {gap:.4f})"


@torch.no_grad()
def perturb(model: Any, seed: int) -> None:
    """New weights in every tensor (what an update does, larger): each moves by 0.2 of its own spread."""
    generator = torch.Generator(device="cuda").manual_seed(seed)
    for p in model.parameters():
        spread = float(p.float().std()) if p.numel() > 1 else 0.0
        noise = torch.randn(p.shape, generator=generator, device=p.device, dtype=p.dtype)
        p.add_(noise * (0.2 * spread if spread > 0 else 0.05))


def test_cuda_ipc_sync_after_a_level_two_sleep_carries_every_weight(server, trainer, prompts) -> None:
    from whale.inference.vllm_control import VLLMControl
    from whale.rsft.sync import VLLMIpcSync

    model, tokenizer = trainer
    start = Reference(model, prompts)
    served = [served_log_probs(server.url, p) for p in prompts]
    _report("served_as_loaded", {"gap": round(mean_gap(served, start.fp32), 5), "bf16_noise": round(start.noise, 5)})
    assert mean_gap(served, start.fp32) <= NOISE_FACTOR * start.noise

    control = VLLMControl(server.url)
    timings = {"sleep_s": control.sleep(2)}  # level 2: the server's weights are dropped, not kept on the host
    perturb(model, seed=1)
    timings["wake_weights_s"] = control.wake_up(("weights",))
    ipc = VLLMIpcSync(server.url)
    timings["ipc_sync_s"] = ipc.sync(model, tokenizer, step=1)
    timings["wake_kv_cache_s"] = control.wake_up(("kv_cache",))
    _report("colocated_level2_timings", {k: round(v, 3) for k, v in timings.items()})
    check_served("after_level2_sleep_and_ipc_sync", server.url, prompts, Reference(model, prompts), start)
    ipc.close()
    control.close()


def test_folder_reload_sync_then_level_one_sleep(server, trainer, prompts, tmp_path) -> None:
    from whale.inference.vllm_control import VLLMControl
    from whale.rsft.sync import VLLMReloadSync

    model, tokenizer = trainer
    before = Reference(model, prompts)
    perturb(model, seed=2)
    reload = VLLMReloadSync(server.url, tmp_path / "sync")
    seconds = reload.sync(model, tokenizer, step=2)
    now = Reference(model, prompts)
    _report("folder_reload_sync_s", round(seconds, 3))
    check_served("after_folder_reload", server.url, prompts, now, before)

    control = VLLMControl(server.url)
    control.sleep(1)  # level 1: the weights wait in host memory and come back as they were
    control.wake_up()
    check_served("after_level1_sleep_and_wake", server.url, prompts, now, before)
    reload.close()
    control.close()


def test_greedy_generation_follows_the_synced_weights(server, trainer) -> None:
    """Decoding (CUDA graphs, the linear layers' recurrent state carried token to token) after the syncs: the
    trainer, teacher-forced on the server's greedy tokens, ranks (almost) every one first."""
    model, _ = trainer
    prompt = list(range(3, 40))
    body = {"model": SERVED, "prompt": prompt, "max_tokens": 48, "temperature": 0.0, "ignore_eos": True}
    body["return_token_ids"] = True
    response = httpx.post(f"{server.url}/v1/completions", json=body, timeout=120.0)
    assert response.status_code == 200, response.text
    tokens = [int(t) for t in response.json()["choices"][0]["token_ids"]]
    assert len(tokens) == 48
    ids = torch.tensor([prompt + tokens], device="cuda")
    with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16):
        predicted = model(ids).logits[0, len(prompt) - 1 : -1].float().argmax(-1).tolist()
    agreement = sum(p == t for p, t in zip(predicted, tokens, strict=True)) / len(tokens)
    _report("greedy_agreement", agreement)
    assert agreement >= 0.9


def test_a_saved_checkpoint_serves_on_a_fresh_server(trainer, prompts, tmp_path) -> None:
    """What the next phase's vLLM Deployment starts from: the trainer's checkpoint of the synced weights."""
    from whale.rsft.checkpoint import materialise, save_checkpoint
    from whale.store import open_store

    model, tokenizer = trainer
    store = open_store(str(tmp_path / "store"))
    folder = materialise(store, save_checkpoint(store, "run", 1, model, tokenizer), tmp_path / "work")
    _report("checkpoint_config", json.loads((folder / "config.json").read_text()).get("architectures"))
    fresh = VLLMServer(folder, tmp_path / "fresh.log", port=PORT + 1, extra=("--enforce-eager",))
    try:
        _report("fresh_start_s", round(fresh.wait_healthy(), 1))
        now = Reference(model, prompts)
        served = [served_log_probs(fresh.url, p) for p in prompts]
        gap = mean_gap(served, now.fp32)
        _report("fresh_server_on_checkpoint", {"gap": round(gap, 5), "bf16_noise": round(now.noise, 5)})
        assert gap <= NOISE_FACTOR * now.noise
    finally:
        fresh.stop()

    # what the checkpoint would have been without the hub's form (the language model's own config): reported
    model.whale_hub_form, form = None, model.whale_hub_form
    try:
        store = open_store(str(tmp_path / "store-text"))
        text_only = materialise(store, save_checkpoint(store, "run", 1, model, tokenizer), tmp_path / "work-text")
    finally:
        model.whale_hub_form = form
    probe = VLLMServer(text_only, tmp_path / "text-only.log", port=PORT + 2, extra=("--enforce-eager",))
    try:
        _report("text_only_checkpoint_start_s", round(probe.wait_healthy(timeout_s=300), 1))
    except RuntimeError as exc:
        errors = [line[-300:] for line in str(exc).splitlines() if "Error" in line or "error" in line]
        _report("text_only_checkpoint_refused", errors[-4:])
    finally:
        probe.stop()
