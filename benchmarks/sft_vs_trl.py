"""The RSFT SFT update side by side with TRL's ``SFTTrainer`` and a plain Hugging Face ``Trainer``
(issue #17 item 3): tokens/s and the loss after the same updates, one run, same GPU, same data.

Every trainer starts from the same random-weight model (``--model``; qwen3-1.7b is Qwen3-1.7B's shape)
and makes the same optimiser updates over the same token sequences (``--lengths``: ``fixed`` = every
sequence ``--seq`` tokens, ``variable`` = uniform in [seq/8, seq], as benchmarks/sft_throughput.py):

* the same micro-batches: each update is one minibatch of ``--minibatch`` sequences, cut into
  micro-batches of ``--micro`` the way whale's trainer cuts them (longest first); the peers read the
  sequences in that order (sequential sampler) with ``gradient_accumulation_steps = minibatch / micro``;
* the same loss: every token but the first of a sequence carries loss, summed and divided by the
  minibatch's loss-carrying tokens (whale's token mean; TRL's and Trainer's ``num_items_in_batch``
  normalisation are the same sum over the same count, checked by the loss columns);
* the same optimiser: ``torch.optim.AdamW`` (lr ``--lr``, betas (0.9, 0.999), eps 1e-8, weight decay 0,
  fused on a GPU), constant learning rate, gradient clipping at 1.0, one step per minibatch;
* the same precision: fp32 master weights, bf16 autocast on a GPU (fp32 on the CPU).

Trainers (``--trainers``):
  whale       ``whale.rsft.trainer.SFTTrainer``, the production config: compiled decoder layers on a
              GPU (``--no-compile`` to turn off), bucket padding without a mask
  whale-pack  the same with the varlen path: packed rows, flex attention + document block mask
  trl         TRL ``SFTTrainer`` on the pre-tokenised sequences (``skip_prepare_dataset``), variable
              lengths padding-free (``padding_free=True``, TRL's best for them) with transformers'
              ``--trl-attn`` (default flex_attention on a GPU: flash-attn has no wheel there, and sdpa
              builds a dense mask; sdpa on the CPU); fixed lengths with its default collator
  trl-pad     TRL with its default padded collator (``padding_free=False``, attention mask)
  hf          plain ``transformers.Trainer``: right padding to the longest + attention mask, the model's
              own loss (full logits)
  hf-flat     ``Trainer`` with transformers' padding-free ``DataCollatorWithFlattening`` (``--trl-attn``)
``--peer-compile`` sets ``torch_compile=True`` for the peers (whole-model compile by the Trainer).
``--budget-s`` bounds each trainer's wall time (model build included): one that does not finish is a result, written
with how far it got, and the next trainer runs.

Timing: the wall time of each update (whale: ``SFTTrainer.train`` of one minibatch; the peers: between
consecutive ``on_step_end`` callbacks, CUDA-synchronised), so data collation is inside for all. The
first ``--warmup`` updates are not timed (compilation); all updates count for the losses. Whale's
compiled layers see each bucket width once before the clock starts (forward + backward only, no
optimiser step: the updates stay the same). After the updates every model is scored on a held-out
minibatch by one evaluator (``whale.rsft.trainer.token_loss_sum``, masked padding, same autocast).

GPU (one H200; TRL, datasets, dill, multiprocess carried as wheels, see docs/performance.md)::

    PYTHONPATH=. python benchmarks/sft_vs_trl.py --model qwen3-1.7b --seq 4096 --lengths fixed --json fixed.json
    PYTHONPATH=. python benchmarks/sft_vs_trl.py --model qwen3-1.7b --seq 4096 --lengths variable --json var.json

CPU smoke test (tiny model, fp32: the losses agree to ~1e-6)::

    PYTHONPATH=. python benchmarks/sft_vs_trl.py --model tiny --seq 128 --minibatch 4 --micro 2 --updates 2 \\
        --warmup 0 --lr 1e-3
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import itertools
import json
import os
import signal
import statistics
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

# the peers' libraries must not reach for the network (the GPU machine has none; CI neither)
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")

import torch

for _path in (Path(__file__).resolve().parents[1], Path(__file__).resolve().parent):  # an uninstalled checkout
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))
from sft_throughput import MODELS, build_random_model, make_examples, mean_context, model_flops_per_token  # noqa: E402

from whale.rsft.collate import Example, micro_batches, pad_collate  # noqa: E402
from whale.rsft.config import RSFTConfig  # noqa: E402
from whale.rsft.trainer import SFTTrainer, collate_tensors, token_loss_sum  # noqa: E402

if TYPE_CHECKING:
    from transformers import PreTrainedModel

TRAINERS = ("whale", "whale-pack", "trl", "trl-pad", "hf", "hf-flat")
#: the largest ``--budget-s``: a week (``setitimer`` refuses infinity and overflows far beyond)
MAX_BUDGET_S = 7 * 24 * 3600
PEERS = ("trl", "trl-pad", "hf", "hf-flat")


def build_model(name: str, device: torch.device, attn: str) -> PreTrainedModel:
    """The random-weight model every trainer starts from (same seed, same device: same weights)."""
    return build_random_model(name, device, attn)


def weights_digest(model: torch.nn.Module) -> float:
    """A cheap fingerprint of the starting weights (equal for every trainer, or the comparison is void)."""
    with torch.no_grad():
        return float(sum(p.double().sum() * (i + 1) for i, p in enumerate(model.parameters())))


def adamw(model: torch.nn.Module, lr: float, device: torch.device) -> torch.optim.Optimizer:
    """The optimiser of every trainer: whale's (``SFTTrainer``) AdamW, handed to the peers too."""
    return torch.optim.AdamW(
        [p for p in model.parameters() if p.requires_grad], lr=lr, weight_decay=0.0, fused=device.type == "cuda"
    )


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def autocast(device: torch.device) -> contextlib.AbstractContextManager[Any]:
    if device.type != "cuda":
        return contextlib.nullcontext()
    return torch.autocast("cuda", dtype=torch.bfloat16)


