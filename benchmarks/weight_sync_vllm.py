"""Weight sync into a running vLLM server, measured against restarting it (issue #5).

Needs a GPU and vLLM. Builds a Qwen3-1.7B-shaped model with random weights (the vocabulary of the
``--tokenizer`` given, so that every token vLLM samples can be detokenised), serves it with
``vllm serve`` in dev mode (``VLLM_SERVER_DEV_MODE=1``, CUDA graphs and torch.compile on, as in
production) and measures, for the code paths the RSFT weight phase uses:

* ``VLLMReloadSync`` (``whale.rsft.sync``): save the trainer's fp32 model to a folder the server
  reads, then ``collective_rpc reload_weights(weights_path)`` + ``reset_prefix_cache``; writing the
  fp32 master weights as they are, and cast to bf16 (the dtype vLLM serves; the default);
* ``VLLMIpcSync`` (``inference.weightSync: cudaIpc``; ``--ipc-repeats``, on by default): bf16 copies of the
  weights handed to the server, on the same GPU, through CUDA IPC handles and vLLM's weight-transfer API (the
  server then runs with ``--weight-transfer-config '{"backend": "ipc"}'`` and
  ``VLLM_ALLOW_INSECURE_SERIALIZATION=1``); no file;
* ``StoreSync`` + the vLLM pod's weight-sync sidecar (``whale.inference.weight_sync``), with a
  local-folder store: upload, sidecar download, reload, acknowledgement;
* the alternative the issue rules out: restarting the server on the new weights (time to healthy);

and checks after every reload that the server now answers with the new weights: for its greedy
tokens on a fixed prompt, a teacher-forced transformers forward pass of the weights just synced
predicts (almost) every one and one of the other weights predicts (almost) none (two random
models: an old-weights answer cannot pass, and a rare bf16 near-tie cannot fail the check), and that
decoding throughput is unchanged (CUDA graphs still point at the live parameters).

    PYTHONPATH=. python benchmarks/weight_sync_vllm.py --tokenizer DIR --json out.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import torch

from whale.inference.base import SamplingParams
from whale.inference.openai_http import OpenAIClient
from whale.inference.vllm_control import (
    IPC_WEIGHT_TRANSFER_ARGS,
    IPC_WEIGHT_TRANSFER_ENV,
    VLLMControl,
    linear_attention_kernel_args,
)
from whale.inference.weight_sync import WeightSyncer
from whale.rsft.sync import StoreSync, VLLMIpcSync, VLLMReloadSync, save_for_serving
from whale.runner.local import supervised
from whale.store import open_store

sys.path.insert(0, str(Path(__file__).resolve().parent))
from sft_throughput import MODELS, model_config, save_hub_form

SERVED_NAME = "bench"
PROBE_TOKENS = 24
#: the served greedy tokens come from the weights just sent: transformers with them ranks at least this share first
#: (random weights over a 248k vocabulary leave bf16 near-ties: Qwen3.5-2B gave 0.79-0.88 on an H100), and
#: with the other set (the weights before the sync) at most OTHER_MAX (0.00 there)
AGREE_MIN, OTHER_MAX = 0.6, 0.2


def build_hybrid(
    name: str, tokenizer: Any, seed: int, layers: int, folder: Path, device: str = "cuda"
) -> torch.nn.Module:
    """The paper's model (``qwen3.5-2b``/``-4b``, random weights): written to ``folder`` in the hub's multimodal form
    (what vLLM serves and the train workload loads), then loaded back as the trainer loads it (fp32 language
    model, ``Qwen3_5ForCausalLM``), so every sync sends the hub's tensor names."""
    from transformers import AutoModelForCausalLM

    config = model_config(name, vocab_size=len(tokenizer), num_hidden_layers=layers)
    torch.manual_seed(seed)
    with torch.device(device):
        text = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    save_hub_form(text, tokenizer, folder)
    del text
    loaded: Any = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    return loaded.to(device).eval()


def build_model(vocab_size: int, seed: int, layers: int, device: str = "cuda") -> torch.nn.Module:
    """Random Qwen3 weights of the Qwen3-1.7B shape (``MODELS``), fp32 (the trainer's master copy)."""
    from transformers import Qwen3ForCausalLM

    torch.manual_seed(seed)
    config = model_config("qwen3-1.7b", vocab_size=vocab_size, num_hidden_layers=layers)
    with torch.device(device):
        model = Qwen3ForCausalLM(config)
    return model.eval()


