"""A whole RSFT step, end to end, through the train workload's own code (issue #17 item 1).

Runs ``whale.workloads.train.run_train`` (the ``python -m whale.workloads train`` entrypoint) on the
synthetic domain for ``--steps`` steps (the phase's end checkpoints, as at an evaluation point), then
``whale.workloads.eval.run_eval`` on that checkpoint, and splits the wall time of every step into

  generation      model calls during the rollouts (the union of the calls' in-flight intervals)
  reward          the rest of the rollouts: the sandboxed harness process, environment steps and the
                  verifier's rewards, episode bookkeeping (sampling wall minus generation)
  collation       trajectories -> token sequences (``WeightPhase.encode``) and micro-batches -> tensors
                  (``collate_tensors``, CUDA-synchronised)
  sft             ``SFTTrainer.train`` minus its collation: forward, backward, optimiser
  sync            weight sync to the sampler (in-process: none; vLLM: bf16 write + reload, or CUDA IPC)
  sleep_wake      colocated placement: the server's /sleep before and /wake_up after each SFT update
  checkpoint      what the trainer waits for at a checkpoint (``WeightPhase.save``): the whole write of the
                  checkpoint and the resume state, or with ``rsft.asyncCheckpoint`` (the default; off with
                  ``--sync-checkpoint``) the host snapshot only, the write going on in the background
  checkpoint_wait waiting for a background write outside ``save`` (at the phase end, before its result)
  evaluation      ``run_eval`` of the checkpoint: its model calls, loading (in-process) and the rest
  other           the loop's own bookkeeping (rejection, metrics line, STOP check)

and reports, per step, the interpreter's garbage-collection pauses inside it (they overlap the parts
above): all collections, and the full ones, which walk every tracked object. The process freezes its
long-lived objects out of those as the train workload's process does (``whale.rsft.heap``;
``--no-gc-freeze`` leaves the collector alone, for the comparison).

by wrapping those very functions with timers (nothing else changes). The last step is a step at an
evaluation point (checkpoint + evaluation), the one before it an ordinary step, and the first pays
torch.compile's warm-up when layers are compiled. Each step reports the GPU busy
fraction (NVML utilisation sampled every 50 ms in a thread), generated tokens/s of its rollouts (and the
tokens, the mean a rollout, the replies cut at ``maxResponseTokens``, the rollouts kept) and the
non-generation overhead: the step's wall time minus generation, SFT and evaluation's generation, as a
share of it (target <= 5 %); the last step's rollouts are replayed for the backend's own ceiling in the
same run (target: the runtime at >= 0.9 of it).

The model: Qwen3-1.7B's shape with random weights (``--model qwen3-1.7b``; the paper's Qwen3.5-2B and 4B shapes:
``--model qwen3.5-2b`` / ``qwen3.5-4b``, which vLLM must serve as hybrids; vocabulary 151 936: the
synthetic domain's tokenizer padded with tokens that only decode), given a short supervised warm-up
on the domain's answer format until greedy answers are right on a probe (the synthetic tasks' rewards
then keep some rollouts, so SFT has sequences). ``--model tiny`` is the domain's own tiny model.
The bare answer is ~8 tokens, so a step generates little and fixed costs (the weight sync) dominate;
``--reply-tokens N`` teaches replies of ``<answer>d</answer>`` followed by N filler tokens (the digit
repeated) and EOS, so a step generates and trains on long sequences as the paper's do. The answer comes
first: a reply cut at ``--max-tokens`` still scores, and rejection keeps it like any other (it keeps by
reward only; the SFT sequence ends with EOS after the cut text).

Backends: the in-process transformers backend (default; the ceiling is the backend's batched
``generate`` over the same calls, without the harness runtime), or ``--vllm`` when vLLM is importable:
``vllm serve`` (dev mode, as benchmarks/weight_sync_vllm.py) with ``VLLMReloadSync``. The vLLM ceiling
(``--ceiling server``, the default) replays the reported step's recorded calls (same messages, n, tools,
sampling) against the same server before it stops, all in flight at once through the runtime's own
client: once untimed, once timed, tokens as the server reports them. ``--ceiling offline``: vLLM's
offline ``LLM.chat`` over the same calls after the server is stopped (a 60-90 s engine start; one
untimed pass first).

GPU (one H200)::

    PYTHONPATH=. python benchmarks/rsft_step.py --json step.json                # in-process generation
    PYTHONPATH=. python benchmarks/rsft_step.py --vllm --json step_vllm.json    # vLLM carried as wheels
    PYTHONPATH=. python benchmarks/rsft_step.py --vllm --prompts 256 --reply-tokens 480 --max-tokens 512 ...

CPU smoke test (tiny model, 2 prompts x 2 rollouts, two steps; ``--reply-tokens 16`` for long replies)::

    PYTHONPATH=. python benchmarks/rsft_step.py --smoke
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import gc
import hashlib
import json
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

HERE = Path(__file__).resolve().parent
# a checkout where the project is not installed (the GPU machine): the core, the synthetic domain and
# the sibling benchmarks from their folders (the domain is then handed to the workloads directly: no
# entry points without an install)
for _path in (HERE.parent / "domains", HERE.parent, HERE):
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))
from runtime_throughput import burst_shape, send_all  # noqa: E402
from sft_throughput import MODELS, model_config, save_hub_form  # noqa: E402

from whale.core import layout  # noqa: E402
from whale.core.protocol import EvalPhaseArgs, WeightPhaseArgs, phase_request  # noqa: E402
from whale.store import open_store  # noqa: E402

RUN = "bench"
PHASE = "c01-weight"
SERVED_NAME = "bench"
#: the tiny model's warm-up under h0's system prompt: 100 (the domain's default) left the smoke run's second step with
#: no kept rollout now and then; 200 copies the digit in most replies
TINY_FORMAT_UPDATES = 200
#: --max-tokens over --reply-tokens: the answer tag (7 tokens), EOS, some slack
REPLY_ROOM = 16
#: --max-model-len over --max-tokens: h0's prompt in the chat template (about 60 tokens) with room
PROMPT_ROOM = 128


# ----- timers around the workload's own functions ----------------------------------------------------


@dataclass
class Interval:
    name: str
    start: float
    end: float
    data: dict[str, Any] = field(default_factory=dict)

    @property
    def seconds(self) -> float:
        return self.end - self.start


_BEGAN = time.perf_counter()


def progress(message: str) -> None:
    """A line on stderr as each part ends: a run cut off by a device call's limit still shows how far it got."""
    print(f"[rsft_step {time.perf_counter() - _BEGAN:7.1f} s] {message}", file=sys.stderr, flush=True)


