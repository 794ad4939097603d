"""SFT on the kept trajectories of one RSFT step: minibatches, micro-batches, token-mean loss.

One call of :meth:`SFTTrainer.train` runs ``sftEpochs`` passes over the step's sequences, in
seeded-shuffled minibatches of ``miniBatchSize`` sequences (per data-parallel rank, as the paper's
verl, or over all ranks: ``miniBatchScope``), each one optimiser update accumulated over
micro-batches of ``microBatchSizePerGpu``. The loss of a minibatch is the sum of
the per-token cross-entropies of its loss-carrying tokens divided by their count (token mean), so
a long trajectory weighs by its tokens, not as one sample. Only those tokens are projected through
the LM head (``logits`` of prompt tokens are never formed), which saves the vocabulary matmul on
prompt tokens. Parameters stay fp32 (master weights: updates of 1e-7 vanish in bf16); on a GPU the
forward/backward runs under bf16 autocast. Data-parallel: each rank trains on its share of every
update and the token count is all-reduced, so the normalisation is global. Micro-batches are padded
(``rsft.padding``) or packed into one row (``rsft.packSequences``), whose sequences are kept apart by
the attention kernel ``rsft.attention`` picks (:mod:`whale.rsft.attention`: a flex-attention document
mask by default; torch's flash varlen kernel with ``rsft.attention: varlen``), and with ``rsft.packTokens``
packed by tokens into nearly full rows (:func:`whale.rsft.collate.micro_batches`).
"""

from __future__ import annotations

import contextlib
import functools
import logging
import random
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F

from whale.rsft.collate import IGNORE_INDEX, Example, collate_micro, micro_batches, update_groups
from whale.rsft.config import RSFTConfig
from whale.rsft.linear_attention import LINEAR_ATTENTION

if TYPE_CHECKING:
    from transformers import PreTrainedModel

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SFTStats:
    """What one step's SFT did."""

    #: token-mean loss over every minibatch of the step (None: nothing trained)
    loss: float | None
    #: loss-carrying tokens trained on (all epochs, all ranks)
    tokens: int
    #: optimiser updates made
    updates: int
    seconds: float

    @property
    def tokens_per_second(self) -> float:
        return self.tokens / self.seconds if self.seconds > 0 else 0.0


def resolve_precision(precision: str, device: torch.device) -> torch.dtype | None:
    """The autocast dtype (None: plain fp32). ``auto`` is bf16 on a GPU, fp32 on the CPU."""
    if precision == "fp32" or (precision == "auto" and device.type != "cuda"):
        return None
    if precision in ("bf16", "auto"):
        return torch.bfloat16
    raise ValueError(f"rsft.precision: unknown value {precision!r}; use auto, bf16 or fp32")


def _world() -> tuple[int, int]:
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_rank(), torch.distributed.get_world_size()
    return 0, 1


def _all_reduce_sum(value: float, device: torch.device) -> float:
    _rank, world = _world()
    if world == 1:
        return value
    t = torch.tensor([value], dtype=torch.float64, device=device)
    torch.distributed.all_reduce(t)
    return float(t.item())


def head_cross_entropy(
    hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, target: torch.Tensor
) -> torch.Tensor:
    """Summed cross-entropy of ``target`` under the LM head's logits of ``hidden``, softmax in fp32."""
    return F.cross_entropy(F.linear(hidden, weight, bias).float(), target, reduction="sum")


@functools.cache
def compiled_head_cross_entropy() -> Callable[..., torch.Tensor]:
    """:func:`head_cross_entropy` compiled once per process (dynamic in the token count). Eagerly the fp32
    upcast, the log-softmax and their gradients each pass over a tokens x vocabulary tensor (20 GB of fp32
    logits at 32k tokens x Qwen3's 152k vocabulary); compiled, the upcast is fused into the softmax's
    reductions and the backward writes the bf16 gradient of the logits directly."""
    compiled = torch.compile(head_cross_entropy, dynamic=True)

    def quiet(
        hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, target: torch.Tensor
    ) -> torch.Tensor:
        with warnings.catch_warnings():  # dynamo reads ``.grad`` of the (non-leaf) hidden states when tracing
            warnings.filterwarnings("ignore", message="The .grad attribute of a Tensor that is not a leaf")
            return compiled(hidden, weight, bias, target)

    return quiet


