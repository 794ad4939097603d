"""SFT throughput (tokens/s) and MFU of the RSFT trainer (``whale.rsft.trainer.SFTTrainer``).

Runs the trainer's real code path (collation, selective LM head, token-mean loss, fp32 master
weights + bf16 autocast, fused AdamW, gradient accumulation) on a randomly initialised model built
from a config, on random token sequences, and reports per variant: trained tokens per second and
model FLOPs utilisation against a given peak (default 790 TFLOP/s, the measured dense bf16 ceiling
of an H200).

Model FLOPs per trained token = 3 x forward, forward = 2 x (matmul parameters, LM head included)
+ causal attention 2 x 2 x layers x (heads x head_dim) x mean context. Recomputation under gradient
checkpointing is *not* counted (MFU, not hardware FLOPs utilisation).

Variants (``--variants``):
  fixed       every sequence --seq tokens, micro-batches padded (no padding occurs)
  fixed-gc    the same with gradient checkpointing and a larger micro-batch
  var-pad     lengths uniform in [seq/8, seq], micro-batches right-padded with a padding mask
              (rsft.padding=masked, the path before bucketing)
  var-longest the same lengths, right-padded to the micro-batch's longest, no mask (flash kernel)
  var-bucket  the same, padded to the bucket ladder (256, 384, 512, 768, ...; --buckets-per-octave)
  var-pack    the same sequences packed into one row per micro-batch (position ids restart), SDPA
              with transformers' dense document mask (rsft.attention=sdpa)
  var-mb1     variable lengths, one sequence per micro-batch (no padding, no mask: flash path)
  *-compile   the same with every decoder layer torch.compile'd (rsft.compile_layers); the bucket
              variant compiles one static graph per width, each width the timed minibatches
              use during warm-up (as a long run would have them already); the others
              let torch go dynamic after the second shape
  var-pack-flex  packed, flex attention with whale's block-sparse document mask (rsft.attention=flex,
              whale.rsft.attention); var-pack-flex-compile: with compiled layers, each packed row
              padded to the bucket ladder (and a multiple of 128), one static graph per width
  var-pack-flash packed, flash-attn's varlen kernel (rsft.attention=flash; needs flash-attn)
  var-pack-varlen packed, torch's flash varlen kernel over the rows' sequence offsets (rsft.attention=varlen,
              torch >= 2.10, GPU); var-pack-varlen-compile: with compiled layers, rows on the bucket ladder
              (the kernel call stays outside the compiled graphs)
  *-fixed-compile  packed by tokens (rsft.packTokens = --seq x micro): each row filled with up to that many
              tokens (longest first, first fit), padded to its rung capped at packTokens, so most rows share
              one width; the number of sequences per row varies (var-pack-flex-fixed-compile,
              var-pack-varlen-fixed-compile); var-pack-flex-fixed-compile-tuned: the same with the flex
              kernels' block sizes autotuned (inductor max_autotune, matmuls left to ATen);
              var-pack-flex-fixed-compile-eager-loss: the LM head's cross-entropy left eager (before
              compiled layers also compiled it: fp32 logits of every token, materialised)

GPU (one H200; the paper's models: --model qwen3.5-2b, qwen3.5-4b, random weights of their shapes; the
packed path of their linear-attention layers needs flash-linear-attention, ``fla-core``)::

    python benchmarks/sft_throughput.py --model qwen3.5-2b --seq 4096 --json sft.json

CPU smoke test of the script itself::

    python benchmarks/sft_throughput.py --model tiny --seq 128 --minibatch 4 --updates 1 --warmup 0
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import torch

from whale.rsft.attention import FLEX_BLOCK
from whale.rsft.collate import IGNORE_INDEX, Example, collate_micro, micro_batches
from whale.rsft.config import RSFTConfig
from whale.rsft.trainer import SFTTrainer

if str(Path(__file__).resolve().parents[1]) not in sys.path:  # for tests.fixtures.models (the hub's processor config)
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.fixtures.models import write_hub_processor

if TYPE_CHECKING:
    from transformers import PreTrainedModel

MODELS: dict[str, dict[str, Any]] = {
    # Qwen3-1.7B's shape (config.json of Qwen/Qwen3-1.7B)
    "qwen3-1.7b": dict(
        vocab_size=151936,
        hidden_size=2048,
        intermediate_size=6144,
        num_hidden_layers=28,
        num_attention_heads=16,
        num_key_value_heads=8,
        head_dim=128,
        max_position_embeddings=40960,
        rope_theta=1000000.0,
        tie_word_embeddings=True,
        rms_norm_eps=1e-6,
    ),
    "tiny": dict(
        vocab_size=512,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=4096,
        tie_word_embeddings=True,
    ),
    # The paper's models (Qwen3.5-2B: search QA, math; Qwen3.5-4B: chess), their language models' shapes:
    # three gated delta-net linear-attention layers to every full (gated) attention layer
    "qwen3.5-2b": dict(
        model_type="qwen3_5",
        vocab_size=248320,
        hidden_size=2048,
        intermediate_size=6144,
        num_hidden_layers=24,
        num_attention_heads=8,
        num_key_value_heads=2,
        head_dim=256,
        linear_num_key_heads=16,
        linear_num_value_heads=16,
        linear_key_head_dim=128,
        linear_value_head_dim=128,
        linear_conv_kernel_dim=4,
        max_position_embeddings=262144,
        tie_word_embeddings=True,
        rms_norm_eps=1e-6,
    ),
    "qwen3.5-4b": dict(
        model_type="qwen3_5",
        vocab_size=248320,
        hidden_size=2560,
        intermediate_size=9216,
        num_hidden_layers=32,
        num_attention_heads=16,
        num_key_value_heads=4,
        head_dim=256,
        linear_num_key_heads=16,
        linear_num_value_heads=32,
        linear_key_head_dim=128,
        linear_value_head_dim=128,
        linear_conv_kernel_dim=4,
        max_position_embeddings=262144,
        tie_word_embeddings=True,
        rms_norm_eps=1e-6,
    ),
    "tiny-qwen3.5": dict(
        model_type="qwen3_5",
        vocab_size=512,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        linear_num_key_heads=2,
        linear_num_value_heads=4,
        linear_key_head_dim=16,
        linear_value_head_dim=16,
        linear_conv_kernel_dim=4,
        max_position_embeddings=4096,
        tie_word_embeddings=True,
    ),
}


def model_config(name: str, **overrides: Any) -> Any:
    """The transformers config of ``MODELS[name]`` (Qwen3, or Qwen3.5's language model), with ``overrides``
    (e.g. ``vocab_size``, ``num_hidden_layers``: the config derives its per-layer settings from them)."""
    shape = {**MODELS[name], **overrides}
    if shape.pop("model_type", "qwen3") == "qwen3_5":
        from transformers import Qwen3_5TextConfig

        return Qwen3_5TextConfig(**shape)
    from transformers import Qwen3Config

    return Qwen3Config(**shape)


#: the vision tower written beside a benchmark's Qwen3.5 language model in the hub's form (a small one: the
#: paper's agents read text, and no weight sync or SFT update touches it)
HUB_VISION_SHAPE: dict[str, Any] = {"depth": 1, "hidden_size": 128, "intermediate_size": 256, "num_heads": 2}


def save_hub_form(model: Any, tokenizer: Any, out: Path, dtype: torch.dtype = torch.bfloat16) -> None:
    """Write a Qwen3.5 language model (``Qwen3_5ForCausalLM``) as the hub's checkpoints are:
    ``Qwen3_5ForConditionalGeneration``, the language model under ``model.language_model``, a vision tower
    (:data:`HUB_VISION_SHAPE`, random) beside it. vLLM (0.24) registers only that architecture for Qwen3.5, and
    the train workload loads the language model out of it as it does the paper's checkpoints."""
    from transformers import Qwen3_5Config, Qwen3_5ForConditionalGeneration

    text = model.config.to_dict()
    vision = {**HUB_VISION_SHAPE, "out_hidden_size": text["hidden_size"]}
    config = Qwen3_5Config(text_config=text, vision_config=vision, tie_word_embeddings=text["tie_word_embeddings"])
    device = next(model.parameters()).device
    with torch.device(device):
        hub: Any = Qwen3_5ForConditionalGeneration(config)
    hub = hub.to(dtype)
    hub.model.language_model.load_state_dict(model.model.state_dict())
    if not text["tie_word_embeddings"]:
        hub.lm_head.load_state_dict(model.lm_head.state_dict())
    hub.generation_config = model.generation_config
    out.mkdir(parents=True, exist_ok=True)
    hub.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    # the hub's image processor config: vLLM 0.24 builds the multimodal processor at start-up and refuses a folder
    # without one (seen on the H200); the train workload's checkpoints carry it on (whale.rsft.hub_form)
    write_hub_processor(out)
    del hub


def build_random_model(name: str, device: torch.device, attn: str) -> PreTrainedModel:
    """``MODELS[name]`` with random weights (seed 0, fp32 master weights) on ``device``."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(model_config(name), attn_implementation=attn, dtype=torch.float32)
    model.config.use_cache = False
    return model


@dataclass(frozen=True)
class Variant:
    name: str
    variable: bool
    pack: bool
    grad_ckpt: bool
    micro: int
    compile: bool = False
    attn: str | None = None
    #: rsft.padding of the run (the pre-bucketing variants keep the masked path they measured)
    padding: Literal["bucket", "longest", "masked"] = "masked"
    #: rsft.attention of packed variants (the first packed variants measured SDPA's dense document mask)
    attention: Literal["sdpa", "flex", "flash", "varlen"] = "sdpa"
    #: rsft.packTokens = --seq x micro (rows filled by tokens) instead of micro sequences per row
    fill_rows: bool = False
    #: autotune the compiled flex-attention kernels (inductor's max_autotune, matmuls left to ATen)
    flex_autotune: bool = False
    #: keep the LM head's cross-entropy eager under compiled layers (the path before it was compiled)
    eager_loss: bool = False


def variants(micro: int, micro_gc: int) -> dict[str, Variant]:
    #: packed by tokens (*-fixed-compile): name, attention, flex kernels autotuned, loss left eager
    filled_rows: tuple[tuple[str, Literal["flex", "varlen"], bool, bool], ...] = (
        ("var-pack-flex-fixed-compile", "flex", False, False),
        ("var-pack-flex-fixed-compile-tuned", "flex", True, False),
        ("var-pack-flex-fixed-compile-eager-loss", "flex", False, True),
        ("var-pack-varlen-fixed-compile", "varlen", False, False),
    )
    return {
        "fixed": Variant("fixed", False, False, False, micro),
        "fixed-gc": Variant("fixed-gc", False, False, True, micro_gc),
        "var-pad": Variant("var-pad", True, False, False, micro),
        "var-pack": Variant("var-pack", True, True, False, micro),
        "var-pack-gc": Variant("var-pack-gc", True, True, True, micro_gc),
        "fixed-compile": Variant("fixed-compile", False, False, False, micro, compile=True),
        "fixed-gc-compile": Variant("fixed-gc-compile", False, False, True, micro_gc, compile=True),
        "var-pad-compile": Variant("var-pad-compile", True, False, False, micro, compile=True),
        "var-pack-compile": Variant("var-pack-compile", True, True, False, micro, compile=True),
        "var-mb1": Variant("var-mb1", True, False, False, 1),
        "var-mb1-compile": Variant("var-mb1-compile", True, False, False, 1, compile=True),
        "var-pack-flex": Variant("var-pack-flex", True, True, False, micro, attention="flex"),
        "var-pack-flex-compile": Variant(
            "var-pack-flex-compile", True, True, False, micro, compile=True, padding="bucket", attention="flex"
        ),
        "var-pack-flash": Variant("var-pack-flash", True, True, False, micro, attention="flash"),
        "var-pack-flash-compile": Variant(
            "var-pack-flash-compile", True, True, False, micro, compile=True, padding="bucket", attention="flash"
        ),
        "var-pack-varlen": Variant("var-pack-varlen", True, True, False, micro, attention="varlen"),
        "var-pack-varlen-compile": Variant(
            "var-pack-varlen-compile", True, True, False, micro, compile=True, padding="bucket", attention="varlen"
        ),
        **{
            name: Variant(
                name,
                True,
                True,
                False,
                micro,
                compile=True,
                padding="bucket",
                attention=attention,
                fill_rows=True,
                flex_autotune=tuned,
                eager_loss=eager_loss,
            )
            for name, attention, tuned, eager_loss in filled_rows
        },
        "var-longest": Variant("var-longest", True, False, False, micro, padding="longest"),
        "var-bucket": Variant("var-bucket", True, False, False, micro, padding="bucket"),
        "var-longest-compile": Variant(
            "var-longest-compile", True, False, False, micro, compile=True, padding="longest"
        ),
        "var-bucket-compile": Variant("var-bucket-compile", True, False, False, micro, compile=True, padding="bucket"),
    }


def model_flops_per_token(cfg: dict, mean_ctx: float) -> float:
    """Model FLOPs per trained token: 3 x forward (backward = 2 x forward). Forward = 2 x every matmul's
    parameters (LM head included) + per full-attention layer 2 x 2 x (heads x head_dim) x mean context + per
    linear-attention layer (Qwen3.5's gated delta-net) the depthwise conv, 2 x taps x conv channels, and the
    gated delta rule's recurrence, 2 x 3 x key_dim x value_dim per value head (the state's prediction S k,
    its rank-1 update and the read-out S q); the chunked kernel's extra intra-chunk work is not counted, as
    recomputation is not (MFU, not hardware FLOPs utilisation). Formula in docs/performance.md."""
    h, inter, layers = cfg["hidden_size"], cfg["intermediate_size"], cfg["num_hidden_layers"]
    q = cfg["num_attention_heads"] * cfg["head_dim"]
    kv = cfg["num_key_value_heads"] * cfg["head_dim"]
    mlp = 3 * h * inter
    if cfg.get("model_type") != "qwen3_5":
        per_layer = h * q + 2 * h * kv + q * h + mlp
        matmul_params = layers * per_layer + h * cfg["vocab_size"]
        return 3 * (2 * matmul_params + 4 * layers * q * mean_ctx)
    interval = cfg.get("full_attention_interval", 4)
    full_layers = layers // interval
    linear_layers = layers - full_layers
    full = h * 2 * q + 2 * h * kv + q * h + mlp  # q_proj carries the output gate: 2 x heads x head_dim
    v_heads, dk, dv = cfg["linear_num_value_heads"], cfg["linear_key_head_dim"], cfg["linear_value_head_dim"]
    key_dim, value_dim = cfg["linear_num_key_heads"] * dk, v_heads * dv
    conv = 2 * key_dim + value_dim
    linear = h * conv + h * value_dim + 2 * h * v_heads + value_dim * h + mlp  # in_proj_qkv, _z, _b, _a; out_proj
    matmul_params = full_layers * full + linear_layers * linear + h * cfg["vocab_size"]
    forward = 2 * matmul_params + 4 * full_layers * q * mean_ctx
    forward += linear_layers * (2 * cfg["linear_conv_kernel_dim"] * conv + 6 * v_heads * dk * dv)
    return 3 * forward


def make_examples(n: int, seq: int, variable: bool, vocab: int, seed: int) -> list[Example]:
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        length = rng.randint(max(2, seq // 8), seq) if variable else seq
        ids = tuple(rng.randrange(vocab) for _ in range(length))
        labels = (IGNORE_INDEX,) + ids[1:]
        out.append(Example(ids, labels))
    return out


def mean_context(examples: list[Example]) -> float:
    """Mean attended context per token under causal attention: (L + 1) / 2 per sequence, token-weighted."""
    tokens = sum(len(e) for e in examples)
    return sum(len(e) * (len(e) + 1) / 2 for e in examples) / tokens


def collated_rows(micro: list[Example], cfg: RSFTConfig) -> list[list[int]]:
    """The input rows the trainer forwards for ``micro`` (``whale.rsft.trainer.collate_tensors``'s shapes)."""
    flex = cfg.pack_sequences and cfg.attention_kernel == "flex"
    return collate_micro(
        micro,
        0,
        padding=cfg.micro_padding,
        pack=cfg.pack_sequences,
        max_len=cfg.max_seq_len,
        per_octave=cfg.buckets_per_octave,
        multiple_of=FLEX_BLOCK if flex else 1,
        row_tokens=cfg.row_tokens,
    )["input_ids"]


def forwarded_tokens(examples: list[Example], cfg: RSFTConfig) -> int:
    """Token positions the model runs on for one minibatch (real tokens + padding), as the trainer
    collates them."""
    return sum(
        len(row)
        for micro in micro_batches(examples, cfg.micro_batch_size_per_gpu, row_tokens=cfg.row_tokens)
        for row in collated_rows(micro, cfg)
    )


def shape_warmup(cfg: RSFTConfig, batches: list[list[Example]], vocab: int) -> list[list[Example]]:
    """One micro-batch (trained as its own minibatch) per (rows, width) the given minibatches collate
    to, so compiling happens before the clock starts (a run pays it once per shape and phase)."""
    if not (cfg.compile_layers and cfg.micro_padding == "bucket"):
        return []
    shapes = sorted(
        {
            (len(rows), len(rows[0]))
            for b in batches
            for micro in micro_batches(b, cfg.micro_batch_size_per_gpu, row_tokens=cfg.row_tokens)
            for rows in [collated_rows(micro, cfg)]
        }
    )
    rng = random.Random(-1)
    out = []
    for rows, width in shapes:
        ids = tuple(rng.randrange(vocab) for _ in range(width))
        # a packed row of this width: one sequence of it (every packed width is a rung of the ladder)
        out.append([Example(ids, (IGNORE_INDEX,) + ids[1:])] * (1 if cfg.pack_sequences else rows))
    return out


def compiled_graphs() -> int:
    try:
        from torch._dynamo.utils import counters
    except ImportError:
        return 0
    return int(counters["stats"]["unique_graphs"])


def run_variant(args: argparse.Namespace, v: Variant, device: torch.device) -> dict:
    if v.eager_loss:  # the trainer's own eager loss function stands in for its compiled one
        from unittest import mock

        from whale.rsft import trainer as trainer_module

        eager = trainer_module.head_cross_entropy
        with mock.patch.object(trainer_module, "compiled_head_cross_entropy", lambda: eager):
            return _run_variant(args, v, device)
    if not v.flex_autotune:
        return _run_variant(args, v, device)
    import torch._inductor.config as inductor_config

    torch._dynamo.reset()  # graphs of an earlier variant were compiled without autotuning
    with inductor_config.patch(max_autotune=True, max_autotune_gemm_backends="ATEN"):
        result = _run_variant(args, v, device)
    torch._dynamo.reset()
    return result


def _run_variant(args: argparse.Namespace, v: Variant, device: torch.device) -> dict:
    mcfg = MODELS[args.model]
    model = build_random_model(args.model, device, v.attn or args.attn)
    cfg = RSFTConfig(
        mini_batch_size=args.minibatch,
        micro_batch_size_per_gpu=v.micro,
        learning_rate=1e-6,
        precision=args.precision,
        gradient_checkpointing=v.grad_ckpt,
        pack_sequences=v.pack,
        compile_layers=v.compile,
        padding=v.padding,
        buckets_per_octave=args.buckets_per_octave,
        attention=v.attention if v.pack else "auto",
        pack_tokens=args.seq * v.micro if v.fill_rows else None,
    )
    if args.deepspeed:
        from whale.rsft.deepspeed_trainer import DeepSpeedTrainer

        trainer: SFTTrainer | DeepSpeedTrainer = DeepSpeedTrainer(
            model,
            cfg,
            device=device,
            pad_id=0,
            config_path=args.deepspeed,
            world_size=torch.distributed.get_world_size(),
        )
    else:
        trainer = SFTTrainer(model, cfg, device=device, pad_id=0)
    batches = [
        make_examples(args.minibatch, args.seq, v.variable, mcfg["vocab_size"], seed=i)
        for i in range(args.warmup + args.updates)
    ]
    graphs_before = compiled_graphs()
    warm_start = time.perf_counter()
    for shapes in shape_warmup(cfg, batches, mcfg["vocab_size"]):
        trainer.train(shapes, lr=0.0, seed="shapes")
    for i in range(args.warmup):
        trainer.train(batches[i], lr=1e-6, seed=i)
    warmup_s = time.perf_counter() - warm_start
    graphs_warm = compiled_graphs()
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    rates, mfus, losses = [], [], []
    for i in range(args.warmup, args.warmup + args.updates):
        examples = batches[i]
        stats = trainer.train(examples, lr=1e-6, seed=i)
        tokens = sum(len(e) for e in examples)  # every token is forwarded; all but the first carry loss
        flops = model_flops_per_token(mcfg, mean_context(examples)) * tokens
        rates.append(tokens / stats.seconds)
        mfus.append(flops / stats.seconds / (args.peak_tflops * 1e12))
        losses.append(stats.loss)
    peak_mem = torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else 0.0
    timed = batches[args.warmup :]
    real = sum(len(e) for b in timed for e in b)
    result = {
        "variant": v.name + ("+deepspeed" if args.deepspeed else ""),
        "padding": "packed" if v.pack else cfg.micro_padding,
        "micro_batch": v.micro,
        "grad_ckpt": v.grad_ckpt,
        "packed": v.pack,
        "compiled": v.compile,
        "attn": v.attn or args.attn,
        "attention": cfg.attention_kernel if v.pack else "sdpa",
        "pack_tokens": cfg.row_tokens,
        # micro-batches (rows) forwarded per optimiser update, mean over the timed updates
        "micro_batches_per_update": statistics.fmean(
            len(micro_batches(b, cfg.micro_batch_size_per_gpu, row_tokens=cfg.row_tokens)) for b in timed
        ),
        "variable_lengths": v.variable,
        "tokens_per_s": statistics.median(rates),
        "mfu": statistics.median(mfus),
        "mfu_all": mfus,
        "peak_mem_gib": peak_mem,
        "loss": losses[-1],
        # real tokens / positions forwarded in the timed updates (1.0: no padding)
        "token_efficiency": real / sum(forwarded_tokens(b, cfg) for b in timed),
        "warmup_s": warmup_s,
        # dynamo graphs compiled in warm-up, and during the timed updates (should be 0)
        "graphs_warmup": graphs_warm - graphs_before,
        "graphs_timed": compiled_graphs() - graphs_warm,
    }
    if args.save_check and v.name == "fixed":
        result["save_pretrained_s"] = time_save(model)
    del trainer, model
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return result


def time_save(model: PreTrainedModel) -> float:
    """Seconds to write the model as safetensors (what a reload-style weight sync writes per step)."""
    with tempfile.TemporaryDirectory() as tmp:
        start = time.perf_counter()
        model.save_pretrained(Path(tmp), safe_serialization=True)
        return time.perf_counter() - start


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=sorted(MODELS), default="qwen3-1.7b")
    parser.add_argument("--seq", type=int, default=4096)
    parser.add_argument("--minibatch", type=int, default=16, help="sequences per optimiser update")
    parser.add_argument("--micro", type=int, default=2, help="micro-batch without gradient checkpointing")
    parser.add_argument("--micro-gc", type=int, default=8, help="micro-batch with gradient checkpointing")
    parser.add_argument("--updates", type=int, default=3, help="timed optimiser updates per variant")
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--variants", default="fixed,fixed-gc,var-pad,var-pack")
    parser.add_argument("--precision", default="auto", choices=["auto", "bf16", "fp32"])
    parser.add_argument("--attn", default="sdpa")
    parser.add_argument("--peak-tflops", type=float, default=790.0)
    parser.add_argument("--save-check", action="store_true", help="also time save_pretrained (weight sync cost)")
    parser.add_argument(
        "--buckets-per-octave", type=int, default=RSFTConfig.buckets_per_octave, help="bucket ladder rungs per doubling"
    )
    parser.add_argument("--json", "--out", dest="out", type=Path, help="write meta + results here")
    parser.add_argument(
        "--deepspeed",
        type=Path,
        help="train through the DeepSpeed engine with this ZeRO config "
        "(e.g. images/worker/ds_zero2.json); one process, or under torchrun",
    )
    args = parser.parse_args(argv)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if args.deepspeed:  # the engine needs a process group, even of one
        from whale.rsft.dist import init_process_group, world_from_env

        for key, value in {
            "RANK": "0",
            "WORLD_SIZE": "1",
            "LOCAL_RANK": "0",
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": "29533",
        }.items():
            os.environ.setdefault(key, value)
        init_process_group(world_from_env(), device)
    table = variants(args.micro, args.micro_gc)
    names = [name.strip() for name in args.variants.split(",")]
    unknown = [name for name in names if name not in table]
    if unknown:
        parser.error(f"--variants: unknown {unknown}; known: {', '.join(sorted(table))}")
    meta = {
        "model": args.model,
        "seq": args.seq,
        "minibatch": args.minibatch,
        "device": str(device),
        "gpu": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "torch": torch.__version__,
        "attn": args.attn,
        "precision": args.precision,
        "peak_tflops": args.peak_tflops,
        "buckets_per_octave": args.buckets_per_octave,
        "updates": args.updates,
        "warmup": args.warmup,
    }
    results = []
    for name in names:
        res = run_variant(args, table[name], device)
        results.append(res)
        print(json.dumps(res), flush=True)
        if args.out:  # after every variant: a run cut short by a time limit keeps what it measured
            args.out.write_text(json.dumps({"meta": meta, "results": results}, indent=2))
    width = max([30, *(len(r["variant"]) for r in results)])
    print(
        f"\n{'variant':<{width}} {'micro':>5} {'gc':>3} {'tokens/s':>10} {'MFU':>6} {'mem GiB':>8} {'real/fwd':>8} "
        f"{'graphs':>7} {'warm s':>7} {'loss':>10}"
    )
    for r in results:
        print(
            f"{r['variant']:<{width}} {r['micro_batch']:>5} {('y' if r['grad_ckpt'] else 'n'):>3} "
            f"{r['tokens_per_s']:>10.0f} {100 * r['mfu']:>5.1f}% {r['peak_mem_gib']:>8.1f} "
            f"{r['token_efficiency']:>8.2f} {r['graphs_warmup']:>3}+{r['graphs_timed']:<3} {r['warmup_s']:>7.0f} "
            f"{r['loss']:>10.5f}"
        )
    print(json.dumps(meta))


if __name__ == "__main__":
    main()