class Timeline:
    """Named wall-clock intervals, from any thread; those named in ``announce`` are reported as they end."""

    def __init__(self, announce: frozenset[str] = frozenset()) -> None:
        self.intervals: list[Interval] = []
        self._lock = threading.Lock()
        self.announce = announce
        self._announced: dict[str, int] = {}

    def add(self, name: str, start: float, end: float, **data: Any) -> None:
        with self._lock:
            self.intervals.append(Interval(name, start, end, data))
            if name not in self.announce:  # every model call lands here: nothing more to do for them
                return
            count = self._announced[name] = self._announced.get(name, 0) + 1
        progress(f"{name} {count}: {end - start:.1f} s")

    def named(self, name: str, window: tuple[float, float] | None = None) -> list[Interval]:
        lo, hi = window or (float("-inf"), float("inf"))
        return [i for i in self.intervals if i.name == name and lo <= i.start < hi]

    def total(self, name: str, window: tuple[float, float] | None = None) -> float:
        return sum(i.seconds for i in self.named(name, window))

    def union(self, name: str, window: tuple[float, float] | None = None) -> float:
        """Seconds covered by at least one interval ``name`` (concurrent model calls count once)."""
        covered, end = 0.0, float("-inf")
        for i in sorted(self.named(name, window), key=lambda i: i.start):
            if i.end > end:
                covered += i.end - max(i.start, end)
                end = i.end
        return covered


def _cuda_sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


class Timers:
    """Wraps attributes (functions or methods) so each call is recorded; :meth:`restore` undoes it."""

    def __init__(self, timeline: Timeline):
        self.timeline = timeline
        self._undo: list[Callable[[], None]] = []

    def wrap(
        self, owner: Any, attr: str, name: str, *, cuda_sync: bool = False, keep: Callable[[Any], None] | None = None
    ) -> None:
        """``owner.attr`` (a module's function, a class's method or classmethod) records ``name`` per call;
        ``cuda_sync`` times the GPU work it queued too; ``keep`` sees each result."""
        raw = vars(owner).get(attr)  # the descriptor itself (a classmethod stays one on restore)
        original = getattr(owner, attr)
        timeline = self.timeline

        def timed(*args: Any, **kwargs: Any) -> Any:
            if cuda_sync:
                _cuda_sync()
            start = time.perf_counter()
            try:
                result = original(*args, **kwargs)
                if cuda_sync:
                    _cuda_sync()
            finally:
                timeline.add(name, start, time.perf_counter())
            if keep is not None:
                keep(result)
            return result

        setattr(owner, attr, timed)
        self._undo.append(lambda: setattr(owner, attr, raw if raw is not None else original))

    def wrap_chat(self, cls: Any, calls: list[dict[str, Any]]) -> None:
        """Every ``chat`` call: its in-flight interval, completion tokens, and the call itself (replayed
        for the ceiling)."""
        original = cls.chat
        timeline = self.timeline

        async def chat(client: Any, messages: Any, sampling: Any, *args: Any, **kwargs: Any) -> Any:
            sent = copy.deepcopy(messages)  # the runtime appends the reply to the same list afterwards
            start = time.perf_counter()
            result = await original(client, messages, sampling, *args, **kwargs)
            end = time.perf_counter()
            n = kwargs.get("n", args[0] if args else 1)
            tools = kwargs.get("tools", args[1] if len(args) > 1 else None)
            timeline.add(
                "chat",
                start,
                end,
                tokens=result.completion_tokens,
                completions=len(result.completions),
                truncated=sum(c.finish_reason == "length" for c in result.completions),
            )
            calls.append({"start": start, "messages": sent, "sampling": sampling, "n": n, "tools": tools})
            return result

        cls.chat = chat
        self._undo.append(lambda: setattr(cls, "chat", original))

    def record_gc(self) -> None:
        """Every garbage collection as an interval "gc" with its generation (2: a full collection, which walks
        every tracked object; ``whale.rsft.heap`` freezes the long-lived ones out of it)."""
        import gc

        timeline = self.timeline
        started: list[float] = []

        def on_gc(phase: str, info: dict[str, Any]) -> None:
            if phase == "start":
                started.append(time.perf_counter())
            elif started:
                timeline.add("gc", started.pop(), time.perf_counter(), generation=info.get("generation"))

        gc.callbacks.append(on_gc)
        self._undo.append(lambda: gc.callbacks.remove(on_gc))

    def restore(self) -> None:
        while self._undo:
            self._undo.pop()()


class GpuBusy:
    """NVML utilisation (the share of time a kernel ran) sampled in a thread; None where NVML is absent."""

    def __init__(self, interval_s: float = 0.05):
        self.interval_s = interval_s
        self.samples: list[tuple[float, float]] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._handle: Any = None
        try:
            import pynvml  # nvidia-ml-py
        except ImportError:
            return
        try:
            pynvml.nvmlInit()
            visible = (os.environ.get("CUDA_VISIBLE_DEVICES") or "0").split(",")[0]
            self._handle = pynvml.nvmlDeviceGetHandleByIndex(int(visible) if visible.isdigit() else 0)
        except pynvml.NVMLError:  # no driver here: no figure
            self._handle = None
        self._nvml = pynvml

    @property
    def available(self) -> bool:
        return self._handle is not None

    def __enter__(self) -> GpuBusy:
        if self.available:
            self._thread = threading.Thread(target=self._run, name="gpu-busy", daemon=True)
            self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            util = self._nvml.nvmlDeviceGetUtilizationRates(self._handle).gpu
            self.samples.append((time.perf_counter(), util / 100.0))

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def mean(self, lo: float, hi: float) -> float | None:
        values = [u for t, u in self.samples if lo <= t <= hi]
        return statistics.fmean(values) if values else None


# ----- the model -------------------------------------------------------------------------------------