#: keys of a collated batch (:func:`collate_tensors`) naming the positions that carry loss, found on the host:
#: selecting them on the GPU by a boolean mask would wait for the GPU (the result's size is read back), which
#: keeps the host from preparing the next micro-batch while the GPU runs this one
LOSS_INDEX, LOSS_TARGET, LOSS_TOKENS = "loss_index", "loss_target", "loss_tokens"


def loss_positions(labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, int]:
    """Where ``labels`` (rows x width) put loss: each predicting position as an index into the rows' flattened
    positions (row * width + t, predicting ``labels[row, t + 1]``), the targets in that order, their count."""
    target = labels[:, 1:]
    selected = target != IGNORE_INDEX
    rows, cols = selected.nonzero(as_tuple=True)
    return rows * labels.shape[1] + cols, target[selected], len(rows)


def token_loss_sum(
    model: PreTrainedModel, batch: dict[str, Any], *, compiled: bool = False
) -> tuple[torch.Tensor, int]:
    """Sum of next-token cross-entropies over the loss-carrying tokens of ``batch``, and their count.

    ``batch['labels'][b, t]`` is the target for the prediction made at ``t - 1``; -100 = no loss.
    Only the hidden states that predict a labelled token go through the LM head, chosen by the positions
    :func:`collate_tensors` found on the host (else from the labels here); ``compiled`` runs the head and
    the loss through :func:`compiled_head_cross_entropy` (with compiled decoder layers)."""
    if LOSS_INDEX in batch:
        index, target, n = batch[LOSS_INDEX], batch[LOSS_TARGET], batch[LOSS_TOKENS]
    else:
        index, target, n = loss_positions(batch["labels"])
    inputs = {k: batch[k] for k in ("input_ids", "attention_mask", "position_ids") if k in batch}
    head = model.get_output_embeddings()
    config = getattr(model, "config", None)
    plain_head = (
        head is not None
        and not getattr(config, "final_logit_softcapping", None)
        and not getattr(config, "logit_scale", None)
    )
    if plain_head:
        decoder = getattr(model, model.base_model_prefix)
        hidden = decoder(**inputs, use_cache=False).last_hidden_state
        hidden = hidden.reshape(-1, hidden.shape[-1]).index_select(0, index)
        if compiled and isinstance(head, torch.nn.Linear):
            return compiled_head_cross_entropy()(hidden, head.weight, head.bias, target), n
        logits = head(hidden)
    else:  # models whose head does more than a matmul: take their logits as they are
        return logits_loss_sum(model(**inputs, use_cache=False).logits, index, target), n
    return F.cross_entropy(logits.float(), target, reduction="sum"), n


def logits_loss_sum(logits: torch.Tensor, index: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Summed fp32 cross-entropy of ``target`` at the flattened positions ``index`` of full ``logits``."""
    picked = logits.reshape(-1, logits.shape[-1]).index_select(0, index)
    return F.cross_entropy(picked.float(), target, reduction="sum")


def read_back_loss_sum(losses: Sequence[torch.Tensor]) -> float:
    """An update's micro-batch losses read back at once (one wait for the GPU), summed in order."""
    return float(sum(torch.stack(list(losses)).tolist())) if losses else 0.0


#: compiled graphs a decoder layer may hold (one per bucket width x micro-batch rows) before torch
#: falls back to eager; torch's default (8) is fewer than the bucket ladder has rungs
RECOMPILE_LIMIT = 64


def compile_decoder_layers(model: torch.nn.Module, *, dynamic: bool | None = None) -> int:
    """``torch.compile`` every decoder layer in place (the classes HF lists in ``_no_split_modules``);
    fuses the norms, rotary and activation kernels that dominate a small model's step in eager mode.
    ``dynamic=False`` with bucketed widths: one static graph per bucket, each reused by every layer."""
    import torch._dynamo

    conf = torch._dynamo.config
    for key in ("recompile_limit", "cache_size_limit"):  # the name changed across torch versions
        if hasattr(conf, key):
            setattr(conf, key, max(getattr(conf, key), RECOMPILE_LIMIT))
            break
    names = set(getattr(model, "_no_split_modules", None) or [])
    count = 0
    for module in model.modules():
        if type(module).__name__ in names:
            module.compile(dynamic=dynamic)
            count += 1
    return count


def enable_activation_checkpointing(model: PreTrainedModel) -> None:
    """Recompute every decoder layer in the backward pass (non-reentrant). transformers >= 5.2x names this
    ``activation_checkpointing_enable`` and deprecates ``gradient_checkpointing_enable``; older 5.x (the GPU
    image's 5.17) has only the latter."""
    enable = getattr(model, "activation_checkpointing_enable", None)
    if enable is not None:
        enable(activation_checkpointing_kwargs={"use_reentrant": False})
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})


