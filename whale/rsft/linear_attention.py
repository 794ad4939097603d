"""Packed rows through the linear-attention layers of hybrid models (Qwen3.5's gated delta-net).

Qwen3.5 is a hybrid: three of every four decoder layers are *gated delta-net* linear attention (a causal
depthwise conv1d over the q/k/v projections, then the chunked gated delta rule, a recurrence whose state
runs along the row), the fourth full attention. A document mask keeps the full-attention layers of a packed
row apart (:mod:`whale.rsft.attention`), but the linear layers take no mask: transformers' own forward runs
its conv and its recurrence straight across the row, so each packed sequence sees the tail of the one before
it (the conv's window and the recurrent state leak). Its boundary arguments reach only the CUDA packages
(``causal-conv1d``'s ``seq_idx``, ``flash-linear-attention``'s ``cu_seqlens``) and the keyword names differ
across transformers versions.

So whale carries a packed row's sequence boundaries to those layers itself. :func:`sequence_boundaries`
builds a :class:`SequenceBoundaries` from the row's restarting position ids (on the host, once per
micro-batch), the trainer passes it as the decoder's ``linear_attention`` mask, and :func:`install` gives each
gated delta-net layer a subclass whose forward sends a packed row through :func:`packed_gated_delta_net`:

* the conv1d is evaluated as its K shifted taps, a tap reaching back ``s`` tokens masked where the position
  id is below ``s`` (it would cross into the previous sequence): exact, on any device, a few element-wise
  ops that a compiled layer fuses;
* the gated delta rule starts every sequence from a zero state: on a GPU through ``flash-linear-attention``'s
  chunked kernel with ``cu_seqlens`` (one launch for the row), elsewhere through the model's own PyTorch
  chunked rule applied to each sequence in turn (the unpacked computation, sequence by sequence).

Any other input (an unpacked or padded batch, generation with a cache) goes to the layer's own forward:
right padding comes after every real token, so neither the causal conv nor the recurrence carries it into
a real token. Layers of another layout (Qwen3-Next's fused ``in_proj_qkvz``) are refused for packing
(:func:`install` raises), which ``whale validate`` says before a run starts.
"""

from __future__ import annotations

import importlib.util
import logging
import sys
from collections.abc import Callable, Hashable
from functools import cache
from typing import Any, cast

import torch
import torch.nn.functional as F

log = logging.getLogger(__name__)

#: the layer type of a linear-attention decoder layer in a hybrid model's ``config.layer_types``
LINEAR_ATTENTION = "linear_attention"

#: what a gated delta-net layer must hold for :func:`packed_gated_delta_net` (Qwen3.5's layout)
_QWEN35_PARTS = (
    "in_proj_qkv",
    "in_proj_z",
    "in_proj_b",
    "in_proj_a",
    "conv1d",
    "A_log",
    "dt_bias",
    "norm",
    "out_proj",
    "key_dim",
    "value_dim",
    "head_k_dim",
    "head_v_dim",
)


class PackedLinearAttentionError(ValueError):
    """A linear-attention layer whale cannot keep packed sequences apart in; the message says what to change."""


class SequenceBoundaries:
    """Where the sequences of a packed batch lie, for the linear-attention layers: ``position_ids`` [B, L]
    (restarting at 0 per sequence, on the model's device; the conv's taps are masked from them),
    ``cu_seqlens`` [N + 1] int64 over the flattened rows (flash-linear-attention's offsets) and ``lengths``
    (the same, on the host: the per-sequence path splits by them without reading the GPU).

    NOTE: a plain object, not a dataclass, as :class:`whale.rsft.attention.VarlenMask`: the compiled layers
    hand it to :func:`gated_delta_rule`, which runs outside the graph, so its values add no guard."""

    __slots__ = ("cu_seqlens", "lengths", "position_ids")

    def __init__(self, position_ids: torch.Tensor, cu_seqlens: torch.Tensor, lengths: tuple[int, ...]):
        self.position_ids = position_ids
        self.cu_seqlens = cu_seqlens
        self.lengths = lengths


def sequence_offsets(position_ids: torch.Tensor) -> torch.Tensor:
    """Where each sequence of a packed batch starts in its flattened rows, and the total (int64, on the host):
    [B, L] position ids restart at 0 per sequence; each row starts one (its padding is a sequence of its own)."""
    if position_ids.dim() != 2:
        raise ValueError(f"position_ids must be [batch, length], got shape {tuple(position_ids.shape)}")
    pos = position_ids.detach().to("cpu")
    if pos.numel() == 0 or bool((pos[:, 0] != 0).any()):
        raise ValueError("a packed row must start a sequence: its first position id must be 0")
    flat = pos.reshape(-1)
    starts = torch.nonzero(flat == 0).reshape(-1)
    return torch.cat([starts, torch.tensor([flat.numel()])]).to(torch.int64)