@torch.no_grad()
def held_out_loss(model: PreTrainedModel, examples: Sequence[Example], micro: int, device: torch.device) -> float:
    """One evaluator for every trainer's final weights: token-mean loss, masked padding, same autocast."""
    was = model.training
    model.eval()
    total, tokens = 0.0, 0
    for batch in micro_batches(list(examples), micro):
        tensors = {k: torch.tensor(v, device=device) for k, v in pad_collate(batch, 0).items()}
        with autocast(device):
            loss, n = token_loss_sum(model, tensors)
        total += float(loss)
        tokens += n
    model.train(was)
    return total / tokens


def ordered_sequences(batches: Sequence[Sequence[Example]], micro: int) -> list[Example]:
    """The sequences in the order whale's trainer forwards them: minibatch by minibatch, each cut into
    micro-batches longest first. A sequential sampler with this micro-batch size then gives a peer the
    same micro-batches and, with gradient accumulation over minibatch / micro, the same updates."""
    return [e for batch in batches for m in micro_batches(list(batch), micro) for e in m]


# ----- whale --------------------------------------------------------------------------------------


def run_whale(
    args: argparse.Namespace, batches: list[list[Example]], device: torch.device, *, pack: bool
) -> dict[str, Any]:
    model = build_model(args.model, device, "sdpa")
    digest = weights_digest(model)
    compile_layers = device.type == "cuda" and not args.no_compile
    cfg = RSFTConfig(
        mini_batch_size=args.minibatch,
        micro_batch_size_per_gpu=args.micro,
        learning_rate=args.lr,
        weight_decay=0.0,
        max_grad_norm=1.0,
        precision="auto",
        compile_layers=compile_layers,
        pack_sequences=pack,
        attention="auto",
    )
    trainer = SFTTrainer(model, cfg, device=device, pad_id=0)
    warm = time.perf_counter()
    if compile_layers:
        compile_shapes(trainer, cfg, batches, device)
    warm_s = time.perf_counter() - warm
    seconds, losses = [], []
    for i, batch in enumerate(batches):
        stats = trainer.train(batch, lr=args.lr, seed=i)
        if stats.updates != 1:
            raise RuntimeError(f"whale made {stats.updates} updates on one minibatch; expected 1")
        seconds.append(stats.seconds)
        losses.append(stats.loss)
    return finish(
        model,
        digest,
        seconds,
        losses,
        warm_s,
        {
            "compile_layers": compile_layers,
            "padding": "packed" if pack else cfg.micro_padding,
            "attention": cfg.attention_kernel,
            "grad_ckpt": False,
        },
    )


