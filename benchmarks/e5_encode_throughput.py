"""Passage encoding throughput of the dense retriever's encoder (``whale.tools.retrieval_index.Encoder``) at
e5-base-v2's size, to size the ``--source build`` preparation of wiki-18 (21,015,324 passages).

e5-base-v2's weights cannot be downloaded here, so the model is a randomly initialised BERT-base
(768 hidden, 12 layers, 12 heads, e5-base-v2's config) with a WordPiece tokenizer trained in-process;
the speed of a forward pass does not depend on the weights. Passages are synthetic ~100-word texts
(wiki-18's DPR passages are 100 words), encoded with the e5 conventions ("passage: " prefix, 256-token
truncation, mean pooling, normalisation). It also checks that fp16 on the GPU gives the same vectors
as fp32 on the CPU (a tiny model, cosine similarity).

    python benchmarks/e5_encode_throughput.py --device cuda --fp16 --batch-size 512 --passages 50000 --json out.json
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np
import torch

from whale.tools.retrieval_index import PRESETS, Encoder

WIKI18_ROWS = 21_015_324


def tokenizer(texts: list[str]):
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.train_from_iterator(
        texts,
        trainers.WordPieceTrainer(vocab_size=30522, special_tokens=["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]),
    )
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]",
        special_tokens=[("[CLS]", tok.token_to_id("[CLS]")), ("[SEP]", tok.token_to_id("[SEP]"))],
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        unk_token="[UNK]",
        pad_token="[PAD]",
        cls_token="[CLS]",
        sep_token="[SEP]",
        mask_token="[MASK]",
        model_max_length=512,
    )


def passages(n: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    syll = ["ka", "lo", "mi", "ter", "an", "sol", "ve", "ri", "don", "el", "us", "pa", "gra", "ni", "tho"]
    words = ["".join(rng.choice(syll) for _ in range(rng.randint(1, 4))) for _ in range(20000)]
    return [f'"{" ".join(rng.choices(words, k=3))}"\n' + " ".join(rng.choices(words, k=118)) for _ in range(n)]


def bert(vocab: int, **cfg) -> torch.nn.Module:
    from transformers import BertConfig, BertModel

    torch.manual_seed(0)
    return BertModel(BertConfig(vocab_size=vocab, **cfg))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--fp16", action="store_true")
    p.add_argument("--batch-size", type=int, default=512)
    p.add_argument("--passages", type=int, default=50_000)
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args()
    texts = passages(args.passages)
    tok = tokenizer(texts[:5000])
    out: dict = {"device": args.device, "fp16": args.fp16, "batch_size": args.batch_size, "passages": len(texts)}
    if args.device != "cpu":
        out["gpu"] = torch.cuda.get_device_name(0)

    # 1) the same vectors on the accelerator in fp16 as on the CPU in fp32 (a small model)
    small = dict(
        hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128, max_position_embeddings=512
    )
    cpu = Encoder(bert(len(tok), **small), tok, PRESETS["e5"], batch_size=64)
    dev_model = bert(len(tok), **small).to(args.device)
    if args.fp16:
        dev_model = dev_model.half()
    dev = Encoder(dev_model, tok, PRESETS["e5"], batch_size=64)
    a, b = cpu.encode(texts[:256], "passage"), dev.encode(texts[:256], "passage")
    out["fp16_vs_fp32_min_cosine"] = float(np.min(np.sum(a * b, axis=1)))

    # 2) throughput at e5-base-v2's size
    model = bert(
        len(tok),
        hidden_size=768,
        num_hidden_layers=12,
        num_attention_heads=12,
        intermediate_size=3072,
        max_position_embeddings=512,
    ).to(args.device)
    if args.fp16:
        model = model.half()
    enc = Encoder(model, tok, PRESETS["e5"], batch_size=args.batch_size)
    lengths = [
        len(ids) for ids in tok(["passage: " + t for t in texts[:1000]], truncation=True, max_length=256)["input_ids"]
    ]
    out["mean_tokens"] = float(np.mean(lengths))
    enc.encode(texts[: args.batch_size * 2], "passage")  # warm-up
    if args.device != "cpu":
        torch.cuda.synchronize()
    start = time.perf_counter()
    vecs = enc.encode(texts, "passage")
    if args.device != "cpu":
        torch.cuda.synchronize()
    wall = time.perf_counter() - start
    out["shape"] = list(vecs.shape)
    out["passages_per_s"] = len(texts) / wall
    out["wiki18_hours_estimate"] = WIKI18_ROWS / out["passages_per_s"] / 3600
    print(json.dumps(out, indent=1))
    if args.json:
        args.json.write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