def padded_tokenizer(vocab_size: int) -> Any:
    """The synthetic domain's tokenizer with tokens appended up to ``vocab_size``: they decode to text
    (``<|x123|>``) but no text encodes to them, so every id a random model samples can be detokenised."""
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast

    from synthetic.tiny_model import CHAT_TEMPLATE, build_tokenizer

    base = build_tokenizer()
    spec = json.loads(base.backend_tokenizer.to_str())
    vocab = spec["model"]["vocab"]
    for i in range(len(vocab), vocab_size):
        vocab[f"<|x{i}|>"] = i
    tok = PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer.from_str(json.dumps(spec)),
        eos_token=base.eos_token,
        pad_token=base.pad_token,
        bos_token=None,
    )
    tok.chat_template = CHAT_TEMPLATE
    if len(tok) != vocab_size:
        raise RuntimeError(f"padded tokenizer has {len(tok)} tokens, expected {vocab_size}")
    return tok


def probe_accuracy(model: Any, tokenizer: Any, device: torch.device, n: int = 16) -> float:
    """Greedy answers right on ``n`` test items of the synthetic task. 12 new tokens hold the answer tag
    (7 tokens), which comes first in a long reply too (:func:`bench_conversations`): the filler after it
    is never generated here."""
    from synthetic import tasks

    items = tasks.make_split("test", n, 0)
    texts = [
        tokenizer.apply_chat_template(
            [{"role": "system", "content": tasks.SYSTEM_PROMPT}, {"role": "user", "content": tasks.user_prompt(it)}],
            tokenize=False,
            add_generation_prompt=True,
        )
        for it in items
    ]
    tokenizer.padding_side = "left"
    enc = tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False).to(device)
    model.eval()
    with (
        torch.inference_mode(),
        torch.autocast("cuda", dtype=torch.bfloat16) if device.type == "cuda" else contextlib.nullcontext(),
    ):
        out = model.generate(
            input_ids=enc["input_ids"],
            attention_mask=enc["attention_mask"],
            max_new_tokens=12,
            do_sample=False,
            pad_token_id=tokenizer.pad_token_id,
            eos_token_id=tokenizer.eos_token_id,
        )
    model.train()
    replies = tokenizer.batch_decode(out[:, enc["input_ids"].shape[1] :], skip_special_tokens=True)
    return statistics.fmean(tasks.score(r, it) for r, it in zip(replies, items, strict=True))


def bench_conversations(n: int, seed: int, reply_tokens: int = 0) -> list[list[dict[str, str]]]:
    """The format warm-up's conversations: the domain's (``<answer>d</answer>``, the asked digit), each
    reply followed by ``reply_tokens`` filler tokens, the digit repeated (the tokenizer splits digits one
    a token). The answer comes first, so a reply cut at ``maxResponseTokens`` still scores (the verifier
    reads the last tag); the filler only makes generation and SFT sequences long, as in the paper's steps.
    A filler the model can predict keeps the warm-up's loss on the answer, not on noise."""
    from synthetic import tasks
    from synthetic.tiny_model import format_conversations

    conversations = format_conversations(n, seed, copy_prob=1.0)
    if reply_tokens:
        for conv in conversations:
            reply = conv[-1]["content"]
            conv[-1] = {**conv[-1], "content": reply + str(tasks.extract_answer(reply)) * reply_tokens}
    return conversations


def cached_model(
    cache: Path | None, key: dict[str, Any], build: Callable[[Path], dict[str, Any]], fresh: Path
) -> tuple[Path, dict[str, Any]]:
    """The warm-up's model folder, built by ``build`` into ``fresh`` or, with ``cache``, kept under it by ``key``
    (the build's arguments) so a later run (a second device call on the same machine) starts from it.
    Built beside its place and renamed into it, with ``key`` beside the weights: a build cut off is no model."""
    if cache is None:
        return fresh, build(fresh)
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
    folder, stamp_name = cache / f"{key.get('model', 'model')}-{digest}", "bench-build.json"
    if (folder / stamp_name).is_file():
        return folder, {**json.loads((folder / stamp_name).read_text())["warm"], "reused": True}
    partial = cache / f".{folder.name}.partial"
    shutil.rmtree(partial, ignore_errors=True)
    warm = build(partial)
    (partial / stamp_name).write_text(json.dumps({"key": key, "warm": warm}))
    shutil.rmtree(folder, ignore_errors=True)
    partial.rename(folder)
    return folder, {**warm, "reused": False}


def build_bench_model(
    name: str,
    out: Path,
    device: torch.device,
    *,
    max_updates: int,
    lr: float,
    reply_tokens: int = 0,
    micro: int = 32,
) -> dict[str, Any]:
    """The model folder the run starts from (see the module doc); returns what the warm-up did. ``micro`` caps
    its micro-batch (the step's own ``--micro``): the update is the same, the activations fit the card."""
    if name == "tiny":  # the domain's own model, taught a little longer: it then copies the digit (rewards)
        from synthetic.tiny_model import build

        build(out, conversations=bench_conversations(32 * TINY_FORMAT_UPDATES, 0, reply_tokens))
        return {"format_updates": TINY_FORMAT_UPDATES, "probe_accuracy": None}
    from transformers import AutoModelForCausalLM

    from whale.rsft.collate import encode_trajectory
    from whale.rsft.config import RSFTConfig
    from whale.rsft.rejection import Trajectory
    from whale.rsft.trainer import SFTTrainer

    shape = MODELS[name]
    tokenizer = padded_tokenizer(shape["vocab_size"])
    torch.manual_seed(0)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(model_config(name))
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    trainer = SFTTrainer(
        model,
        # long replies: micro-batches of 16 (~16 x 600 tokens), the update is the same
        RSFTConfig(
            mini_batch_size=32, micro_batch_size_per_gpu=min(micro, 16 if reply_tokens else 32), learning_rate=lr
        ),
        device=device,
        pad_id=tokenizer.pad_token_id,
    )
    examples = [
        e
        for conv in bench_conversations(32 * max_updates, 0, reply_tokens)
        for e in encode_trajectory(tokenizer, Trajectory(prompt_index=0, messages=tuple(conv), reward=1.0))
    ]
    updates, accuracy, chunk = 0, 0.0, 10
    while updates < max_updates and accuracy < 0.5:
        trainer.train(examples[32 * updates : 32 * (updates + chunk)], lr=lr, seed=updates)
        updates += chunk
        accuracy = probe_accuracy(model, tokenizer, device)
    del trainer
    out.mkdir(parents=True, exist_ok=True)
    if MODELS[name].get("model_type") == "qwen3_5":  # the hub's multimodal form, which vLLM serves
        save_hub_form(model, tokenizer, out)
    else:
        model.to(torch.bfloat16).save_pretrained(out, safe_serialization=True)
        tokenizer.save_pretrained(out)
    del model
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return {"format_updates": updates, "probe_accuracy": accuracy}