def sequence_boundaries(position_ids: torch.Tensor, device: torch.device | None = None) -> SequenceBoundaries:
    """The :class:`SequenceBoundaries` of a packed batch ([B, L] host position ids restarting at 0 per
    sequence; the row's padding is a sequence of its own)."""
    cu = sequence_offsets(position_ids)
    lengths = tuple(int(n) for n in (cu[1:] - cu[:-1]).tolist())
    target = device if device is not None else position_ids.device
    return SequenceBoundaries(position_ids.to(target), cu.to(target), lengths)


def linear_layer_count(config: Any) -> int:
    """How many decoder layers of ``config`` (or its ``text_config``) are linear attention."""
    for candidate in (config, getattr(config, "text_config", None)):
        types = getattr(candidate, "layer_types", None)
        if types:
            return sum(1 for t in types if t == LINEAR_ATTENTION)
    return 0


# ----- the two packed kernels -------------------------------------------------------------------------


def segment_conv1d(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    position_ids: torch.Tensor,
    activation: Callable[[torch.Tensor], torch.Tensor] | None,
) -> torch.Tensor:
    """The causal depthwise conv1d of ``x`` [B, C, L] with ``weight`` [C, K], restarted at every sequence:
    ``out[t] = sum_s weight[K-1-s] * x[t-s]`` over the taps ``s < K`` that stay inside ``t``'s sequence
    (``position_ids[t] >= s``). Accumulated in fp32, as the conv kernels do; returned in ``x``'s dtype."""
    taps = weight.shape[-1]
    length = x.shape[-1]
    xf, wf = x.float(), weight.float()
    out = xf * wf[:, taps - 1 : taps]
    for s in range(1, taps):
        shifted = F.pad(xf, (s, 0))[..., :length]
        inside = (position_ids >= s).unsqueeze(1)
        out = out + torch.where(inside, shifted, 0.0) * wf[:, taps - 1 - s : taps - s]
    if bias is not None:
        out = out + bias.float()[:, None]
    if activation is not None:
        out = activation(out)
    return out.to(x.dtype)


@cache
def fla_available() -> bool:
    """Whether flash-linear-attention (the ``fla-core`` / ``flash-linear-attention`` distributions) is
    importable: the GPU kernel of the packed gated delta rule."""
    return importlib.util.find_spec("fla") is not None


def _fla_chunk_gated_delta_rule() -> Callable[..., Any]:
    from fla.ops.gated_delta_rule import chunk_gated_delta_rule  # type: ignore[import-not-found,unused-ignore]

    return chunk_gated_delta_rule  # type: ignore[no-any-return,unused-ignore]


@torch.compiler.disable
def gated_delta_rule(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    boundaries: SequenceBoundaries,
    reference: Callable[..., Any],
) -> torch.Tensor:
    """The gated delta rule ([B, L, H, D] q/k/v, [B, L, H] g/beta; q and k L2-normalised inside) with a
    zero state at every sequence start. Outside any compiled graph: the offsets reach the kernel as they
    are and no row layout recompiles. ``reference`` is the model's own PyTorch chunked rule."""
    batch, length = query.shape[:2]
    flat = [t.reshape(1, batch * length, *t.shape[2:]).contiguous() for t in (query, key, value, g, beta)]
    q, k, v, gg, bb = flat
    if q.shape[2] != v.shape[2]:  # grouped value heads: each q/k head serves consecutive value heads
        groups = v.shape[2] // q.shape[2]
        q, k = q.repeat_interleave(groups, dim=2), k.repeat_interleave(groups, dim=2)
    if query.is_cuda and fla_available():
        out, _ = _fla_chunk_gated_delta_rule()(
            q,
            k,
            v,
            g=gg,
            beta=bb,
            initial_state=None,
            output_final_state=False,
            cu_seqlens=boundaries.cu_seqlens,
            use_qk_l2norm_in_kernel=True,
        )
    else:
        pieces = []
        for qs, ks, vs, gs, bs in zip(*(t.split(boundaries.lengths, dim=1) for t in (q, k, v, gg, bb)), strict=True):
            piece, _ = reference(qs, ks, vs, g=gs, beta=bs, output_final_state=False, use_qk_l2norm_in_kernel=True)
            pieces.append(piece)
        out = torch.cat(pieces, dim=1)
    return out.reshape(batch, length, *out.shape[2:])