@torch.no_grad()
def predicted_fraction(model: torch.nn.Module, prompt: list[int], tokens: list[int]) -> float:
    """Teacher-forced: the fraction of ``tokens`` that ``model`` ranks first after prompt + the
    tokens before it (greedy decoding by the same weights gives 1.0 up to bf16 near-ties)."""
    device = next(model.parameters()).device
    ids = torch.tensor([prompt + tokens], device=device)
    with torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"):
        logits = model(ids).logits[0, len(prompt) - 1 : -1]
    predicted = logits.float().argmax(-1).tolist()
    return sum(p == t for p, t in zip(predicted, tokens, strict=True)) / len(tokens)


class Server:
    """``vllm serve`` in dev mode, in its own process group, under the local runner's supervisor
    (``whale/runner/supervise.py``): the server dies with the benchmark that started it, however the benchmark
    ends. A ``timeout`` that killed a benchmark used to leave its server holding the GPU's memory for the next."""

    def __init__(self, model_dir: Path, port: int, log_path: Path, extra: list[str]):
        self.model_dir, self.port, self.log_path, self.extra = model_dir, port, log_path, extra
        self.proc: subprocess.Popen | None = None
        self.watch_w: int | None = None  # the supervisor kills the server when this end closes
        self.url = f"http://127.0.0.1:{port}"
        self.started_s: float | None = None  # how long start() took (set by callers that report it)

    def command(self) -> list[str]:
        return [
            sys.executable,
            "-m",
            "vllm.entrypoints.openai.api_server",
            "--model",
            str(self.model_dir),
            "--served-model-name",
            SERVED_NAME,
            "--port",
            str(self.port),
            "--dtype",
            "bfloat16",
            "--max-model-len",
            "2048",
            "--gpu-memory-utilization",
            "0.45",
            *linear_attention_kernel_args(),
            *self.extra,
        ]

    def launch(self, command: list[str]) -> None:
        """Start ``command`` under the supervisor; this process holds the only write end of its watch pipe."""
        # FlashInfer's sampler is vLLM's default on CUDA; vLLM's own top-k/top-p kernels serve when
        # it is not installed (greedy probes do not sample anyway)
        env = {**os.environ, "VLLM_SERVER_DEV_MODE": "1", "VLLM_USE_FLASHINFER_SAMPLER": "0"}
        watch_r, watch_w = os.pipe()
        self.log = open(self.log_path, "ab")  # noqa: SIM115 - the server's stdout, closed in stop()
        try:
            self.proc = subprocess.Popen(
                supervised(command, watch_r, grace_s=30),
                env=env,
                stdout=self.log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
                pass_fds=(watch_r,),
            )
        except BaseException:
            os.close(watch_w)
            self.log.close()
            raise
        finally:
            os.close(watch_r)
        self.watch_w = watch_w

    def start(self, timeout_s: float = 420.0) -> float:
        """Launch the server and wait until it is healthy; one that does not come up (or a Ctrl-C meanwhile) is
        stopped before the error goes on, so no caller leaves it holding the GPU."""
        start = time.perf_counter()
        self.launch(self.command())
        try:
            return self._healthy(start, timeout_s)
        except BaseException:
            self.stop()
            raise

    def _healthy(self, start: float, timeout_s: float) -> float:
        assert self.proc is not None
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"vLLM exited with {self.proc.returncode}:\n{self.causes()}\n{self.tail()}")
            try:
                if httpx.get(f"{self.url}/health", timeout=2.0).status_code == 200:
                    return time.perf_counter() - start
            except httpx.HTTPError:
                pass
            time.sleep(0.25)
        raise RuntimeError(f"vLLM not healthy after {timeout_s:.0f} s:\n{self.tail()}")

    def causes(self, n: int = 8) -> str:
        """The log's first distinct error lines: the root cause of an engine that died at start-up is printed
        well above the tail, which holds only the API server's "see root cause above"."""
        if not self.log.closed:
            self.log.flush()
        found: list[str] = []
        for line in self.log_path.read_text(errors="replace").splitlines():
            text = line.split(") ", 1)[-1].strip()  # "(EngineCore pid=7) ValueError: ..." -> "ValueError: ..."
            if re.match(r"[\w.]*(Error|Exception)\b", text) and text not in found:
                found.append(text)
        return "\n".join(found[:n])

    def tail(self, n: int = 60) -> str:
        if not self.log.closed:
            self.log.flush()
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            os.killpg(self.proc.pid, 15)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, 9)
                self.proc.wait(timeout=30)
        if self.proc is not None:
            self.log.close()  # each start opens it again
        if self.watch_w is not None:
            os.close(self.watch_w)
            self.watch_w = None
        self.proc = None