# ----- the run -----------------------------------------------------------------------------------------


def run_spec(args: argparse.Namespace, model_dir: Path, base_url: str | None) -> dict[str, Any]:
    inference: dict[str, Any] = {"backend": "vllm" if base_url else "transformers", "maxConcurrency": args.concurrency}
    if base_url:
        inference["baseUrl"] = base_url
    rsft: dict[str, Any] = {
        "promptsPerStep": args.prompts,
        "rolloutsPerPrompt": args.rollouts,
        "miniBatchSize": args.minibatch,
        "microBatchSizePerGpu": args.micro,
        "learningRate": args.lr,
        "compileLayers": args.compile_layers,
        "packSequences": args.pack,
        "sampling": {"maxResponseTokens": args.max_tokens},
        "checkpointEverySteps": args.checkpoint_every,
        "asyncCheckpoint": not args.sync_checkpoint,
        # no resume state after an ordinary step: what the step itself costs (auto would write a light resume
        # point for the tiny smoke model, a replay record of the kept sequences for the paper's models)
        "stepResume": "off",
    }
    if args.pack:
        rsft["attention"] = args.attention
    return {
        "domain": "synthetic",
        "condition": "rsft_only",
        "model": {
            "name": str(model_dir),
            "maxModelLen": args.max_model_len,
            **({"servedModelName": SERVED_NAME} if base_url else {}),
        },
        "schedule": {"totalSteps": args.steps},
        "rsft": rsft,
        "inference": inference,
        "evaluation": {"samplesPerItem": args.eval_samples, "maxItems": args.eval_items, "temperature": 1.0},
        "sandbox": {"isolation": args.isolation},
    }


def write_requests(store: Any, spec: dict[str, Any], steps: int) -> str:
    weight = phase_request(
        spec,
        run=RUN,
        phase=PHASE,
        attempt=1,
        args=WeightPhaseArgs(
            cycle=1,
            harness=None,
            from_checkpoint=None,
            from_step=0,
            target_step=steps,
            save_steps=[],
            total_steps=steps,
            steps_per_epoch=1000,
        ),
    )
    store.write_json(layout.spec_key(RUN), spec)
    store.write_json(layout.request_key(RUN, PHASE), weight.to_wire())
    eval_phase = f"eval-c01-s{steps:06d}-weight"
    evaluation = phase_request(
        spec,
        run=RUN,
        phase=eval_phase,
        attempt=1,
        args=EvalPhaseArgs(
            cycle=1, step=steps, after="weight", checkpoint=layout.checkpoint_prefix(RUN, steps), harness=None
        ),
    )
    store.write_json(layout.request_key(RUN, eval_phase), evaluation.to_wire())
    return eval_phase


def instrument(timers: Timers, calls: list[dict[str, Any]], held: dict[str, Any]) -> None:
    import whale.rsft.trainer as trainer_module
    import whale.workloads.train as train_module
    from whale.inference.openai_http import OpenAIClient
    from whale.inference.transformers_backend import TransformersClient
    from whale.inference.vllm_control import VLLMControl
    from whale.rsft.checkpoint_writer import CheckpointWriter
    from whale.rsft.phase import WeightPhase
    from whale.rsft.sampling import HarnessSampler
    from whale.rsft.sync import SharedModelSync, StoreSync, VLLMIpcSync, VLLMReloadSync
    from whale.rsft.trainer import SFTTrainer

    timers.wrap(train_module, "load_for_training", "startup", keep=lambda r: held.update(model=r[0], tokenizer=r[1]))
    timers.wrap(HarnessSampler, "__enter__", "startup")
    timers.wrap(WeightPhase, "run_from", "phase")
    timers.wrap(WeightPhase, "step", "step")
    timers.wrap(HarnessSampler, "sample", "sample")
    timers.wrap(WeightPhase, "encode", "encode")
    timers.wrap(trainer_module, "collate_tensors", "collate", cuda_sync=True)
    timers.wrap(SFTTrainer, "train", "train")
    for cls in (SharedModelSync, VLLMReloadSync, VLLMIpcSync, StoreSync):
        timers.wrap(cls, "sync", "sync")
    timers.wrap(VLLMControl, "sleep", "sleep_wake")  # colocated: around each SFT update
    timers.wrap(VLLMControl, "wake_up", "sleep_wake")
    timers.wrap(WeightPhase, "save", "checkpoint")
    timers.wrap(CheckpointWriter, "wait", "checkpoint_wait")
    timers.wrap(TransformersClient, "from_pretrained", "eval_load")
    for client_cls in (TransformersClient, OpenAIClient):
        timers.wrap_chat(client_cls, calls)


