"""Attention for packed micro-batches (``rsft.packSequences``): one row holds several sequences, and no
token may attend across a sequence boundary.

``rsft.attention`` picks the kernel (:attr:`whale.rsft.config.RSFTConfig.attention_kernel`):

* ``flex`` (what ``auto`` means when packing): ``torch.nn.attention.flex_attention`` with a
  block-sparse *document-causal* mask built here from the restarted position ids
  (:func:`document_block_mask`): blocks of 128 x 128 positions that lie inside one sequence and below
  the diagonal run unmasked, blocks that cross no sequence are skipped, only the boundary and diagonal
  blocks evaluate the mask. The trainer passes the :class:`BlockMask` as the model's
  ``attention_mask``; the model's attention implementation is :data:`WHALE_FLEX`, which is transformers'
  SDPA for every other call (generation, unpacked batches) and flex attention for a ``BlockMask``. On a
  GPU flex attention is compiled (inside the compiled decoder layers with ``compileLayers``); torch has
  no flex backward on the CPU, so there the same document-causal mask is evaluated densely and SDPA runs
  on it (the same maths; the tests compare both kernels' forward on the CPU).
* ``varlen``: torch's own flash varlen kernel (``torch.nn.attention.varlen.varlen_attn``, torch >= 2.10, GPU)
  over the row's sequence offsets (:func:`varlen_mask`: ``cu_seqlens`` from the restarted position ids,
  built once per micro-batch on the host). No mask, no block list: each sequence is its own causal
  attention, on the dense flash kernel. The trainer passes a :class:`VarlenMask` as the decoder's prepared
  mask (``attention_mask={"full_attention": mask}``, which transformers 5 decoders take as is); the model's
  implementation is :data:`WHALE_VARLEN`, SDPA for every other call. Inside compiled layers the kernel call
  is left out of the graph (``torch.compiler.disable``: the layer compiles into a graph before and one
  after it), so the offsets and the longest length reach the kernel exactly and no shape recompiles.
  Torch has no CPU kernel; on the CPU the same document-causal attention runs densely under SDPA.
* ``sdpa``: the same document-causal mask built densely (:func:`dense_document_mask`, [B, 1, L, L]),
  which is exact but moves SDPA off its flash kernel (measured 15 % MFU against 47 % with bucket padding).
* ``flash``: transformers' ``flash_attention_2`` (``flash_attn_varlen_func`` over the position ids);
  needs the flash-attn package, which has no wheel for every torch/CUDA pairing.

The trainer hands these masks to the decoder by layer type (``{"full_attention": ..., "linear_attention":
...}``, :func:`whale.rsft.trainer.packed_masks`); the linear-attention layers of hybrid models (Qwen3.5)
get the row's sequence boundaries instead (:mod:`whale.rsft.linear_attention`). Models with sliding-window
layers are refused for packing (their windows are not part of any of these masks):
:func:`packing_problem` says so, for ``whale validate`` and for the trainer.
"""

from __future__ import annotations

import importlib.util
import inspect
import logging
import warnings
from functools import cache
from typing import TYPE_CHECKING, Any, Literal

import torch
from torch.nn.attention.flex_attention import BlockMask, create_mask, flex_attention
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from whale.rsft.linear_attention import sequence_offsets

if TYPE_CHECKING:
    from transformers import PreTrainedModel

log = logging.getLogger(__name__)

#: the name of the attention implementation registered with transformers (see the module doc)
WHALE_FLEX = "whale_flex"
#: the attention implementation of packed rows under ``rsft.attention: varlen`` (see the module doc)
WHALE_VARLEN = "whale_varlen"
#: flex attention's block edge; a packed row is padded to a multiple of it
FLEX_BLOCK = 128

#: the kernels ``rsft.attention`` resolves to (:attr:`whale.rsft.config.RSFTConfig.attention_kernel`)
Kernel = Literal["sdpa", "flex", "flash", "varlen"]


class AttentionConfigError(ValueError):
    """``rsft.attention`` cannot run with this model or this installation; the message says what to change."""


# ----- the document-causal block mask ----------------------------------------------------------------


def document_ids(position_ids: torch.Tensor) -> torch.Tensor:
    """Which packed sequence each position belongs to: a new sequence starts where the position id is 0."""
    return ((position_ids == 0).cumsum(-1) - 1).to(torch.int32)


