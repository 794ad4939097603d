"""SFT through a DeepSpeed engine (ZeRO-2/3), for weight phases launched with torchrun on several GPUs.

Used only when ``spec.execution.train.deepspeedConfig`` names a DeepSpeed JSON (``images/worker/ds_zero2.json``,
``ds_zero3.json``); ``deepspeed`` is imported here and nowhere else. Same contract as
:class:`whale.rsft.trainer.SFTTrainer`, same maths:

* the JSON's batch keys are overwritten from the spec: ``train_micro_batch_size_per_gpu`` =
  ``microBatchSizePerGpu``, ``gradient_accumulation_steps`` = ceil(``miniBatchSize`` / micro) when
  ``miniBatchScope`` is perRank (the paper's), ceil(``miniBatchSize`` / (micro × world)) when global,
  ``train_batch_size`` = their product (DeepSpeed's bookkeeping: the boundary is set explicitly), ``gradient_clipping`` = ``maxGradNorm``,
  ``bf16.enabled`` from ``rsft.precision``; an ``optimizer``/``scheduler`` section is dropped (the
  trainer's AdamW and the RSFT LR schedule rule);
* collation and the model's preparation are :class:`SFTTrainer`'s (``collate_tensors``,
  ``prepare_model``): packed micro-batches get the same attention path (:mod:`whale.rsft.attention`);
* one optimiser update per minibatch, token-mean over the minibatch's loss tokens on all ranks:
  each micro-batch's summed loss is scaled by ``world / global tokens`` (DeepSpeed averages the
  gradients over ranks) and the accumulation boundary is set explicitly, so a short last minibatch
  is still exactly one update. Every rank runs the same number of micro-batches (a rank with fewer
  sequences runs a zero-weighted one): ZeRO's collectives need it.

State: ``optimizer_state`` gathers every rank's ZeRO partition to rank 0 (``{"format":
"deepspeed-zero", "world": N, "shards": [bytes, ...]}``, each shard ``torch.save``-d), saved by the leader as the usual ``optimizer.pt``);
``load_optimizer_state`` gives each rank its shard back and restores the fp32 master weights
from it (same world size only; otherwise the optimiser starts fresh, with a warning). HF weights
of a ZeRO-3 model are gathered to rank 0 before saving (``gathered_state_dict``); they are the
engine's bf16 weights (the fp32 masters live in the optimiser state).
"""

from __future__ import annotations

import io
import json
import logging
import math
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from whale.rsft.collate import Example, micro_batches
from whale.rsft.config import RSFTConfig
from whale.rsft.trainer import (
    LOSS_INDEX,
    LOSS_TARGET,
    SFTStats,
    _world,
    collate_tensors,
    logits_loss_sum,
    prepare_model,
    read_back_loss_sum,
    resolve_precision,
    sft_epochs,
    token_loss_sum,
)

if TYPE_CHECKING:
    from transformers import PreTrainedModel

log = logging.getLogger(__name__)

STATE_FORMAT = "deepspeed-zero"


class DeepSpeedConfigError(ValueError):
    """The DeepSpeed JSON cannot be used; the message names the file and the fix."""


def read_config(path: str | Path) -> dict[str, Any]:
    p = Path(path)
    try:
        raw = json.loads(p.read_text(encoding="utf-8"))
    except FileNotFoundError as exc:
        raise DeepSpeedConfigError(
            f"spec.execution.train.deepspeedConfig: {p} does not exist in this image; use images/worker/ds_zero2.json or "
            "ds_zero3.json (or a path that exists in spec.cluster.images.worker)"
        ) from exc
    except json.JSONDecodeError as exc:
        raise DeepSpeedConfigError(f"spec.execution.train.deepspeedConfig: {p} is not valid JSON: {exc}") from exc
    if not isinstance(raw, dict):
        raise DeepSpeedConfigError(f"spec.execution.train.deepspeedConfig: {p} must hold a JSON object")
    return raw


def zero_stage(raw: dict[str, Any]) -> int:
    return int((raw.get("zero_optimization") or {}).get("stage", 0))


def engine_config(raw: dict[str, Any], cfg: RSFTConfig, world_size: int, bf16: bool) -> dict[str, Any]:
    """The DeepSpeed config the engine gets: the JSON with the batch/precision keys from the spec. Pure."""
    micro = cfg.micro_batch_size_per_gpu
    per_rank = cfg.mini_batch_size if cfg.mini_batch_scope == "perRank" else cfg.mini_batch_size / world_size
    gas = max(1, math.ceil(per_rank / micro))
    out = {k: v for k, v in raw.items() if k not in ("optimizer", "scheduler", "fp16", "train_batch_size")}
    out.update(
        train_micro_batch_size_per_gpu=micro,
        gradient_accumulation_steps=gas,
        train_batch_size=micro * gas * world_size,
        gradient_clipping=float(cfg.max_grad_norm or 0.0),
        zero_allow_untested_optimizer=True,
    )
    out["bf16"] = {**(raw.get("bf16") or {}), "enabled": bf16}
    return out