def breakdown(timeline: Timeline, gpu: GpuBusy, eval_window: tuple[float, float]) -> list[dict[str, Any]]:
    """Per step (its window runs from its start to the next step's, the last one to the phase's end and
    on through the evaluation): seconds per component, shares, GPU busy, generated tokens/s."""
    steps = sorted(timeline.named("step"), key=lambda i: i.start)
    phase_end = max(i.end for i in timeline.named("phase"))
    out = []
    for k, step in enumerate(steps):
        last = k == len(steps) - 1
        window = (step.start, steps[k + 1].start if not last else phase_end)
        sample = timeline.total("sample", window)
        generation = timeline.union("chat", window)
        collate = timeline.total("collate", window)
        encode = timeline.total("encode", window)
        train = timeline.total("train", window)
        parts = {
            "generation": generation,
            "reward": sample - generation,
            "collation": encode + collate,
            "sft": train - collate,
            "sync": timeline.total("sync", window),
            "checkpoint": timeline.total("checkpoint", window),
            "checkpoint_wait": _outside(timeline.named("checkpoint_wait", window), timeline.named("checkpoint")),
            # colocated placement's sleep before and wake after each SFT update (a level-2 wake of the KV
            # cache after the sync is the sync's)
            "sleep_wake": _outside(timeline.named("sleep_wake", window), timeline.named("sync")),
        }
        wall = window[1] - window[0]
        parts["other"] = wall - sum(parts.values())
        busy_window = window
        eval_generation = 0.0
        if last:
            eval_wall = eval_window[1] - eval_window[0]
            eval_generation = timeline.union("chat", eval_window)
            eval_load = timeline.total("eval_load", eval_window)
            parts.update(
                evaluation=eval_wall,
                eval_generation=eval_generation,
                eval_load=eval_load,
                eval_other=eval_wall - eval_generation - eval_load,
            )
            wall += eval_wall
            busy_window = (window[0], eval_window[1])
        chats = timeline.named("chat", window)
        samples = timeline.named("sample", window)
        gcs = timeline.named("gc", window)
        full = [i for i in gcs if i.data.get("generation") == 2]
        tokens = sum(i.data.get("tokens", 0) for i in chats)
        completions = sum(i.data.get("completions", 0) for i in chats)
        overhead = wall - generation - parts["sft"] - eval_generation
        out.append(
            {
                "step": k + 1,
                "wall_s": wall,
                "seconds": parts,
                "shares": {
                    name: value / wall
                    for name, value in parts.items()
                    if name not in ("eval_generation", "eval_load", "eval_other")
                },
                "generated_tokens": tokens,
                "generated_tokens_per_s": tokens / generation if generation else 0.0,
                # one completion per rollout in the synthetic domain (one turn)
                "completions": completions,
                "mean_completion_tokens": tokens / completions if completions else 0.0,
                "truncated": sum(i.data.get("truncated", 0) for i in chats),
                "requests": len(chats),
                "calls": burst_shape([(i.start, i.end) for i in chats]),
                # where "reward" (sampling outside model calls) lies: before the first call, after the last
                "sample_head_s": min(i.start for i in chats) - samples[0].start if chats and samples else 0.0,
                "sample_tail_s": samples[-1].end - max(i.end for i in chats) if chats and samples else 0.0,
                # collation's two halves: trajectories -> token sequences, micro-batches -> tensors
                "collation_encode_s": encode,
                "collation_batches_s": collate,
                # the interpreter's pauses inside the step (they overlap the parts above)
                "gc_pause_s": sum(i.seconds for i in gcs),
                "gc_full_collections": len(full),
                "gc_full_s": sum(i.seconds for i in full),
                "overhead_s": overhead,
                "overhead_share": overhead / wall if wall else 0.0,
                "gpu_busy": gpu.mean(*busy_window),
                "gpu_busy_generation": gpu.mean(window[0], window[0] + sample),
                "gpu_busy_sft": _busy_in(gpu, timeline.named("train", window)),
            }
        )
    return out


def _outside(intervals: list[Interval], containers: list[Interval]) -> float:
    """Seconds of ``intervals`` that do not start inside one of ``containers`` (a wait that ``save`` makes is
    counted as the checkpoint's)."""
    return sum(i.seconds for i in intervals if not any(c.start <= i.start and i.end <= c.end for c in containers))


def _busy_in(gpu: GpuBusy, intervals: list[Interval]) -> float | None:
    values = [u for t, u in gpu.samples if any(i.start <= t <= i.end for i in intervals)]
    return statistics.fmean(values) if values else None


# ----- the ceilings ------------------------------------------------------------------------------------


def hf_ceiling(
    model: Any, tokenizer: Any, calls: list[dict[str, Any]], rows: int, max_model_len: int
) -> dict[str, Any]:
    """The in-process backend's own batched generation over the same calls, ``rows`` rows per batch as
    the runtime's batcher forms them, without the harness runtime around it."""
    from whale.inference.transformers_backend import TransformersClient, _key, _Request

    client = TransformersClient(model, tokenizer, max_batch_size=rows, max_model_len=max_model_len)
    # no future: the requests go straight to the backend's generate, not through its batcher; a batch
    # holds requests the backend could batch together (equal sampling but for max_tokens), <= rows rows
    now = time.perf_counter()
    requests = [
        _Request(c["messages"], c["sampling"], c["n"], c["tools"], None, now)  # type: ignore[arg-type]  # replayed calls: no caller future to resolve
        for c in calls
    ]
    batches: list[list[Any]] = []
    for request in requests:
        fits = [b for b in batches if _key(b[0]) == _key(request) and sum(r.n for r in b) + request.n <= rows]
        if fits:
            fits[0].append(request)
        else:
            batches.append([request])
    _cuda_sync()
    start = time.perf_counter()
    tokens = sum(r.completion_tokens for batch in batches for r in client._generate(batch))
    _cuda_sync()
    seconds = time.perf_counter() - start
    return {
        "backend": "transformers generate (batched, no runtime)",
        "tokens": tokens,
        "seconds": seconds,
        "tokens_per_s": tokens / seconds if seconds else 0.0,
        "batches": len(batches),
    }


SERVER_REPLAY = "vllm server replay (same calls, all in flight)"


def server_replay(
    base_url: str,
    model: str | None,
    calls: list[dict[str, Any]],
    api_key: str | None = None,
    *,
    cold_cache: bool = True,
) -> dict[str, Any]:
    """The step's calls again, straight to the same OpenAI endpoint the rollouts used (same messages, n,
    tools and sampling: the request the runtime sent, through the same client), all in flight at once:
    once untimed (warm-up), once timed. Tokens: the completion tokens the server reports (``usage``).

    ``cold_cache``: empty the server's prefix cache before the timed pass (``POST /reset_prefix_cache``, the
    dev-mode endpoint the weight sync uses). A step's rollouts start right after a weight sync, which empties
    it, so they pay every prompt's prefill; a timed pass right after the warm-up would find all of them
    cached and set the ceiling too high."""
    import asyncio

    from whale.inference.openai_http import OpenAIClient
    from whale.inference.vllm_control import VLLMControl

    async def replay() -> list[tuple[int, int, float, list[tuple[float, float]]]]:
        client = OpenAIClient(base_url, model=model, api_key=api_key, max_connections=max(16, len(calls)))
        passes = []
        try:
            for name in ("warm-up", "timed"):
                if name == "timed" and cold_cache:
                    control = VLLMControl(base_url, timeout_s=60.0, api_key=api_key)
                    try:
                        control.reset_prefix_cache()
                    finally:
                        control.close()
                results, spans, seconds = await send_all(client, calls)
                completions = sum(len(r.completions) for r in results)
                passes.append((sum(r.completion_tokens for r in results), completions, seconds, spans))
        finally:
            await client.aclose()
        return passes

    (warm_tokens, _, warm_seconds, _), (tokens, completions, seconds, spans) = asyncio.run(replay())
    return {
        "backend": SERVER_REPLAY,
        "tokens": tokens,
        "seconds": seconds,
        "tokens_per_s": tokens / seconds if seconds else 0.0,
        "requests": len(calls),
        "completions": completions,
        "prefix_cache": "emptied before the timed pass" if cold_cache else "warm (kept from the warm-up)",
        "calls": burst_shape(spans),
        "warmup_tokens": warm_tokens,
        "warmup_seconds": warm_seconds,
    }