def _ordered(blocks: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(count, indices) per query block of the kv blocks marked in ``blocks`` [B, nq, nk], marked first."""
    counts = blocks.sum(-1, dtype=torch.int32)
    order = torch.argsort(blocks.to(torch.int8), dim=-1, descending=True, stable=True).to(torch.int32)
    return counts[:, None], order[:, None]


def document_block_mask(position_ids: torch.Tensor, block_size: int = FLEX_BLOCK) -> Any:
    """The flex-attention ``BlockMask`` of a packed batch ([B, L] position ids restarting at 0 per
    sequence; L a multiple of ``block_size``): position q attends to kv iff both lie in one sequence and
    kv <= q. Built from per-block document ranges (no L x L tensor): a kv block before a query block is
    *full* when both hold one and the same sequence, *partial* when the kv block's last sequence is the
    query block's first, and the diagonal block is always partial."""
    if position_ids.dim() != 2:
        raise ValueError(f"position_ids must be [batch, length], got shape {tuple(position_ids.shape)}")
    batch, length = position_ids.shape
    if length % block_size:
        raise ValueError(
            f"a packed row of {length} positions is not a multiple of the {block_size}-block; "
            "collate_micro pads it (multiple_of)"
        )
    doc = document_ids(position_ids)
    n = length // block_size
    blocks = doc.view(batch, n, block_size)
    lo, hi = blocks.amin(-1), blocks.amax(-1)  # [B, n]: documents are nondecreasing along the row
    q_lo, q_hi = lo[:, :, None], hi[:, :, None]
    k_lo, k_hi = lo[:, None, :], hi[:, None, :]
    index = torch.arange(n, device=doc.device)
    below = index[None, :, None] > index[None, None, :]  # kv block strictly before the query block
    diagonal = index[None, :, None] == index[None, None, :]
    full = below & (q_lo == q_hi) & (k_lo == k_hi) & (q_lo == k_lo)
    partial = ((below & (k_hi == q_lo)) | diagonal) & ~full

    def document_causal(b: torch.Tensor, h: torch.Tensor, q: torch.Tensor, kv: torch.Tensor) -> torch.Tensor:
        return (doc[b, q] == doc[b, kv]) & (q >= kv)

    kv_num, kv_idx = _ordered(partial)
    full_num, full_idx = _ordered(full)
    return BlockMask.from_kv_blocks(
        kv_num,
        kv_idx,
        full_num,
        full_idx,
        BLOCK_SIZE=block_size,
        mask_mod=document_causal,
        seq_lengths=(length, length),
    )


# ----- the varlen offsets ----------------------------------------------------------------------------


class VarlenMask:
    """Where the sequences of a packed batch lie in its flattened rows: ``cu_seqlens`` [N + 1] (int32, on
    the model's device) = 0, the end of the first sequence, ..., the total; ``max_len`` the longest.

    NOTE: a plain object on purpose, not a (frozen) dataclass: torch.compile reads a frozen dataclass's
    fields as constants of the graph and would compile a new graph per row layout; the compiled layers only
    hand this object to the kernel call outside the graph, so it adds no guard on its values."""

    __slots__ = ("cu_seqlens", "max_len")

    def __init__(self, cu_seqlens: torch.Tensor, max_len: int):
        self.cu_seqlens = cu_seqlens
        self.max_len = max_len


def varlen_mask(position_ids: torch.Tensor, device: torch.device | None = None) -> VarlenMask:
    """The :class:`VarlenMask` of a packed batch ([B, L] position ids restarting at 0 per sequence; the
    padding is a sequence of its own), computed on the host (one small copy to ``device``, no sync)."""
    cu = sequence_offsets(position_ids).to(torch.int32)
    max_len = int((cu[1:] - cu[:-1]).max())
    return VarlenMask(cu.to(device if device is not None else position_ids.device), max_len)


@cache
def _varlen_signature() -> frozenset[str]:
    """The keyword arguments this torch's ``varlen_attn`` takes (2.10: ``is_causal``; later: ``window_size``,
    ``scale``, ``enable_gqa``)."""
    from torch.nn.attention.varlen import varlen_attn

    return frozenset(inspect.signature(varlen_attn).parameters)


def _dense_varlen_attention(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: VarlenMask, scale: float | None
) -> torch.Tensor:
    """The CPU stand-in of the varlen kernel ([T, H, D] in and out; k/v already at the query's heads): the
    offsets' document-causal mask evaluated densely, then SDPA."""
    total = query.shape[0]
    index = torch.arange(total, device=query.device)
    seq = torch.bucketize(index, mask.cu_seqlens[1:].to(query.device), right=True)
    allowed = (seq[:, None] == seq[None, :]) & (index[:, None] >= index[None, :])
    out = torch.nn.functional.scaled_dot_product_attention(
        query.transpose(0, 1)[None],
        key.transpose(0, 1)[None],
        value.transpose(0, 1)[None],
        attn_mask=allowed,
        scale=scale,
    )
    return out[0].transpose(0, 1)


@torch.compiler.disable
def _varlen_attention(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: VarlenMask, scale: float | None
) -> torch.Tensor:
    """[B, H, L, D] q/k/v of packed rows -> [B, L, H, D], each sequence attending causally to itself only.
    Outside any compiled graph (see the module doc)."""
    batch, heads, length, dim = query.shape
    q = query.transpose(1, 2).reshape(batch * length, heads, dim)
    k = key.transpose(1, 2).reshape(batch * length, key.shape[1], dim)
    v = value.transpose(1, 2).reshape(batch * length, value.shape[1], dim)
    groups = heads // k.shape[1]
    params = _varlen_signature() if query.device.type != "cpu" else frozenset()
    if groups > 1 and "enable_gqa" not in params:
        k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
    if query.device.type == "cpu":
        out = _dense_varlen_attention(q, k, v, mask, scale)
    else:
        from torch.nn.attention.varlen import varlen_attn

        kwargs: dict[str, Any] = {"is_causal": True} if "is_causal" in params else {"window_size": (-1, 0)}
        if groups > 1 and "enable_gqa" in params:
            kwargs["enable_gqa"] = True
        if scale is not None:
            if "scale" in params:
                kwargs["scale"] = scale
            elif abs(scale - dim**-0.5) > 1e-12:
                raise AttentionConfigError(
                    "rsft.attention varlen: this torch's varlen_attn has no scale argument and the model's attention "
                    "scale is not 1/sqrt(head_dim); use attention: flex"
                )
        cu = mask.cu_seqlens
        result = varlen_attn(q, k, v, cu, cu, mask.max_len, mask.max_len, **kwargs)
        out = result[0] if isinstance(result, tuple) else result  # (out, lse) only when asked for the lse
    return out.reshape(batch, length, heads, dim)


# ----- the attention function ------------------------------------------------------------------------

_compiled_flex: Any = None


def _flex_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, **kwargs: Any) -> torch.Tensor:
    """Flex attention: traced into the surrounding graph inside a compiled layer, compiled on its own
    otherwise (the eager kernel materialises every score)."""
    global _compiled_flex  # noqa: PLW0603 - compiled once per process, on first use
    if torch.compiler.is_compiling():
        return flex_attention(query, key, value, **kwargs)
    if _compiled_flex is None:
        _compiled_flex = torch.compile(flex_attention)
    return _compiled_flex(query, key, value, **kwargs)