def compile_shapes(
    trainer: SFTTrainer, cfg: RSFTConfig, batches: Sequence[Sequence[Example]], device: torch.device
) -> None:
    """Forward + backward once per micro-batch shape the updates will collate to (the compiled layers'
    static graphs), then drop the gradients: no optimiser step, so the updates are unchanged."""
    seen: set[tuple[int, ...]] = set()
    model = trainer.model
    for batch in batches:
        for micro in micro_batches(list(batch), cfg.micro_batch_size_per_gpu):
            tensors = collate_tensors(micro, cfg, 0, device)
            shape = tuple(tensors["input_ids"].shape)
            if shape in seen:
                continue
            seen.add(shape)
            with autocast(device):
                loss, _ = token_loss_sum(model, tensors)
            loss.backward()
            trainer.optimizer.zero_grad(set_to_none=True)
    sync(device)


# ----- the peers ----------------------------------------------------------------------------------


class StepClock:
    """A ``TrainerCallback`` recording the wall time of each optimiser update (CUDA-synchronised), and saying each
    on stderr as it ends: the Trainer prints nothing itself here, so a run cut off by a time limit still tells how
    far it got."""

    def __init__(self, device: torch.device, kind: str):
        self.device = device
        self.kind = kind
        self.marks: list[float] = []
        self.started = time.perf_counter()
        self.built: float | None = None  # set by model_built()

    def model_built(self) -> None:
        self.built = time.perf_counter()

    def mark(self) -> None:
        sync(self.device)
        self.marks.append(time.perf_counter())
        if len(self.marks) == 1:
            built = self.started if self.built is None else self.built
            said = f"training begins {self.marks[0] - built:.1f} s after the model was built"
        else:
            said = f"update {len(self.marks) - 1} took {self.marks[-1] - self.marks[-2]:.1f} s"
        print(f"{self.kind}: {said}", file=sys.stderr, flush=True)

    def callback(self) -> Any:
        from transformers import TrainerCallback

        clock = self

        class _Clock(TrainerCallback):
            def on_train_begin(self, *a: Any, **k: Any) -> None:
                clock.mark()

            def on_step_end(self, *a: Any, **k: Any) -> None:
                clock.mark()

        return _Clock()

    @property
    def seconds(self) -> list[float]:
        return [b - a for a, b in itertools.pairwise(self.marks)]

    def progress(self) -> dict[str, Any]:
        """How far the trainer got: the model built and training begun (seconds after the trainer started, or
        None), and the seconds of each update that ended."""
        return {
            "model_built_s": None if self.built is None else self.built - self.started,
            "training_began_s": self.marks[0] - self.started if self.marks else None,
            "updates_done": len(self.seconds),
            "seconds": self.seconds,
        }


RANG_IN_FRAMES = 12  # enough to see which library held the time (dynamo, inductor, a kernel's autotuner)


class OverBudget(Exception):
    """The trainer's ``--budget-s`` ran out (raised by SIGALRM in the main thread)."""


class Budget:
    """A trainer's wall-clock budget (``--budget-s``), model build included: when it runs out, SIGALRM raises
    :class:`OverBudget` wherever the main thread is, and the trainer is reported as not finishing (the issue's rule
    for a peer that does not finish) with how far it got, instead of the whole benchmark being killed from outside
    with nothing written. ``expired`` tells an exception that a library wrapped (dynamo wraps what its tracing
    raises) from a real failure."""

    def __init__(self, seconds: float | None):
        self.seconds = seconds
        self.expired = False
        self.rang_in: list[str] = []  # where the main thread was when the alarm rang, innermost last

    @property
    def verdict(self) -> str:
        return f"did not finish within --budget-s {self.seconds:g}"

    def _ring(self, signum: int, frame: Any) -> None:
        self.expired = True
        stack = [f for f in traceback.extract_stack(frame) if not f.filename.startswith("<frozen")]  # import noise
        self.rang_in = [f"{f.filename}:{f.lineno} in {f.name}" for f in stack[-RANG_IN_FRAMES:]]
        raise OverBudget(self.verdict)

    @contextlib.contextmanager
    def running(self) -> Iterator[None]:
        if not self.seconds:
            yield
            return
        self.expired = False
        previous = signal.signal(signal.SIGALRM, self._ring)
        try:
            signal.setitimer(signal.ITIMER_REAL, self.seconds)
            yield
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, previous)
        if self.expired:  # the alarm rang in code that swallowed it: the trainer still took longer than its budget
            raise OverBudget(self.verdict)