def complete(url: str, prompt: list[int], max_tokens: int, client: httpx.Client) -> list[int]:
    body = {
        "model": SERVED_NAME,
        "prompt": prompt,
        "max_tokens": max_tokens,
        "temperature": 0.0,
        "ignore_eos": True,
        "logprobs": 1,
        "return_tokens_as_token_ids": True,
        "return_token_ids": True,
    }
    r = client.post(f"{url}/v1/completions", json=body, timeout=120.0)
    r.raise_for_status()
    choice = r.json()["choices"][0]
    if choice.get("token_ids"):
        return [int(t) for t in choice["token_ids"]]
    return [int(t.split(":", 1)[1]) for t in choice["logprobs"]["tokens"]]


def decode_rate(url: str, prompt: list[int], concurrency: int, max_tokens: int) -> float:
    """Generated tokens per second with ``concurrency`` requests in flight (one wave)."""
    with httpx.Client(limits=httpx.Limits(max_connections=concurrency)) as client:
        start = time.perf_counter()
        with ThreadPoolExecutor(concurrency) as pool:
            outs = list(
                pool.map(lambda i: complete(url, prompt + [i % 50 + 1], max_tokens, client), range(concurrency))
            )
        seconds = time.perf_counter() - start
    return sum(len(o) for o in outs) / seconds