def vllm_ceiling(model_dir: Path, calls: list[dict[str, Any]], max_model_len: int, memory: float) -> dict[str, Any]:
    """vLLM's offline engine over the same calls (same messages, n and sampling), started after the
    server is gone (``--ceiling offline``); its start-up and one untimed pass of the same calls (the
    first pass pays the engine's JIT / Triton warm-up) are not timed."""
    # the server's setting (benchmarks/weight_sync_vllm.py): the GPU image has no FlashInfer
    os.environ.setdefault("VLLM_USE_FLASHINFER_SAMPLER", "0")
    from vllm import LLM
    from vllm import SamplingParams as VLLMSampling

    llm = LLM(
        model=str(model_dir), dtype="bfloat16", max_model_len=max_model_len, gpu_memory_utilization=memory, seed=0
    )
    params = [
        VLLMSampling(
            n=c["n"],
            temperature=c["sampling"].temperature,
            top_p=c["sampling"].top_p,
            top_k=c["sampling"].top_k if c["sampling"].top_k > 0 else -1,
            max_tokens=c["sampling"].max_tokens,
        )
        for c in calls
    ]
    conversations = [c["messages"] for c in calls]
    llm.chat(conversations, sampling_params=params, use_tqdm=False)  # warm-up, untimed
    start = time.perf_counter()
    outputs = llm.chat(conversations, sampling_params=params, use_tqdm=False)
    seconds = time.perf_counter() - start
    tokens = sum(len(o.token_ids) for out in outputs for o in out.outputs)
    return {
        "backend": "vllm LLM.chat (offline)",
        "tokens": tokens,
        "seconds": seconds,
        "tokens_per_s": tokens / seconds if seconds else 0.0,
    }


@contextlib.contextmanager
def vllm_server(model_dir: Path, workdir: Path, port: int, memory: float, max_model_len: int) -> Iterator[Any]:
    from weight_sync_vllm import Server

    server = Server(
        model_dir,
        port,
        workdir / "vllm.log",
        ["--gpu-memory-utilization", str(memory), "--max-model-len", str(max_model_len)],
    )
    try:
        started_s = server.start()
        server.started_s = started_s
        yield server
    finally:
        server.stop()