def over_budget_result(
    name: str, budget: Budget, clock: StepClock | None, compiled_before: dict[str, int]
) -> dict[str, Any]:
    """The record of a trainer that did not finish within its budget: the error line the table prints, the
    progress a later reader needs (how long the model took to build, when training began, the updates that
    ended), where the time ran out, and how much this trainer compiled (``compiled_before``: the counts at its
    start), so that "it spent the budget compiling" can be told from "it spent it training"."""
    progress = clock.progress() if clock is not None else None
    said = budget.verdict
    if progress is not None:
        began = progress["training_began_s"]
        said += (
            f" (training began after {began:.1f} s; {progress['updates_done']} updates ended)"
            if began is not None
            else " (training had not begun)"
        )
    return {
        "trainer": name,
        "error": said,
        "did_not_finish": True,
        "budget_s": budget.seconds,
        "progress": progress,
        "rang_in": budget.rang_in,
        "compiled": compiled_since(compiled_before),
    }


COMPILE_COUNTS = ("frames_started", "frames_done", "unique_graphs", "graph_breaks")


def compile_counts() -> dict[str, int]:
    """What torch.compile has done in this process so far (frames dynamo began and finished converting, graphs
    compiled by the backend, graph breaks); all zero when nothing was compiled. Dynamo keeps no count of
    recompiles: ``TORCH_LOGS=recompiles`` logs each one."""
    if "torch._dynamo" not in sys.modules:
        return dict.fromkeys(COMPILE_COUNTS, 0)
    from torch._dynamo.utils import counters

    return {
        "frames_started": counters["frames"]["total"],  # frames dynamo began to convert
        "frames_done": counters["frames"]["ok"],
        "unique_graphs": counters["stats"]["unique_graphs"],
        "graph_breaks": sum(counters["graph_break"].values()),
    }


def compiled_since(before: dict[str, int]) -> dict[str, int]:
    """What torch.compile did since ``before`` (a :func:`compile_counts`): an over-budget record's ``compiled``."""
    return {k: v - before[k] for k, v in compile_counts().items()}


def recording(cls: type) -> type:
    """``cls`` with a sequential sampler (whale's micro-batch order) and the loss of every micro-batch
    recorded as ``compute_loss`` returns it (already divided by the update's token count, so an update's
    loss is their sum)."""
    from torch.utils.data import SequentialSampler

    class Recording(cls):
        micro_losses: list[float]

        def _get_train_sampler(self, *args: Any, **kwargs: Any) -> Any:
            return SequentialSampler(self.train_dataset)

        def compute_loss(
            self, model: Any, inputs: Any, return_outputs: bool = False, num_items_in_batch: Any = None
        ) -> Any:
            out = super().compute_loss(
                model, inputs, return_outputs=return_outputs, num_items_in_batch=num_items_in_batch
            )
            loss = out[0] if return_outputs else out
            if model.training:
                self.micro_losses.append(float(loss.detach().float()))
            return out

    Recording.__name__ = f"Recording{cls.__name__}"
    return Recording


def stand_in_tokenizer() -> Any:
    """TRL wants a tokenizer with pad and eos tokens; the sequences are pre-tokenised, so any will do."""
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast

    vocab = {"<pad>": 0, "<eos>": 1, "<unk>": 2}
    return PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer(models.WordLevel(vocab, unk_token="<unk>")),
        pad_token="<pad>",
        eos_token="<eos>",
        unk_token="<unk>",
    )


