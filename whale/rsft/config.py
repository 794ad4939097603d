"""The weight phase's configuration: the spec's parts (``spec.experiment.rsft``, its sampling) plus what the phase request
resolved, in one frozen :class:`RSFTConfig` the RSFT loop reads instead of the spec.

The config is a plain dataclass so the trainer imports where only torch is installed (no pydantic). Its
fields are the spec's fields of the same name (:data:`FROM_RSFT`, :data:`FROM_SAMPLING`), values derived from
the spec and the request (:data:`DERIVED`), and the trainer's own knobs (:data:`TRAINER_ONLY`). The spec owns
the defaults: a default here is the spec's value, repeated so the config can be built without pydantic (tests,
GPU benchmarks), and tests/unit/test_rsft_config.py fails when one differs. The learning-rate schedule is a
pure function of the *global* step, so a run split into many phases (and many processes) follows one schedule.
Pure: no I/O.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from whale.core.batching import MiniBatchScope

if TYPE_CHECKING:  # pydantic models; imported lazily so the trainer runs where pydantic is absent
    from whale.core.protocol import WeightPhaseArgs
    from whale.core.spec import RSFT, Sampling, WhaleRunSpec
    from whale.rsft.collate import Sequences


@dataclass(frozen=True)
class RSFTConfig:
    """One weight phase: ``spec.experiment.rsft`` and its sampling, the model's length and the run's step accounting.
    Defaults are the spec's (the paper's); only :meth:`from_spec` builds one for a run."""

    # ---- spec.experiment.rsft (FROM_RSFT) ----
    #: prompts of D_weight per RSFT step
    prompts_per_step: int = 256
    #: rollouts sampled per prompt with the current weights
    rollouts_per_prompt: int = 8
    #: keep trajectories with reward strictly above this
    score_threshold: float = 0.5
    #: SFT epochs over the kept trajectories of one step
    sft_epochs: int = 1
    #: sequences per optimiser update, per data-parallel rank or over all ranks (``mini_batch_scope``)
    mini_batch_size: int = 64
    #: sequences per forward/backward on one device (gradient accumulation fills the minibatch)
    micro_batch_size_per_gpu: int = 2
    learning_rate: float = 1e-7
    lr_scheduler: Literal["constant", "cosine", "linear"] = "constant"
    warmup_steps: int = 0
    #: AdamW weight decay (the paper's 0.01, verl's default)
    weight_decay: float = 0.01
    max_grad_norm: float = 1.0
    #: "auto" = bf16 autocast over fp32 master weights on a GPU, fp32 on the CPU
    precision: Literal["auto", "bf16", "fp32"] = "auto"
    gradient_checkpointing: bool = False
    #: torch.compile each decoder layer (regional compilation: one graph, reused by every layer) and the
    #: LM head's cross-entropy (:func:`whale.rsft.trainer.compiled_head_cross_entropy`)
    compile_layers: bool = False
    #: concatenate a micro-batch's sequences into one row (no padding) instead of padding them
    pack_sequences: bool = False
    #: a multi-turn trace is one training sequence (the reference's) or, where the template rewrites history, one
    #: per turn (:mod:`whale.rsft.collate`)
    sequences: Sequences = "trajectory"
    #: how padded micro-batches are shaped (see :func:`whale.rsft.collate.collate_micro`); "auto" =
    #: "bucket" with compiled layers (few shapes, graphs reused), else "longest"; "masked" = the old path
    padding: Literal["auto", "bucket", "longest", "masked"] = "auto"
    #: seed of the prompt order and of each step's sampling and shuffles (the paper's launchers: 42)
    seed: int = 42
    #: also checkpoint every N global steps (0: only at saveSteps and the end)
    checkpoint_every_steps: int = 0
    #: rsft.stepResume: what is saved after every step to resume at the next one (see :class:`StepResume`)
    step_resume: Literal["auto", "on", "replay", "off"] = "auto"
    #: "perRank" (the paper's verl: shard the kept sequences over the ranks, then cut each share into
    #: minibatches) or "global" (cut all sequences into minibatches, then share each over the ranks)
    mini_batch_scope: MiniBatchScope = "perRank"
    #: attention kernel of packed micro-batches (``pack_sequences``): "auto" = "flex", a block-sparse
    #: document mask; "varlen" = torch's flash varlen kernel; "sdpa" = transformers' dense document mask;
    #: "flash" = flash-attn varlen (:mod:`whale.rsft.attention`)
    attention: Literal["auto", "sdpa", "flex", "flash", "varlen"] = "auto"
    #: write checkpoints from a host snapshot in a background thread (:mod:`whale.rsft.checkpoint_writer`)
    async_checkpoint: bool = True
    #: packed rows filled with up to this many tokens, first fit longest first (None: ``micro_batch_size_per_gpu``
    #: sequences per row); their width follows ``padding``, capped at it (:func:`whale.rsft.collate.collate_micro`)
    pack_tokens: int | None = None
    # ---- spec.experiment.rsft.sampling (FROM_SAMPLING): the rollouts ----
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 20
    max_response_tokens: int = 8192
    # ---- derived from the spec and the phase request (DERIVED) ----
    #: longest training sequence; longer ones are cut (spec.experiment.model.maxModelLen; None: the model's max length)
    max_seq_len: int | None = None
    #: global step the LR schedule decays over (the run's weight budget)
    total_steps: int = 1
    #: steps per epoch of D_weight (controller's accounting; metrics' ``epoch`` = step / this)
    steps_per_epoch: int = 1
    # ---- the trainer's own (TRAINER_ONLY): not in the spec ----
    #: rungs per doubling of the bucket ladder, a power of two (more: less padding, more compiled shapes);
    #: 4 measured best on an H200 (46.9 % MFU, 8 graphs at 512-4096, against 45.6 % and 5 graphs with 2)
    buckets_per_octave: int = 4
    extra: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_parts(
        cls, rsft: RSFT, sampling: Sampling, *, max_seq_len: int | None, total_steps: int, steps_per_epoch: int
    ) -> RSFTConfig:
        """The spec's parts as they are (every field named in :data:`FROM_RSFT` and :data:`FROM_SAMPLING`) and the
        derived values."""
        return cls(
            **{name: getattr(rsft, name) for name in FROM_RSFT},
            **{name: getattr(sampling, name) for name in FROM_SAMPLING},
            max_seq_len=max_seq_len,
            total_steps=total_steps,
            steps_per_epoch=steps_per_epoch,
        )

    @classmethod
    def from_spec(cls, spec: WhaleRunSpec, args: WeightPhaseArgs) -> RSFTConfig:
        """``spec.experiment.rsft`` and its sampling, the model's length, and what the request resolved (the run's total
        steps, steps per epoch)."""
        return cls.from_parts(
            spec.experiment.rsft,
            spec.experiment.rsft.sampling,
            max_seq_len=spec.experiment.model.max_model_len,
            total_steps=max(args.total_steps, args.target_step, 1),
            steps_per_epoch=max(1, args.steps_per_epoch),
        )

    @property
    def rollouts_per_step(self) -> int:
        return self.prompts_per_step * self.rollouts_per_prompt

    @property
    def attention_kernel(self) -> Literal["sdpa", "flex", "flash", "varlen"]:
        """``attention`` with "auto" resolved: flex for packed micro-batches, else SDPA."""
        if self.attention == "auto":
            return "flex" if self.pack_sequences else "sdpa"
        return self.attention

    @property
    def row_tokens(self) -> int | None:
        """Most tokens a packed row holds when rows are filled by tokens (``pack_tokens`` with ``pack_sequences``)."""
        return self.pack_tokens if self.pack_sequences else None

    @property
    def micro_padding(self) -> Literal["bucket", "longest", "masked"]:
        """``padding`` with "auto" resolved."""
        if self.padding == "auto":
            return "bucket" if self.compile_layers else "longest"
        return self.padding


#: RSFTConfig fields that are spec.experiment.rsft's fields of the same name
FROM_RSFT: tuple[str, ...] = (
    "prompts_per_step", "rollouts_per_prompt", "score_threshold", "sft_epochs", "mini_batch_size",
    "micro_batch_size_per_gpu", "learning_rate", "lr_scheduler", "warmup_steps", "weight_decay", "max_grad_norm",
    "precision", "gradient_checkpointing", "compile_layers", "pack_sequences", "padding", "seed",
    "checkpoint_every_steps", "step_resume", "mini_batch_scope", "attention", "async_checkpoint", "pack_tokens",
    "sequences",
)  # fmt: skip
#: RSFTConfig fields that are spec.experiment.rsft.sampling's fields of the same name
FROM_SAMPLING: tuple[str, ...] = ("temperature", "top_p", "top_k", "max_response_tokens")
#: RSFTConfig fields computed from the spec and the phase request (:meth:`RSFTConfig.from_spec`)
DERIVED: tuple[str, ...] = ("max_seq_len", "total_steps", "steps_per_epoch")
#: RSFTConfig fields the spec does not have
TRAINER_ONLY: tuple[str, ...] = ("buckets_per_octave", "extra")
#: spec.experiment.rsft fields the config leaves out: one choice only (optimizer), read by the controller
#: (keepCheckpoints), or a part of its own (sampling)
NOT_FROM_RSFT: tuple[str, ...] = ("optimizer", "keep_checkpoints", "sampling")
#: spec.experiment.rsft.sampling fields the config leaves out: the harness runtime's episode bounds
NOT_FROM_SAMPLING: tuple[str, ...] = ("episode_token_budget", "episode_window_tokens")


def lr_at(step: int, cfg: RSFTConfig) -> float:
    """Learning rate of global RSFT step ``step`` (0-based): linear warm-up, then the schedule.

    One RSFT step uses one learning rate for all its optimiser updates."""
    if cfg.warmup_steps and step < cfg.warmup_steps:
        return cfg.learning_rate * (step + 1) / cfg.warmup_steps
    if cfg.lr_scheduler == "constant":
        return cfg.learning_rate
    span = max(1, cfg.total_steps - cfg.warmup_steps)
    progress = min(1.0, max(0.0, (step - cfg.warmup_steps) / span))
    if cfg.lr_scheduler == "linear":
        return cfg.learning_rate * (1.0 - progress)
    return cfg.learning_rate * 0.5 * (1.0 + math.cos(math.pi * progress))


def should_checkpoint(step: int, cfg: RSFTConfig, save_steps: set[int] | frozenset[int], target: int) -> bool:
    """Whether global step ``step`` (just finished, 1-based count of steps done) gets a checkpoint."""
    if step == target or step in save_steps:
        return True
    return bool(cfg.checkpoint_every_steps) and step % cfg.checkpoint_every_steps == 0