# ----- main ------------------------------------------------------------------------------------------


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--smoke", action="store_true", help="CPU smoke test: tiny model, 2 prompts x 2 rollouts, two steps")
    p.add_argument("--model", choices=["qwen3.5-2b", "qwen3.5-4b", "qwen3-1.7b", "tiny"], default="qwen3-1.7b")
    p.add_argument(
        "--steps",
        type=int,
        default=3,
        help="RSFT steps: the first compiles, the last is at an "
        "evaluation point (checkpoint + eval), the ones between are ordinary",
    )
    p.add_argument("--prompts", type=int, default=64, help="rsft.promptsPerStep")
    p.add_argument("--rollouts", type=int, default=8, help="rsft.rolloutsPerPrompt")
    p.add_argument("--max-tokens", type=int, default=64, help="rsft.sampling.maxResponseTokens")
    p.add_argument("--minibatch", type=int, default=64, help="rsft.miniBatchSize")
    p.add_argument("--micro", type=int, default=16, help="rsft.microBatchSizePerGpu")
    p.add_argument("--lr", type=float, default=1e-6, help="rsft.learningRate")
    p.add_argument("--concurrency", type=int, default=256, help="inference.maxConcurrency (in-process: rows a batch)")
    p.add_argument("--max-model-len", type=int, default=1024, help="model.maxModelLen (and the vLLM server's)")
    p.add_argument(
        "--reply-tokens",
        type=int,
        default=0,
        help="qwen3-1.7b/tiny warm-up: replies are <answer>d</answer> then this many filler tokens, then EOS "
        "(long generation and SFT sequences, as in the paper's steps); 0 = the bare answer",
    )
    p.add_argument(
        "--compile-layers",
        choices=["auto", "on", "off"],
        default="auto",
        help="rsft.compileLayers; auto = on with --vllm on a GPU (in-process generation would go "
        "through the compiled layers at every decode shape)",
    )
    p.add_argument("--pack", action="store_true", help="rsft.packSequences (the varlen path)")
    p.add_argument(
        "--attention", default="auto", choices=["auto", "sdpa", "flex", "flash", "varlen"], help="rsft.attention"
    )
    p.add_argument("--checkpoint-every", type=int, default=0, help="rsft.checkpointEverySteps (a checkpoint mid-phase)")
    p.add_argument(
        "--sync-checkpoint", action="store_true", help="rsft.asyncCheckpoint: false (write before the next step)"
    )
    p.add_argument("--eval-items", type=int, default=64, help="evaluation.maxItems")
    p.add_argument("--eval-samples", type=int, default=4, help="evaluation.samplesPerItem")
    p.add_argument("--format-updates", type=int, default=200, help="most warm-up updates on the answer format")
    p.add_argument("--format-lr", type=float, default=1e-4)
    p.add_argument("--vllm", action="store_true", help="sample through a vLLM server (needs vllm importable)")
    p.add_argument("--vllm-memory", type=float, default=0.35, help="server's --gpu-memory-utilization")
    p.add_argument(
        "--ceiling",
        choices=["server", "offline"],
        default="server",
        help="with --vllm: replay the reported step's calls against the same server, all in flight (server), "
        "or through vLLM's offline engine after the server stops (offline)",
    )
    p.add_argument(
        "--warm-replay",
        action="store_true",
        help="with --ceiling server: keep the prefix cache the warm-up filled for the timed replay (default: empty "
        "it first, as the weight sync does before every step's rollouts)",
    )
    p.add_argument(
        "--no-gc-freeze",
        action="store_true",
        help="leave the interpreter's collector as a library caller has it (default: freeze the long-lived objects "
        "before the first step and after it, as the train workload's process does; whale.rsft.heap)",
    )
    p.add_argument("--port", type=int, default=8765)
    p.add_argument(
        "--isolation",
        choices=["namespaces", "none"],
        default="namespaces",
        help="spec.execution.sandbox.isolation of the harness processes; none only on a machine without "
        "namespaces (the harness is the domain's own h0, the model a random one)",
    )
    p.add_argument(
        "--sync-dir",
        type=Path,
        help="the folder the weights reach the server through (WHALE_SYNC_DIR; default WORKDIR/sync; "
        "/dev/shm/... measures a memory-backed one, as an emptyDir with medium: Memory)",
    )
    p.add_argument("--workdir", type=Path, help="keep the model, store and logs here (default: a temp dir)")
    p.add_argument(
        "--model-cache",
        type=Path,
        help="keep the warm-up's model here, by its build arguments, and start from it when it is there "
        "(a second device call skips the warm-up)",
    )
    p.add_argument(
        "--warm-only",
        action="store_true",
        help="build (or reuse) the model and start the server once, then stop: with --model-cache, a first "
        "device call leaves the model and the server's compile caches for the next",
    )
    p.add_argument("--json", "--out", dest="out", type=Path, help="write the report here")
    args = p.parse_args(argv)
    if args.smoke:
        args.model, args.steps, args.prompts, args.rollouts = "tiny", 2, 2, 2
        args.max_tokens = args.reply_tokens + REPLY_ROOM if args.reply_tokens else 12
        args.minibatch, args.micro, args.lr, args.concurrency = 4, 4, 3e-4, 8
        args.eval_items, args.eval_samples, args.max_model_len = 2, 1, 256
    if args.micro > args.minibatch:
        p.error(f"--micro ({args.micro}) must be <= --minibatch ({args.minibatch})")
    if args.reply_tokens < 0:
        p.error(f"--reply-tokens ({args.reply_tokens}) must be >= 0")
    if args.reply_tokens and args.max_tokens < args.reply_tokens + REPLY_ROOM:
        p.error(
            f"--max-tokens ({args.max_tokens}) must be >= --reply-tokens + {REPLY_ROOM} "
            f"({args.reply_tokens + REPLY_ROOM}): the answer tag and EOS come on top of the filler"
        )
    if args.max_model_len < args.max_tokens + PROMPT_ROOM:
        p.error(
            f"--max-model-len ({args.max_model_len}) must be >= --max-tokens + {PROMPT_ROOM} "
            f"({args.max_tokens + PROMPT_ROOM}): the prompt and the reply must fit"
        )
    if args.vllm:
        import importlib.util

        if importlib.util.find_spec("vllm") is None:
            p.error("--vllm: vllm is not importable here; carry its wheels (docs/performance.md) or drop --vllm")
    gpu = torch.cuda.is_available()
    args.compile_layers = {"on": True, "off": False}.get(args.compile_layers, bool(args.vllm and gpu))
    return args


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse(argv)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    with contextlib.ExitStack() as stack:
        workdir = args.workdir or Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="rsft-step-")))
        workdir.mkdir(parents=True, exist_ok=True)
        setup_start = time.perf_counter()
        # what the model is made of keys the cache; the micro-batch only splits the same updates
        made_of = {"max_updates": args.format_updates, "lr": args.format_lr, "reply_tokens": args.reply_tokens}
        model_dir, warm = cached_model(
            args.model_cache,
            {"model": args.model, **made_of},
            lambda out: build_bench_model(args.model, out, device, micro=args.micro, **made_of),
            workdir / "model",
        )
        setup_s = time.perf_counter() - setup_start
        progress(f"model built in {setup_s:.1f} s: {warm}")
        server = None
        if args.vllm:
            server = stack.enter_context(
                vllm_server(model_dir, workdir, args.port, args.vllm_memory, args.max_model_len)
            )
            os.environ["WHALE_SYNC_DIR"] = str(args.sync_dir or workdir / "sync")
            progress(f"vLLM serving after {getattr(server, 'started_s', None) or 0.0:.1f} s")
        if args.warm_only:
            report = {"warm_only": True, "meta": run_meta(args, device, setup_s, warm, server)}
            print(json.dumps(report["meta"]))
            if args.out:
                write_report(args.out, report)
            return report
        store = open_store(str(workdir / "store"))
        spec = run_spec(args, model_dir, f"{server.url}/v1" if server else None)
        eval_phase = write_requests(store, spec, args.steps)
        timeline = Timeline(announce=frozenset({"step"}))
        calls: list[dict[str, Any]] = []
        held: dict[str, Any] = {}
        timers = Timers(timeline)
        instrument(timers, calls, held)
        timers.record_gc()
        from whale.rsft.heap import freeze_in_this_process

        freeze_in_this_process(not args.no_gc_freeze)  # this process is the workload's, as under python -m
        from whale.workloads.eval import run_eval
        from whale.workloads.train import run_train

        try:
            import synthetic

            with GpuBusy() as gpu:
                run_train(store, RUN, PHASE, domain=synthetic.DOMAIN)
                eval_start = time.perf_counter()
                result = run_eval(store, RUN, eval_phase, domain=synthetic.DOMAIN)
                eval_window = (eval_start, time.perf_counter())
        finally:
            timers.restore()
            freeze_in_this_process(False)
        progress(f"evaluation: {eval_window[1] - eval_window[0]:.1f} s")
        steps = breakdown(timeline, gpu, eval_window)
        # the steps are measured: shown (and written) before the ceiling, so a run cut off in the replay keeps them
        progress("steps measured, the ceiling next: " + json.dumps([step_summary(s) for s in steps]))
        if args.out:
            partial = {
                "partial": "cut off before the ceiling ended",
                "meta": run_meta(args, device, setup_s, warm, server),
            }
            write_report(args.out, {**partial, "steps": steps})
        last = steps[-1]
        last_start = max(i.start for i in timeline.named("step"))
        step_calls = [c for c in calls if last_start <= c["start"] < eval_window[0]]  # the reported step's
        if args.vllm and args.ceiling == "server":
            assert server is not None
            try:  # the benchmark's server has no --api-key (the spec's baseUrl: none is sent either)
                ceiling = server_replay(f"{server.url}/v1", SERVED_NAME, step_calls, cold_cache=not args.warm_replay)
            except Exception as exc:  # noqa: BLE001 - the steps were measured: report them with the failure
                ceiling = {"backend": SERVER_REPLAY, "error": str(exc)[-1000:], "tokens": 0}
                ceiling.update(seconds=0.0, tokens_per_s=0.0)
        elif args.vllm:
            held.clear()  # the trainer's model: the offline engine needs the memory
            gc.unfreeze()  # the workload froze the model with the rest (whale.rsft.heap): let it be collected
            gc.collect()
            torch.cuda.empty_cache()
            final = store.local_path(layout.checkpoint_prefix(RUN, args.steps))
            assert server is not None and final is not None
            server.stop()
            try:
                ceiling = vllm_ceiling(final, step_calls, args.max_model_len, 0.5)
            except Exception as exc:  # noqa: BLE001 - the steps were measured: report them with the failure
                ceiling = {"backend": "vllm LLM.chat (offline)", "error": str(exc)[-1000:], "tokens": 0}
                ceiling.update(seconds=0.0, tokens_per_s=0.0)
        else:
            ceiling = hf_ceiling(held["model"], held["tokenizer"], step_calls, args.concurrency, args.max_model_len)
        metrics = store.read_jsonl(layout.metrics_key(RUN, PHASE))
        for step in steps:
            step["kept"] = next((m.get("kept") for m in metrics if int(m["step"]) == step["step"]), None)
        report = {
            "meta": {
                **run_meta(args, device, setup_s, warm, server),
                "nvml": gpu.available,
                "startup_s": timeline.total("startup"),
            },
            "steps": steps,
            "metrics": metrics,
            "eval": {"mean_at_k": result.mean_at_k, "items": result.items, "k": result.k},
            "ceiling": ceiling,
            "generation_vs_ceiling": (
                last["generated_tokens_per_s"] / ceiling["tokens_per_s"] if ceiling["tokens_per_s"] else None
            ),
        }
    print_report(report)
    if args.out:
        write_report(args.out, report)
    return report