def pad_with_mask(features: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
    """The plain collator: right padding to the longest, attention mask, no loss on padding."""
    batch = pad_collate([Example(tuple(f["input_ids"]), tuple(f["labels"])) for f in features], 0)
    return {k: torch.tensor(v) for k, v in batch.items()}


def run_peer(
    kind: str,
    args: argparse.Namespace,
    batches: list[list[Example]],
    device: torch.device,
    variable: bool,
    clock: StepClock,
) -> dict[str, Any]:
    from transformers import Trainer, TrainingArguments

    flat = (kind == "trl" and variable) or kind == "hf-flat"
    attn = args.trl_attn if flat else "sdpa"
    model = build_model(args.model, device, attn)
    clock.model_built()
    digest = weights_digest(model)
    sequences = ordered_sequences(batches, args.micro)
    rows = [{"input_ids": list(e.input_ids), "labels": list(e.labels)} for e in sequences]
    common = dict(
        output_dir=tempfile.mkdtemp(prefix=f"sft-vs-trl-{kind}-"),
        per_device_train_batch_size=args.micro,
        gradient_accumulation_steps=args.minibatch // args.micro,
        max_steps=len(batches),
        learning_rate=args.lr,
        lr_scheduler_type="constant",
        warmup_steps=0,
        weight_decay=0.0,
        max_grad_norm=1.0,
        adam_beta1=0.9,
        adam_beta2=0.999,
        adam_epsilon=1e-8,
        bf16=device.type == "cuda",
        use_cpu=device.type != "cuda",
        logging_steps=len(batches),
        save_strategy="no",
        report_to="none",
        seed=0,
        dataloader_num_workers=0,
        dataloader_drop_last=False,
        remove_unused_columns=False,
        disable_tqdm=True,
        torch_compile=args.peer_compile,
    )
    # no recomputation (as whale); the field's name changed in transformers 5.2x
    fields = TrainingArguments.__dataclass_fields__
    common["activation_checkpointing" if "activation_checkpointing" in fields else "gradient_checkpointing"] = False
    optimizer = adamw(model, args.lr, device)
    if kind in ("trl", "trl-pad"):
        from datasets import Dataset
        from trl import SFTConfig
        from trl import SFTTrainer as TRLSFTTrainer

        config = SFTConfig(
            **common,
            max_length=None,
            packing=False,
            padding_free=kind == "trl" and variable,
            dataset_kwargs={"skip_prepare_dataset": True},
            completion_only_loss=False,
        )
        trainer = recording(TRLSFTTrainer)(
            model=model,
            args=config,
            train_dataset=Dataset.from_list(rows),
            processing_class=stand_in_tokenizer(),
            optimizers=(optimizer, None),
            callbacks=[clock.callback()],
        )
    else:
        from transformers import DataCollatorWithFlattening

        collator: Callable[..., Any] = (
            DataCollatorWithFlattening(return_position_ids=True) if kind == "hf-flat" else pad_with_mask
        )
        trainer = recording(Trainer)(
            model=model,
            args=TrainingArguments(**common),
            train_dataset=rows,
            data_collator=collator,
            optimizers=(optimizer, None),
            callbacks=[clock.callback()],
        )
    trainer.micro_losses = []
    trainer.train()
    per_update = args.minibatch // args.micro
    micro = trainer.micro_losses
    if len(micro) != per_update * len(batches):
        raise RuntimeError(f"{kind}: {len(micro)} micro-batch losses for {len(batches)} updates of {per_update}")
    losses = [sum(micro[i * per_update : (i + 1) * per_update]) for i in range(len(batches))]
    seconds = clock.seconds
    if len(seconds) != len(batches):
        raise RuntimeError(f"{kind}: timed {len(seconds)} updates, expected {len(batches)}")
    extra = {
        "attention": attn,
        "padding_free": flat,
        "torch_compile": args.peer_compile,
        "grad_ckpt": bool(getattr(model, "is_gradient_checkpointing", False)),
    }
    del trainer, optimizer
    return finish(model, digest, seconds, losses, 0.0, extra)


# ----- results ------------------------------------------------------------------------------------


def finish(
    model: torch.nn.Module,
    digest: float,
    seconds: list[float],
    losses: list[float | None],
    warm_s: float,
    extra: dict[str, Any],
) -> dict[str, Any]:
    return {"model": model, "digest": digest, "seconds": seconds, "losses": losses, "compile_warmup_s": warm_s, **extra}


def summarise(
    name: str,
    raw: dict[str, Any],
    args: argparse.Namespace,
    batches: list[list[Example]],
    held_out: list[Example],
    device: torch.device,
) -> dict[str, Any]:
    timed = range(args.warmup, len(batches))
    tokens = [sum(len(e) for e in batches[i]) for i in timed]
    rates = [t / raw["seconds"][i] for t, i in zip(tokens, timed, strict=True)]
    cfg = MODELS[args.model]
    mfus = [
        model_flops_per_token(cfg, mean_context(batches[i])) * t / raw["seconds"][i] / (args.peak_tflops * 1e12)
        for t, i in zip(tokens, timed, strict=True)
    ]
    result = {k: v for k, v in raw.items() if k not in ("model", "seconds")}
    result.update(
        trainer=name,
        seconds=raw["seconds"],
        tokens_per_s=statistics.median(rates) if rates else 0.0,
        mfu=statistics.median(mfus) if mfus else 0.0,
        held_out_loss=held_out_loss(raw["model"], held_out, args.micro, device),
        peak_mem_gib=torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else 0.0,
    )
    return result


def compare(results: list[dict[str, Any]]) -> dict[str, Any]:
    """Ratios of whale's tokens/s to each peer's, and each trainer's largest loss gap to whale's."""
    results = [r for r in results if "error" not in r]
    if not results:
        return {}
    by = {r["trainer"]: r for r in results}
    out: dict[str, Any] = {}
    for mine in ("whale", "whale-pack"):
        if mine not in by:
            continue
        for peer in PEERS:
            if peer in by and by[peer]["tokens_per_s"]:
                out[f"{mine}/{peer}"] = by[mine]["tokens_per_s"] / by[peer]["tokens_per_s"]
    ref = by.get("whale") or results[0]
    for r in results:
        gaps = [abs(a - b) for a, b in zip(r["losses"], ref["losses"], strict=False) if a is not None and b is not None]
        out[f"loss_gap/{r['trainer']}"] = max(gaps) if gaps else None
        out[f"held_out_gap/{r['trainer']}"] = abs(r["held_out_loss"] - ref["held_out_loss"])
        out[f"same_start/{r['trainer']}"] = r["digest"] == ref["digest"]
    return out


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=sorted(MODELS), default="qwen3-1.7b")
    parser.add_argument("--seq", type=int, default=4096, help="fixed length / longest variable length")
    parser.add_argument("--lengths", default="fixed,variable", help="fixed and/or variable, comma-separated")
    parser.add_argument("--trainers", default="whale,whale-pack,trl,hf", help=f"of {', '.join(TRAINERS)}")
    parser.add_argument("--minibatch", type=int, default=16, help="sequences per optimiser update")
    parser.add_argument("--micro", type=int, default=4, help="sequences per forward/backward")
    parser.add_argument("--updates", type=int, default=3, help="timed updates per trainer")
    parser.add_argument("--warmup", type=int, default=2, help="untimed updates first (they count for the losses)")
    parser.add_argument("--lr", type=float, default=1e-5, help="large enough that the loss moves over the updates")
    parser.add_argument(
        "--trl-attn",
        default="auto",
        help="attention of the padding-free peers (auto: "
        "flex_attention on a GPU, sdpa on the CPU, where torch has no flex backward)",
    )
    parser.add_argument("--peer-compile", action="store_true", help="torch_compile=True for TRL and Trainer")
    parser.add_argument("--no-compile", action="store_true", help="whale without compiled layers")
    parser.add_argument("--peak-tflops", type=float, default=790.0)
    parser.add_argument(
        "--budget-s",
        type=float,
        help="wall seconds each trainer may take, model build included; one that does not finish is reported as "
        "such, with how far it got, and the others still run (default: no limit)",
    )
    parser.add_argument("--json", "--out", dest="out", type=Path, help="write meta + results here")
    args = parser.parse_args(argv)
    if args.budget_s is not None and not 0 < args.budget_s <= MAX_BUDGET_S:  # NaN fails too
        parser.error(
            f"--budget-s must be a positive number of seconds, at most {MAX_BUDGET_S:g} (a week), not {args.budget_s:g}"
        )
    trainers = [t.strip() for t in args.trainers.split(",") if t.strip()]
    unknown = sorted(set(trainers) - set(TRAINERS))
    if unknown:
        parser.error(f"--trainers: unknown {', '.join(unknown)}; choose from {', '.join(TRAINERS)}")
    if args.minibatch % args.micro:
        parser.error(
            f"--minibatch ({args.minibatch}) must be a multiple of --micro ({args.micro}): the peers "
            "accumulate whole micro-batches"
        )
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if args.trl_attn == "auto":
        args.trl_attn = "flex_attention" if device.type == "cuda" else "sdpa"
    vocab = MODELS[args.model]["vocab_size"]
    report: dict[str, Any] = {"meta": meta(args, device), "runs": []}
    for lengths in [s.strip() for s in args.lengths.split(",") if s.strip()]:
        if lengths not in ("fixed", "variable"):
            parser.error(f"--lengths: {lengths!r}; use fixed and/or variable")
        variable = lengths == "variable"
        batches = [
            make_examples(args.minibatch, args.seq, variable, vocab, seed=i) for i in range(args.warmup + args.updates)
        ]
        held_out = make_examples(args.minibatch, args.seq, variable, vocab, seed=10_000)
        results = []
        for name in trainers:
            if device.type == "cuda":
                torch.cuda.reset_peak_memory_stats(device)
            budget = Budget(args.budget_s)
            compiled_before = compile_counts()
            clock = None if name.startswith("whale") else StepClock(device, name)
            try:
                with budget.running():
                    raw = (
                        run_whale(args, batches, device, pack=name == "whale-pack")
                        if clock is None
                        else run_peer(name, args, batches, device, variable, clock)
                    )
                result = summarise(name, raw, args, batches, held_out, device)
                del raw
            except torch.OutOfMemoryError as exc:  # one trainer too big for the batch: the others still run
                result = {
                    "trainer": name,
                    "error": f"CUDA out of memory at --micro {args.micro}: {str(exc).splitlines()[0]}",
                }
            except Exception:  # the budget's alarm, maybe wrapped by the library it rang in
                if not budget.expired:
                    raise
                result = over_budget_result(name, budget, clock, compiled_before)
            gc.collect()
            if device.type == "cuda":
                torch.cuda.empty_cache()
            results.append(result)
            print(json.dumps({"lengths": lengths, **result}), flush=True)
        run = {"lengths": lengths, "results": results, "compare": compare(results)}
        report["runs"].append(run)
        print_table(run)
    print(json.dumps(report["meta"]))
    if args.out:
        args.out.write_text(json.dumps(report, indent=2))
    return report