def rollout_client_probe(url: str, n: int = 4) -> dict[str, Any]:
    """The rollout client (``OpenAIClient``, aiohttp) against the real server: ``n`` samples of one
    chat prompt in one request (what eval does for an item's first turn), top-k sent as vLLM takes it."""

    async def ask() -> Any:
        client = OpenAIClient(f"{url}/v1")
        try:
            return await client.chat(
                [{"role": "user", "content": "Name a colour."}],
                SamplingParams(temperature=1.0, top_k=20, max_tokens=16),
                n=n,
            )
        finally:
            await client.aclose()

    result = asyncio.run(ask())
    return {
        "completions": len(result.completions),
        "prompt_tokens": result.prompt_tokens,
        "completion_tokens": result.completion_tokens,
        "ok": len(result.completions) == n
        and result.prompt_tokens > 0
        and result.completion_tokens == sum(c.completion_tokens for c in result.completions) >= n,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--model",
        choices=["qwen3-1.7b", "qwen3.5-2b", "qwen3.5-4b"],
        default="qwen3-1.7b",
        help="the shape; qwen3.5-*: the paper's hybrids, served from the hub's multimodal form",
    )
    parser.add_argument(
        "--tokenizer",
        type=Path,
        help="a tokenizer folder (its vocabulary sizes the model); default: the synthetic domain's, padded to the "
        "model's vocabulary",
    )
    parser.add_argument("--skip-store", action="store_true", help="do not time the store + sidecar path")
    parser.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "whale-wsync")
    parser.add_argument(
        "--keep-work",
        action="store_true",
        help="keep --work (model folders, sync slots, the store: several GB at 1.7 B) instead of removing it at the end",
    )
    parser.add_argument("--layers", type=int, help="decoder layers (default: the model's)")
    parser.add_argument("--port", type=int, default=8765)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--decode-concurrency", type=int, default=128)
    parser.add_argument("--decode-tokens", type=int, default=256)
    parser.add_argument("--decode-repeats", type=int, default=3, help="decode-rate waves before and after the reloads")
    parser.add_argument("--skip-restart", action="store_true", help="do not time a restart at the end")
    parser.add_argument(
        "--ipc-repeats",
        type=int,
        default=2,
        help="VLLMIpcSync rounds (B then A each); 0: start the server without the IPC weight-transfer engine",
    )
    parser.add_argument("--vllm-arg", action="append", default=[], help="extra argument for vllm serve")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)

    from transformers import AutoTokenizer

    if args.work.exists():
        shutil.rmtree(args.work)
    args.work.mkdir(parents=True)
    if args.tokenizer is not None:
        tokenizer = AutoTokenizer.from_pretrained(args.tokenizer)
    else:
        from rsft_step import padded_tokenizer

        tokenizer = padded_tokenizer(MODELS[args.model]["vocab_size"])
    vocab = len(tokenizer)
    layers = args.layers or MODELS[args.model]["num_hidden_layers"]
    results: dict[str, Any] = {"model": args.model, "vocab": vocab, "layers": layers}

    hybrid = MODELS[args.model].get("model_type") == "qwen3_5"
    base = args.work / "base"
    if hybrid:
        models = {
            name: build_hybrid(args.model, tokenizer, seed, layers, base if name == "A" else args.work / "base-B")
            for name, seed in (("A", 0), ("B", 1))
        }
    else:
        models = {name: build_model(vocab, seed, layers) for name, seed in (("A", 0), ("B", 1))}
    torch.cuda.empty_cache()  # the build's freed blocks back to the card: vLLM sizes itself from what is free
    n_params = sum(p.numel() for p in models["A"].parameters())
    results["parameters"] = n_params
    prompt = tokenizer.encode("Weights move from the trainer to the server after every RSFT step.")
    if not hybrid:  # (a hybrid's served folder is the hub form build_hybrid wrote)
        start = time.perf_counter()
        save_for_serving(models["A"], tokenizer, base)
        results["save_bf16_s_first"] = time.perf_counter() - start
    print(f"model: {n_params / 1e9:.2f} B parameters, vocab {vocab}", flush=True)

    vllm_args = list(args.vllm_arg)
    if args.ipc_repeats > 0:  # what the operator renders for weightSync cudaIpc
        vllm_args += IPC_WEIGHT_TRANSFER_ARGS
        os.environ.update(IPC_WEIGHT_TRANSFER_ENV)
    server = Server(base, args.port, args.work / "vllm.log", vllm_args)
    client = httpx.Client()

    def check(name: str, label: str) -> dict[str, Any]:
        got = complete(server.url, prompt, PROBE_TOKENS, client)
        other = "A" if name == "B" else "B"
        agree, wrong = predicted_fraction(models[name], prompt, got), predicted_fraction(models[other], prompt, got)
        ok = agree >= AGREE_MIN and wrong <= OTHER_MAX
        print(
            f"  {label}: greedy tokens predicted by transformers({name}) {agree:.2f}, by ({other}) {wrong:.2f}"
            f" -> {'ok' if ok else 'WRONG WEIGHTS'}",
            flush=True,
        )
        return {"label": label, "weights": name, "agreement": agree, "other_agreement": wrong, "ok": ok}

    checks: list[dict[str, Any]] = []
    try:
        results["cold_start_s"] = server.start()
        print(f"cold start (first, compiles): {results['cold_start_s']:.1f} s", flush=True)
        checks.append(check("A", "after start"))
        results["rollout_client_probe"] = rollout_client_probe(server.url)
        print(f"rollout client (aiohttp) n=4 chat: {results['rollout_client_probe']}", flush=True)
        results["decode_tok_s_before"] = [
            decode_rate(server.url, prompt, args.decode_concurrency, args.decode_tokens)
            for _ in range(args.decode_repeats)
        ]
        print(
            f"decode: {', '.join(f'{r:.0f}' for r in results['decode_tok_s_before'])} tok/s "
            f"at {args.decode_concurrency} in flight",
            flush=True,
        )

        control = VLLMControl(server.url)
        rows: dict[str, list[float]] = {"fp32_total": [], "bf16_total": [], "reload_only": []}
        local = args.work / "sync"
        syncs = {True: VLLMReloadSync(server.url, local, dtype=None), False: VLLMReloadSync(server.url, local)}
        step = 0
        for rep in range(args.repeats):
            for name in ("B", "A"):
                step += 1
                fp32 = rep % 2 == 0  # alternate: write the fp32 master weights as they are / cast to bf16
                seconds = syncs[fp32].sync(models[name], tokenizer, step)
                rows["fp32_total" if fp32 else "bf16_total"].append(seconds)
                checks.append(check(name, f"VLLMReloadSync step {step} ({'fp32' if fp32 else 'bf16'}) {seconds:.1f} s"))
                rows["reload_only"].append(control.reload_from(str(local / f"slot-{step % 2}")))
        if args.ipc_repeats > 0:
            rows["ipc_bf16_total"] = []
            ipc = VLLMIpcSync(server.url)
            for _ in range(args.ipc_repeats):
                for name in ("B", "A"):
                    step += 1
                    seconds = ipc.sync(models[name], tokenizer, step)
                    rows["ipc_bf16_total"].append(seconds)
                    checks.append(check(name, f"VLLMIpcSync step {step} (bf16) {seconds:.2f} s"))
            ipc.close()
        results["decode_tok_s_after"] = [
            decode_rate(server.url, prompt, args.decode_concurrency, args.decode_tokens)
            for _ in range(args.decode_repeats)
        ]
        print(f"decode after reloads: {', '.join(f'{r:.0f}' for r in results['decode_tok_s_after'])} tok/s", flush=True)

        # the cluster path: store + the vLLM pod's sidecar (here a thread, a local-folder store)
        if not args.skip_store:
            store = open_store(str(args.work / "store"))
            syncer = WeightSyncer(
                store=store, run="bench", model=str(base), dest=args.work / "sidecar", control=VLLMControl(server.url)
            )
            syncer.prepare_once()
            stop = threading.Event()
            sidecar = threading.Thread(target=syncer.follow, kwargs={"poll_s": 0.1, "stop": stop}, daemon=True)
            sidecar.start()
            store_sync = StoreSync(store, "bench", ack_timeout_s=600, poll_s=0.1)
            rows["store_bf16_total"] = []
            for name in ("B", "A", "B"):
                step += 1
                seconds = store_sync.sync(models[name], tokenizer, step)
                rows["store_bf16_total"].append(seconds)
                checks.append(check(name, f"StoreSync+sidecar step {step} (bf16) {seconds:.1f} s"))
            stop.set()
            sidecar.join(timeout=30)

        # the alternative: restart the server on the new weights
        server.stop()
        if not args.skip_restart:
            server.model_dir = (args.work / "sidecar" / "current").resolve()  # the weights synced last (B)
            results["restart_s"] = server.start()  # torch.compile's cache is warm now: the best case
            print(f"restart to healthy: {results['restart_s']:.1f} s", flush=True)
            checks.append(check(name, "after restart"))
        for key, values in rows.items():
            results[key + "_s"] = values
            if len(values) >= 2:  # the 95th percentile the targets name (inclusive: within the values seen)
                results[key + "_p95_s"] = statistics.quantiles(values, n=20, method="inclusive")[-1]
            if values:
                print(
                    f"{key:>18}: median {statistics.median(values):.2f} s  (all: {', '.join(f'{v:.2f}' for v in values)})"
                )
    except Exception as exc:  # noqa: BLE001 - report what happened, with the server's log
        results["error"] = repr(exc)
        print(f"ERROR: {exc!r}\n--- vLLM log ---\n{server.tail() if server.proc else ''}", flush=True)
    finally:
        server.stop()
        results["checks"] = checks
        results["check_thresholds"] = {"agreement_min": AGREE_MIN, "other_agreement_max": OTHER_MAX}
        results["all_checks_pass"] = (
            bool(checks) and all(c["ok"] for c in checks) and results.get("rollout_client_probe", {}).get("ok", False)
        )
        print(f"checks: {len(checks)}, all agree: {results['all_checks_pass']}")
        if args.json:
            args.json.write_text(json.dumps(results, indent=2))
        if not args.keep_work:  # a benchmark run after this one on the same disk needs the room
            shutil.rmtree(args.work, ignore_errors=True)
    return 0 if results["all_checks_pass"] and "error" not in results else 1


if __name__ == "__main__":
    raise SystemExit(main())