def _dense_document_attention(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, block_mask: Any, scale: float | None, enable_gqa: bool
) -> torch.Tensor:
    """The CPU stand-in of flex attention (torch has no flex backward on the CPU): the block mask's own
    mask function evaluated densely, then SDPA."""
    q_len, kv_len = query.shape[-2], key.shape[-2]
    with warnings.catch_warnings():  # create_mask's vmap warns about its own internals on some versions
        warnings.simplefilter("ignore")
        mask = create_mask(block_mask.mask_mod, query.shape[0], None, q_len, kv_len, device=query.device)
    if enable_gqa:
        groups = query.shape[1] // key.shape[1]
        key, value = key.repeat_interleave(groups, dim=1), value.repeat_interleave(groups, dim=1)
    return torch.nn.functional.scaled_dot_product_attention(query, key, value, attn_mask=mask, scale=scale)


def one_dtype(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """q, k, v in one dtype: under autocast, Qwen3's q and k leave their RMSNorm in fp32 while v is bf16;
    SDPA casts them itself (an autocast op), flex attention refuses mixed dtypes."""
    device_type = query.device.type
    dtype = torch.get_autocast_dtype(device_type) if torch.is_autocast_enabled(device_type) else value.dtype
    return query.to(dtype), key.to(dtype), value.to(dtype)


def whale_flex_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: Any,
    dropout: float = 0.0,
    scaling: float | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """transformers' attention-function contract ([B, H, L, D] in, [B, L, H, D] out): flex attention
    for a ``BlockMask``, the varlen kernel for a :class:`VarlenMask` (packed rows from the trainer),
    transformers' SDPA for anything else. Imports are at module level: inside a compiled decoder layer this
    function is traced."""
    if not isinstance(attention_mask, (BlockMask, VarlenMask)):
        return sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs
        )
    kernel = "flex" if isinstance(attention_mask, BlockMask) else "varlen"
    if dropout:
        raise AttentionConfigError(
            f"rsft.attention {kernel}: attention dropout is not supported; set the model's "
            "attention_dropout to 0 or use attention: sdpa"
        )
    if kwargs.get("s_aux") is not None or kwargs.get("softcap") is not None:
        raise AttentionConfigError(
            f"rsft.attention {kernel}: attention sinks and logit soft-capping are not supported; use attention: sdpa"
        )
    query, key, value = one_dtype(query, key, value)
    if isinstance(attention_mask, VarlenMask):
        if query.device.type != "cpu" and query.dtype not in (torch.float16, torch.bfloat16):
            raise AttentionConfigError(
                f"rsft.attention varlen: the flash kernel computes in bf16/fp16, not {query.dtype}; "
                "set rsft.precision auto or bf16, or use attention: flex"
            )
        return _varlen_attention(query, key, value, attention_mask, scaling), None
    enable_gqa = query.shape[1] != key.shape[1]
    if query.device.type == "cpu":
        out = _dense_document_attention(query, key, value, attention_mask, scaling, enable_gqa)
    else:
        out = _flex_attention(query, key, value, block_mask=attention_mask, scale=scaling, enable_gqa=enable_gqa)
    return out.transpose(1, 2).contiguous(), None