class DeepSpeedTrainer:
    """:class:`SFTTrainer`'s interface over a DeepSpeed engine (see the module doc)."""

    #: optimizer_state / gathered_state_dict are collectives: the leader tells the followers first
    collective_state = True

    def __init__(
        self,
        model: PreTrainedModel,
        cfg: RSFTConfig,
        *,
        device: torch.device,
        pad_id: int,
        config_path: str | Path,
        world_size: int,
    ):
        import deepspeed  # lazily: only this path needs it

        self.cfg = cfg
        self.device = device
        self.pad_id = pad_id
        raw = read_config(config_path)
        self.stage = zero_stage(raw)
        bf16 = resolve_precision(cfg.precision, device) is torch.bfloat16
        self.ds_config = engine_config(raw, cfg, world_size, bf16)
        # ZeRO-3 swaps parameters in and out around each layer through hooks: compiled layers would
        # trace that machinery, so only ZeRO-1/2 (whole parameters on every rank) compile them
        compile_layers = cfg.compile_layers and self.stage < 3
        if cfg.compile_layers and not compile_layers:
            log.warning("rsft.compileLayers is ignored under ZeRO-3; the layers run eagerly")
        prepare_model(model, cfg, compile_layers=compile_layers)
        params = [p for p in model.parameters() if p.requires_grad]
        optimizer = torch.optim.AdamW(params, lr=cfg.learning_rate, weight_decay=cfg.weight_decay)
        self.engine, self.optimizer, _, _ = deepspeed.initialize(
            model=model, optimizer=optimizer, config=self.ds_config
        )
        self.model = self.engine.module
        log.info(
            "DeepSpeed ZeRO-%d engine: micro %d x accumulation %d x world %d, bf16 %s",
            self.stage,
            self.ds_config["train_micro_batch_size_per_gpu"],
            self.ds_config["gradient_accumulation_steps"],
            world_size,
            bf16,
        )

    # ----- state ---------------------------------------------------------------------------------

    def optimizer_state(self) -> dict[str, Any]:
        """Every rank's ZeRO partition, on rank 0 (collective; other ranks get ``{}``)."""
        rank, world = _world()
        buf = io.BytesIO()  # DeepSpeed objects (loss scaler, enums) inside: kept as bytes, see load
        torch.save(self.optimizer.state_dict(), buf)
        shard = buf.getvalue()
        shards: list[Any] | None = [None] * world if rank == 0 else None
        torch.distributed.gather_object(shard, shards, dst=0)
        if rank != 0:
            return {}
        return {"format": STATE_FORMAT, "stage": self.stage, "world": world, "shards": shards}

    def load_optimizer_state(self, state: dict[str, Any]) -> None:
        _rank, world = _world()
        if state.get("format") != STATE_FORMAT or int(state.get("world", -1)) != world:
            log.warning(
                "optimiser state is not a %d-rank DeepSpeed state (format %s, world %s); starting a fresh "
                "optimiser from the checkpoint's weights",
                world,
                state.get("format"),
                state.get("world"),
            )
            return
        # Unpickled in full (not weights_only): the shards hold DeepSpeed classes, and they come from this
        # run's own resume state, written by optimizer_state above.
        shards = [torch.load(io.BytesIO(b), map_location="cpu", weights_only=False) for b in state["shards"]]
        self.optimizer.load_state_dict(shards, load_optimizer_states=True, load_from_fp32_weights=True)

    def gathered_state_dict(self) -> dict[str, torch.Tensor] | None:
        """ZeRO-3: the full weights on rank 0 (collective). ZeRO-1/2: None (every rank holds them)."""
        if self.stage < 3:
            return None
        return self.engine._zero3_consolidated_16bit_state_dict()

    # ----- training ------------------------------------------------------------------------------

    def collate(self, micro: Sequence[Example]) -> dict[str, Any]:
        return collate_tensors(micro, self.cfg, self.pad_id, self.device)

    def _loss_sum(self, batch: dict[str, Any]) -> torch.Tensor:
        """ZeRO-1/2: the LM head on loss positions only (as SFTTrainer). ZeRO-3: through the engine's
        full forward, so a weight tied between embedding and head gets both gradients (calling the
        decoder and the head separately lost the embedding's share under ZeRO-3's partitioning)."""
        if self.stage < 3:
            return token_loss_sum(self.engine.module, batch, compiled=self.cfg.compile_layers)[0]
        inputs = {k: batch[k] for k in ("input_ids", "attention_mask", "position_ids") if k in batch}
        return logits_loss_sum(self.engine(**inputs, use_cache=False).logits, batch[LOSS_INDEX], batch[LOSS_TARGET])

    def train(self, examples: Sequence[Example], *, lr: float, seed: str | int) -> SFTStats:
        self.engine.train()
        return sft_epochs(examples, self.cfg, self.optimizer, self.device, lr=lr, seed=seed, update=self._update)

    def _update(self, shares: Sequence[Sequence[Example]], local: Sequence[Example], n_tokens: int) -> float:
        """One engine step. Every rank runs the same number of micro-batches (a rank short of
        sequences backs a zero-weighted one), so the accumulation boundary is collective."""
        world = _world()[1]
        micro_size = self.cfg.micro_batch_size_per_gpu
        row_tokens = self.cfg.row_tokens
        micros = micro_batches(local, micro_size, row_tokens=row_tokens)
        # the same on every rank
        n_micro = max(
            len(micro_batches(share, micro_size, row_tokens=row_tokens))
            if row_tokens is not None
            else math.ceil(len(share) / micro_size)
            for share in shares
        )
        filler = next(e for share in shares for e in share)
        losses = []  # read back once per update, not per micro-batch (each read waits for the GPU)
        for i in range(n_micro):
            real = i < len(micros)
            batch = self.collate(micros[i] if real else [filler])
            self.engine.set_gradient_accumulation_boundary(i == n_micro - 1)
            loss = self._loss_sum(batch)
            self.engine.backward(loss * (world / n_tokens if real else 0.0), scale_wrt_gas=False)
            if real:
                losses.append(loss.detach())
        self.engine.step()
        return read_back_loss_sum(losses)