def write_report(path: Path, report: dict[str, Any]) -> None:
    """Whole or not at all (the reports' atomic write): the partial report is replaced by the whole one."""
    from whale.report.output import write_atomic

    write_atomic(path, json.dumps(report, indent=2).encode())


def step_summary(step: dict[str, Any]) -> dict[str, Any]:
    """A step's headline figures, for the progress line."""
    keys = ("step", "wall_s", "generated_tokens_per_s", "overhead_share")
    return {k: round(step[k], 4) if isinstance(step[k], float) else step[k] for k in keys}


def run_meta(
    args: argparse.Namespace, device: torch.device, setup_s: float, warm: dict[str, Any], server: Any
) -> dict[str, Any]:
    """What the run was: the model, where it ran, how its model and server came to be, its arguments."""
    return {
        "model": args.model,
        "device": str(device),
        "gpu": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "torch": torch.__version__,
        "backend": "vllm" if args.vllm else "transformers",
        "setup_s": setup_s,
        **warm,
        "server_start_s": getattr(server, "started_s", None),
        "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
    }


def _shape_text(shape: dict[str, float]) -> str:
    return (
        f"sent over {shape['ramp_s']:.2f} s, answered over {shape['drain_s']:.2f} s, "
        f"{shape['mean_in_flight']:.0f} in flight on average"
    )


def print_report(report: dict[str, Any]) -> None:
    for step in report["steps"]:
        line = metrics_line(report, step["step"])
        print(
            f"\nstep {step['step']}: {step['wall_s']:.2f} s (kept {line.get('kept')}, loss {line.get('loss')}, "
            f"reward {line.get('rewardMean')})"
        )
        for name, seconds in step["seconds"].items():
            share = step["shares"].get(name)
            print(f"  {name:<16} {seconds:>9.3f} s" + (f"  {100 * share:5.1f} %" if share is not None else ""))
        busy = step["gpu_busy"]
        print(
            f"  generated tokens/s {step['generated_tokens_per_s']:.0f} ({step['generated_tokens']} tokens, "
            f"{step['mean_completion_tokens']:.1f} a rollout, {step['truncated']} of {step['completions']} cut "
            "at max tokens); "
            f"GPU busy {'n/a' if busy is None else f'{100 * busy:.1f} %'}; "
            f"non-generation overhead {100 * step['overhead_share']:.1f} % (target <= 5 %)"
        )
        print(
            f"  model calls: {step['requests']} requests, {_shape_text(step['calls'])}; sampling before the first "
            f"{step['sample_head_s']:.2f} s, after the last {step['sample_tail_s']:.2f} s"
        )
        print(
            f"  garbage collection: {step['gc_pause_s']:.3f} s paused, {step['gc_full_collections']} full "
            f"collections ({step['gc_full_s']:.3f} s)"
        )
    c = report["ceiling"]
    ratio = report["generation_vs_ceiling"]
    share = "n/a" if ratio is None else f"{100 * ratio:.1f} %"
    print(
        f"\nceiling ({c['backend']}): {c['tokens_per_s']:.0f} tokens/s ({c['tokens']} tokens in "
        f"{c['seconds']:.2f} s); rollouts at {share} of it (target >= 90 %)"
    )
    if "calls" in c:
        print(f"  replay: {c['requests']} requests, {_shape_text(c['calls'])}; prefix cache {c['prefix_cache']}")
    print(json.dumps({"eval": report["eval"], "meta": {k: v for k, v in report["meta"].items() if k != "args"}}))


def metrics_line(report: dict[str, Any], step: int) -> dict[str, Any]:
    return next((m for m in report["metrics"] if int(m["step"]) == step), {})


if __name__ == "__main__":
    main()