def register() -> None:
    """Make :data:`WHALE_FLEX` and :data:`WHALE_VARLEN` known to transformers (idempotent): our attention
    function, and SDPA's mask builder for the calls that do not bring a packed row's mask."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    for name in (WHALE_FLEX, WHALE_VARLEN):
        AttentionInterface.register(name, whale_flex_attention)
        AttentionMaskInterface.register(name, sdpa_mask)


def dense_document_mask(position_ids: torch.Tensor) -> torch.Tensor:
    """The document-causal mask of packed rows as a dense boolean [B, 1, L, L] (True: may attend), for SDPA."""
    doc = document_ids(position_ids)
    length = doc.shape[-1]
    causal = torch.ones(length, length, dtype=torch.bool, device=doc.device).tril()
    return ((doc[:, :, None] == doc[:, None, :]) & causal)[:, None]


def packing_problem(config: Any) -> str | None:
    """Why rows of this model cannot be packed exactly (None: they can), from its config
    (:func:`whale.rsft.architecture.packing_problem`, which ``whale validate`` applies to the same config)."""
    from whale.rsft.architecture import Architecture
    from whale.rsft.architecture import packing_problem as problem_of

    return problem_of(Architecture.from_config(config))


def set_training_attention(model: PreTrainedModel, kernel: Kernel) -> None:
    """Switch ``model`` to the attention implementation ``kernel`` needs for packed rows (sdpa: leave it as
    loaded), after checking that its layers can be packed at all (:func:`packing_problem`)."""
    config = getattr(model, "config", None)
    if config is not None and (problem := packing_problem(config)):
        raise AttentionConfigError(f"rsft.packSequences: {problem}; set rsft.packSequences: false")
    if kernel == "sdpa":
        return
    if kernel in ("flex", "varlen"):
        if kernel == "varlen" and importlib.util.find_spec("torch.nn.attention.varlen") is None:
            raise AttentionConfigError(
                f"rsft.attention varlen needs torch.nn.attention.varlen (torch >= 2.10; this is {torch.__version__}); "
                "use attention: flex"
            )
        register()
        model.set_attn_implementation(WHALE_FLEX if kernel == "flex" else WHALE_VARLEN)
        return
    if importlib.util.find_spec("flash_attn") is None:
        raise AttentionConfigError(
            "rsft.attention flash needs the flash-attn package, which is not installed here (PyPI has no wheel for "
            "every torch/CUDA pairing); use attention: flex, or install flash-attn in the worker image"
        )
    try:
        model.set_attn_implementation("flash_attention_2")
    except (ImportError, ValueError) as exc:
        raise AttentionConfigError(f"rsft.attention flash: transformers refused flash_attention_2: {exc}") from exc