def packed_gated_delta_net(module: torch.nn.Module, hidden_states: torch.Tensor, boundaries: SequenceBoundaries) -> Any:
    """Qwen3.5's gated delta-net layer on a packed row, every sequence on its own (see the module doc)."""
    m: Any = module
    batch, length, _ = hidden_states.shape
    mixed = m.in_proj_qkv(hidden_states).transpose(1, 2)
    z = m.in_proj_z(hidden_states).reshape(batch, length, -1, m.head_v_dim)
    b = m.in_proj_b(hidden_states)
    a = m.in_proj_a(hidden_states)
    activation = _activation(getattr(m, "activation", None))
    mixed = segment_conv1d(mixed, m.conv1d.weight.squeeze(1), m.conv1d.bias, boundaries.position_ids, activation)
    query, key, value = torch.split(mixed.transpose(1, 2), [m.key_dim, m.key_dim, m.value_dim], dim=-1)
    query = query.reshape(batch, length, -1, m.head_k_dim)
    key = key.reshape(batch, length, -1, m.head_k_dim)
    value = value.reshape(batch, length, -1, m.head_v_dim)
    beta = b.sigmoid()
    g = -m.A_log.float().exp() * F.softplus(a.float() + m.dt_bias)  # fp32: A might overflow in half precision
    core = gated_delta_rule(query, key, value, g, beta, boundaries, _reference_rule(module))
    core = m.norm(core.reshape(-1, m.head_v_dim), z.reshape(-1, m.head_v_dim))
    return m.out_proj(core.reshape(batch, length, -1))


def _activation(name: str | None) -> Callable[[torch.Tensor], torch.Tensor] | None:
    if name is None:
        return None
    from transformers.activations import ACT2FN

    return ACT2FN[name]


def _reference_rule(module: torch.nn.Module) -> Callable[..., Any]:
    """The model's own PyTorch chunked gated delta rule (transformers' modeling module of ``module``)."""
    rule = getattr(sys.modules.get(type(module).__module__), "torch_chunk_gated_delta_rule", None)
    if rule is None:
        raise PackedLinearAttentionError(
            f"{type(module).__name__}: this transformers has no torch_chunk_gated_delta_rule beside the layer; "
            "upgrade transformers (>= 5.2) or set rsft.packSequences: false"
        )
    return rule


# ----- installing the packed path ---------------------------------------------------------------------


def _is_linear_layer(module: torch.nn.Module) -> bool:
    return getattr(module, "layer_type", None) == LINEAR_ATTENTION or type(module).__name__.endswith("GatedDeltaNet")


def install(model: torch.nn.Module) -> int:
    """Give every linear-attention layer of ``model`` the packed path (:class:`_PackedLayer`): a packed row (a
    :class:`SequenceBoundaries` as its ``attention_mask``) goes through :func:`packed_gated_delta_net`; returns
    how many layers have it (0 for a model without linear attention). Idempotent. Raises
    :class:`PackedLinearAttentionError` for a layer of another layout than Qwen3.5's."""
    count = 0
    for module in model.modules():
        if not _is_linear_layer(module):
            continue
        missing = [part for part in _QWEN35_PARTS if not hasattr(module, part)]
        if missing:
            raise PackedLinearAttentionError(
                f"rsft.packSequences: {type(module).__name__} is a linear-attention layer of a layout whale cannot keep "
                f"packed sequences apart in (it lacks {', '.join(missing)}; Qwen3.5's gated delta-net is supported); "
                "set rsft.packSequences: false"
            )
        _reference_rule(module)
        if not isinstance(module, _PackedLayer):
            module.__class__ = _packed_class(cast(Hashable, type(module)))
        count += 1
    if count and not fla_available() and torch.cuda.is_available():
        log.warning(
            "packed rows through %d linear-attention layers without flash-linear-attention: the gated delta rule "
            "runs sequence by sequence in PyTorch (exact, slow); install fla-core in the worker image",
            count,
        )
    return count


class _PackedLayer:
    """Mixed into a linear-attention layer's class by :func:`install`: a packed row goes through
    :func:`packed_gated_delta_net`, anything else to the layer's own forward.

    NOTE: a subclass swapped in, not an instance attribute ``forward``: compiled decoder layers (dynamo) and
    the ``kernels`` package's hub-layer wrapper both resolve ``forward`` on the class."""

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        mask = kwargs.get("attention_mask")
        if isinstance(mask, SequenceBoundaries):
            hidden = kwargs["hidden_states"] if "hidden_states" in kwargs else args[0]
            if kwargs.get("cache") is not None or kwargs.get("cache_params") is not None:
                raise PackedLinearAttentionError("a packed row is a training input: it takes no cache")
            return packed_gated_delta_net(self, hidden, mask)  # type: ignore[arg-type]
        return super().forward(*args, **kwargs)  # type: ignore[misc]


@cache
def _packed_class(base: Hashable) -> type:
    """``base`` with :class:`_PackedLayer`'s forward in front, one class per layer class. NOTE: made at run
    time, so a model holding it cannot be pickled whole; nothing does (checkpoints are state dicts)."""
    cls = cast(type, base)
    return type(f"Packed{cls.__name__}", (_PackedLayer, cls), {"__module__": cls.__module__})