def prepare_model(model: PreTrainedModel, cfg: RSFTConfig, *, compile_layers: bool | None = None) -> None:
    """What every trainer does to the model before its optimiser sees it: the attention kernel of packed
    micro-batches, gradient checkpointing and regional compilation as ``cfg`` asks (``compile_layers``
    overrides ``cfg.compile_layers``)."""
    if cfg.pack_sequences:
        from whale.rsft import linear_attention
        from whale.rsft.attention import set_training_attention

        set_training_attention(model, cfg.attention_kernel)
        linear_attention.install(model)
    if cfg.gradient_checkpointing:
        enable_activation_checkpointing(model)
    if cfg.compile_layers if compile_layers is None else compile_layers:
        # bucketed widths: static graphs; otherwise let torch go dynamic
        compile_decoder_layers(model, dynamic=False if cfg.micro_padding == "bucket" else None)


def collate_tensors(micro: Sequence[Example], cfg: RSFTConfig, pad_id: int, device: torch.device) -> dict[str, Any]:
    """A micro-batch on ``device`` shaped the way ``cfg`` says (every trainer's collation): tensors, and for
    packed rows the decoder's prepared masks as ``attention_mask``, one per layer type: the full-attention
    layers' document mask (flex: a ``BlockMask``; varlen: the sequence offsets, a ``VarlenMask``; sdpa: the
    dense document-causal mask; flash: none, transformers reads the restarted position ids) and the
    linear-attention layers' sequence boundaries (:mod:`whale.rsft.linear_attention`; models without such
    layers never read them)."""
    from whale.rsft.attention import FLEX_BLOCK

    kernel = cfg.attention_kernel
    flex = cfg.pack_sequences and kernel == "flex"
    raw = collate_micro(
        micro,
        pad_id,
        padding=cfg.micro_padding,
        pack=cfg.pack_sequences,
        max_len=cfg.max_seq_len,
        per_octave=cfg.buckets_per_octave,
        multiple_of=FLEX_BLOCK if flex else 1,
        row_tokens=cfg.row_tokens,
    )
    host = {k: torch.tensor(v, dtype=torch.long) for k, v in raw.items()}
    host[LOSS_INDEX], host[LOSS_TARGET], n = loss_positions(host["labels"])
    batch: dict[str, Any] = {k: _to_device(t, device) for k, t in host.items()}
    batch[LOSS_TOKENS] = n
    if cfg.pack_sequences:
        batch["attention_mask"] = packed_masks(kernel, host["position_ids"], batch["position_ids"], device)
    return batch


def packed_masks(
    kernel: str, host_positions: torch.Tensor, positions: torch.Tensor, device: torch.device
) -> dict[str, Any]:
    """The prepared masks of a packed batch, by layer type (see :func:`collate_tensors`), each built once
    and shared by every layer of its type."""
    from whale.rsft.attention import dense_document_mask, document_block_mask, varlen_mask
    from whale.rsft.linear_attention import sequence_boundaries

    full: Any = None
    if kernel == "flex":
        full = document_block_mask(positions)
    elif kernel == "varlen":
        full = varlen_mask(host_positions, device)
    elif kernel == "sdpa":
        full = _to_device(dense_document_mask(host_positions), device)
    return {"full_attention": full, LINEAR_ATTENTION: sequence_boundaries(host_positions, device)}


def _to_device(tensor: torch.Tensor, device: torch.device) -> torch.Tensor:
    """To a GPU from pinned memory without waiting for the GPU's queue (a pageable copy waits)."""
    if device.type != "cuda":
        return tensor.to(device)
    return tensor.pin_memory().to(device, non_blocking=True)


