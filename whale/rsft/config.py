"""The weight phase's configuration, resolved once from the run spec and the phase request.

Everything the RSFT loop needs is read here, at the edge, into one frozen :class:`RSFTConfig`; the
loop never looks at the spec again. The learning-rate schedule is a pure function of the *global*
step, so a run split into many phases (and many processes) follows one schedule. Pure: no I/O.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:  # pydantic models; imported lazily so the trainer runs where pydantic is absent
    from whale.core.protocol import WeightPhaseArgs
    from whale.core.spec import WhaleRunSpec
    from whale.rsft.collate import Sequences

#: what ``miniBatchSize`` counts (see :func:`optimizer_updates`)
MiniBatchScope = Literal["perRank", "global"]


@dataclass(frozen=True)
class RSFTConfig:
    """One weight phase. Defaults are the paper's; every field comes from ``spec.rsft`` or the request."""

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
    weight_decay: float = 0.0
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
    #: rungs per doubling of the bucket ladder, a power of two (more: less padding, more compiled shapes);
    #: 4 measured best on an H200 (46.9 % MFU, 8 graphs at 512-4096, against 45.6 % and 5 graphs with 2)
    buckets_per_octave: int = 4
    #: longest training sequence; longer ones are cut (None: the model's max length)
    max_seq_len: int | None = None
    seed: int = 0
    #: sampling parameters of the rollouts
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 20
    max_response_tokens: int = 8192
    #: global step the LR schedule decays over (the run's weight budget)
    total_steps: int = 1
    #: also checkpoint every N global steps (0: only at saveSteps and the end)
    checkpoint_every_steps: int = 0
    #: rsft.stepResume: what is saved after every step to resume at the next one (see :class:`StepResume`)
    step_resume: Literal["auto", "on", "replay", "off"] = "auto"
    #: steps per epoch of D_weight (controller's accounting; metrics' ``epoch`` = step / this)
    steps_per_epoch: int = 1
    #: "perRank" (the paper's verl: shard the kept sequences over the ranks, then cut each share into
    #: minibatches) or "global" (cut all sequences into minibatches, then share each over the ranks)
    mini_batch_scope: MiniBatchScope = "perRank"
    extra: dict[str, Any] = field(default_factory=dict)
    #: attention kernel of packed micro-batches (``pack_sequences``): "auto" = "flex", a block-sparse
    #: document mask; "varlen" = torch's flash varlen kernel; "sdpa" = transformers' dense document mask;
    #: "flash" = flash-attn varlen (:mod:`whale.rsft.attention`)
    attention: Literal["auto", "sdpa", "flex", "flash", "varlen"] = "auto"
    #: write checkpoints from a host snapshot in a background thread (:mod:`whale.rsft.checkpoint_writer`)
    async_checkpoint: bool = True
    #: packed rows filled with up to this many tokens, first fit longest first (None: ``micro_batch_size_per_gpu``
    #: sequences per row); their width follows ``padding``, capped at it (:func:`whale.rsft.collate.collate_micro`)
    pack_tokens: int | None = None

    @classmethod
    def from_spec(cls, spec: WhaleRunSpec, args: WeightPhaseArgs) -> RSFTConfig:
        """``spec.rsft`` as it is (every field of the same name), the sampling of its rollouts, the model's
        length, and what the request resolved (the run's total steps, steps per epoch)."""
        r = spec.rsft
        same = {f.name: getattr(r, f.name) for f in fields(cls) if f.name in type(r).model_fields}
        s = r.sampling
        return cls(
            **same,
            max_seq_len=spec.model.max_model_len,
            temperature=s.temperature,
            top_p=s.top_p,
            top_k=s.top_k,
            max_response_tokens=s.max_response_tokens,
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


def optimizer_updates(
    sequences: int, *, ranks: int, mini_batch_size: int, sft_epochs: int, scope: MiniBatchScope
) -> int:
    """Optimiser updates one RSFT step makes on ``sequences`` kept training sequences (one per kept
    trajectory by default; more with ``rsft.sequences: turn`` where the template rewrites history) with ``ranks`` data-parallel ranks.

    ``perRank`` (the paper's verl, which shards the batch over the ranks before the minibatch split):
    each rank holds ceil(sequences / ranks) of them and cuts them into minibatches of ``mini_batch_size``;
    the ranks step together, so one update covers up to ranks x mini_batch_size sequences:
    ``sft_epochs x ceil(ceil(sequences / ranks) / mini_batch_size)``.
    ``global``: minibatches of ``mini_batch_size`` over all ranks: ``sft_epochs x ceil(sequences / mini_batch_size)``.
    No sequence, no update. The one formula both trainers follow (:func:`update_groups`) and ``whale plan`` prints."""
    if sequences <= 0:
        return 0
    if ranks < 1 or mini_batch_size < 1 or sft_epochs < 0:
        raise ValueError(
            f"ranks ({ranks}) and miniBatchSize ({mini_batch_size}) must be >= 1, sftEpochs ({sft_epochs}) >= 0"
        )
    if scope == "perRank":
        per_rank = -(-sequences // ranks)
        return sft_epochs * -(-per_rank // mini_batch_size)
    if scope == "global":
        return sft_epochs * -(-sequences // mini_batch_size)
    raise ValueError(f"rsft.miniBatchScope: unknown value {scope!r}; use perRank or global")


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
