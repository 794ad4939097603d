"""What a model's architecture allows the trainer to do, read from its config alone (no torch, no weights).

``whale validate`` reads the config of ``spec.experiment.model`` (a local folder's ``config.json``, or the Hugging Face
cache's) and the train workload reads it again before it loads any weights; both refuse here every setting of
``spec.experiment.rsft`` that cannot run on the model, or that would let packed sequences see each other:

* packed rows (``rsft.packSequences``) need every layer's sequence boundaries: full-attention layers get a
  document mask (:mod:`whale.rsft.attention`, any ``rsft.attention``), the linear-attention layers of
  Qwen3.5's layout get them through :mod:`whale.rsft.linear_attention`; sliding-window layers (no packed mask
  models their window) and linear-attention layers of another layout are refused, with the setting that works
  (``packSequences: false``: padded micro-batches, which are exact for every architecture).
* padding is exact everywhere: right padding comes after every real token, and neither attention, nor a causal
  conv, nor a recurrence carries it back into one.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

#: layer types whose packed rows whale keeps apart
FULL_ATTENTION, LINEAR_ATTENTION = "full_attention", "linear_attention"
#: model types whose linear-attention layers are Qwen3.5's gated delta-net (what the packed path implements)
GATED_DELTA_NET_TYPES = frozenset({"qwen3_5", "qwen3_5_text", "qwen3_5_moe", "qwen3_5_moe_text"})


def _get(config: Any, key: str, default: Any = None) -> Any:
    if isinstance(config, Mapping):
        return config.get(key, default)
    return getattr(config, key, default)


@dataclasses.dataclass(frozen=True)
class Architecture:
    """The parts of a model's config that decide how it may be trained."""

    #: ``model_type`` of the language model (a multimodal checkpoint's ``text_config``'s)
    model_type: str
    #: one entry per decoder layer (empty: every layer is full attention)
    layer_types: tuple[str, ...]
    #: the config turns a sliding window on for (some of) its attention layers
    sliding_window: bool

    @classmethod
    def from_config(cls, config: Any) -> Architecture:
        """From a ``config.json`` mapping or a transformers config; Qwen3.5's multimodal checkpoints keep the
        language model's in ``text_config``."""
        text = _get(config, "text_config")
        if text is None or not _get(text, "layer_types"):
            text = config
        model_type = str(_get(text, "model_type") or _get(config, "model_type") or "unknown")
        layer_types = tuple(str(t) for t in (_get(text, "layer_types") or ()))
        sliding = bool(_get(text, "use_sliding_window", False) and _get(text, "sliding_window"))
        return cls(model_type, layer_types, sliding)

    @property
    def linear_layers(self) -> int:
        return sum(1 for t in self.layer_types if t == LINEAR_ATTENTION)

    @property
    def unpackable_layer_types(self) -> tuple[str, ...]:
        """Layer types no packed mask models (sliding windows, chunked attention, ...)."""
        return tuple(sorted({t for t in self.layer_types if t not in (FULL_ATTENTION, LINEAR_ATTENTION)}))

    def describe(self) -> str:
        if self.linear_layers:
            return (
                f"{self.model_type}: {self.linear_layers} of {len(self.layer_types)} layers linear attention (hybrid)"
            )
        return self.model_type


def packing_problem(arch: Architecture) -> str | None:
    """Why rows of this model cannot be packed exactly (None: they can), without the fix."""
    if arch.unpackable_layer_types:
        return f"this model ({arch.model_type}) has {', '.join(arch.unpackable_layer_types)} layers, which no packed mask models"
    if arch.sliding_window:
        return f"this model ({arch.model_type}) has sliding-window attention layers, which no packed mask models"
    if arch.linear_layers and arch.model_type not in GATED_DELTA_NET_TYPES:
        return (
            f"this model ({arch.model_type}) has linear-attention layers of a layout whale cannot keep packed "
            "sequences apart in (Qwen3.5's gated delta-net is supported)"
        )
    return None


def training_problems(arch: Architecture, *, pack_sequences: bool) -> list[str]:
    """Every ``spec.experiment.rsft`` setting this architecture refuses, each naming the field and a setting that works."""
    if pack_sequences and (problem := packing_problem(arch)):
        return [
            f"spec.experiment.rsft.packSequences: {problem}; set rsft.packSequences: false (padded micro-batches are exact)"
        ]
    return []