def sft_epochs(
    examples: Sequence[Example],
    cfg: RSFTConfig,
    optimizer: Any,
    device: torch.device,
    *,
    lr: float,
    seed: str | int,
    update: Callable[[Sequence[Sequence[Example]], Sequence[Example], int], float],
) -> SFTStats:
    """The SFT loop every trainer shares: ``sftEpochs`` passes, each a seeded shuffle cut into optimiser
    updates as ``miniBatchScope`` says (:func:`whale.rsft.collate.update_groups`; their number is
    :func:`whale.core.batching.optimizer_updates`). Each rank trains on its share of an update, the token
    count is global, and ``update(shares, local, n_tokens)`` makes one optimiser update returning this
    rank's summed token loss (the engines differ only there). Token-mean loss over all ranks' shares.

    NOTE: verl normalises each rank's minibatch by its own token count and averages the ranks'
    gradients; here one update is the token mean over every rank's share (the same when the ranks hold
    equally many loss tokens, and independent of how the sequences fall on the ranks)."""
    start = time.perf_counter()
    rank, world = _world()
    examples = [e for e in examples if e.n_target > 0]
    for group in optimizer.param_groups:
        group["lr"] = lr
    loss_total, tokens_total, updates = 0.0, 0, 0
    for epoch in range(cfg.sft_epochs):
        rng = random.Random(f"whale-rsft-minibatch:{seed}:{epoch}")
        for shares in update_groups(examples, cfg.mini_batch_size, world, cfg.mini_batch_scope, rng):
            local = shares[rank]
            n_tokens = int(_all_reduce_sum(sum(e.n_target for e in local), device))
            if n_tokens == 0:
                continue
            loss_total += _all_reduce_sum(update(shares, local, n_tokens), device)
            tokens_total += n_tokens
            updates += 1
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return SFTStats(
        loss=(loss_total / tokens_total) if tokens_total else None,
        tokens=tokens_total,
        updates=updates,
        seconds=time.perf_counter() - start,
    )


class SFTTrainer:
    """Owns the model's optimiser and runs the SFT of each RSFT step."""

    def __init__(self, model: PreTrainedModel, cfg: RSFTConfig, *, device: torch.device, pad_id: int):
        self.model = model
        self.cfg = cfg
        self.device = device
        self.pad_id = pad_id
        self.autocast_dtype = resolve_precision(cfg.precision, device)
        prepare_model(model, cfg)
        params = [p for p in model.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(
            params,
            lr=cfg.learning_rate,
            weight_decay=cfg.weight_decay,
            fused=device.type == "cuda",
        )

    # ----- state for resume ----------------------------------------------------------------------

    def optimizer_state(self) -> dict[str, Any]:
        return self.optimizer.state_dict()

    def load_optimizer_state(self, state: dict[str, Any]) -> None:
        self.optimizer.load_state_dict(state)

    # ----- training ------------------------------------------------------------------------------

    def _autocast(self) -> contextlib.AbstractContextManager[Any]:
        if self.autocast_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=self.autocast_dtype)

    def collate(self, micro: Sequence[Example]) -> dict[str, Any]:
        return collate_tensors(micro, self.cfg, self.pad_id, self.device)

    def train(self, examples: Sequence[Example], *, lr: float, seed: str | int) -> SFTStats:
        """SFT on ``examples`` for ``sftEpochs``; no examples (or no loss tokens) = no update at all."""
        self.model.train()
        return sft_epochs(examples, self.cfg, self.optimizer, self.device, lr=lr, seed=seed, update=self._update)

    def _update(self, shares: Sequence[Sequence[Example]], local: Sequence[Example], n_tokens: int) -> float:
        """One optimiser update on this rank's share of it; returns its summed token loss."""
        world = _world()[1]
        losses = []  # read back once per update: a read per micro-batch would wait for the GPU each time
        for micro in micro_batches(local, self.cfg.micro_batch_size_per_gpu, row_tokens=self.cfg.row_tokens):
            batch = self.collate(micro)
            with self._autocast():
                loss, _ = token_loss_sum(self.model, batch, compiled=self.cfg.compile_layers)
            (loss / n_tokens).backward()
            losses.append(loss.detach())
        if world > 1:  # each rank's loss is already over the global token count: sum the grads
            for p in self.model.parameters():
                if p.requires_grad:
                    if p.grad is None:  # a rank with no sequence in this minibatch
                        p.grad = torch.zeros_like(p)
                    torch.distributed.all_reduce(p.grad)
        if self.cfg.max_grad_norm:
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.cfg.max_grad_norm)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return read_back_loss_sum(losses)