def meta(args: argparse.Namespace, device: torch.device) -> dict[str, Any]:
    import transformers

    versions: dict[str, str | None] = {"torch": torch.__version__, "transformers": transformers.__version__}
    for name in ("trl", "datasets", "accelerate"):
        try:
            versions[name] = __import__(name).__version__
        except ImportError:
            versions[name] = None
    return {
        "model": args.model,
        "seq": args.seq,
        "minibatch": args.minibatch,
        "micro": args.micro,
        "updates": args.updates,
        "warmup": args.warmup,
        "lr": args.lr,
        "trl_attn": args.trl_attn,
        "peer_compile": args.peer_compile,
        "device": str(device),
        "gpu": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        **versions,
    }


def print_table(run: dict[str, Any]) -> None:
    print(f"\n{run['lengths']} lengths")
    print(
        f"{'trainer':<11} {'tokens/s':>10} {'MFU':>6} {'mem GiB':>8} {'first loss':>11} {'last loss':>11} "
        f"{'held-out':>10} {'attention':>15}"
    )
    for r in run["results"]:
        if "error" in r:
            print(f"{r['trainer']:<11} {r['error']}")
            continue
        print(
            f"{r['trainer']:<11} {r['tokens_per_s']:>10.0f} {100 * r['mfu']:>5.1f}% {r['peak_mem_gib']:>8.1f} "
            f"{r['losses'][0]:>11.5f} {r['losses'][-1]:>11.5f} {r['held_out_loss']:>10.5f} {r['attention']:>15}"
        )
    print(json.dumps(run["compare"]))


if __name__ == "__main__":
    if any(r.get("did_not_finish") for run in main()["runs"] for r in run["results"]):
        # the report is written; what the alarm abandoned (compile workers, autotuning threads) may keep the
        # interpreter from exiting, as it did on the H100, so leave without waiting for it
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)
