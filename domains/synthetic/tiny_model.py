"""A tiny chat model for the synthetic domain, built offline in seconds (``python -m synthetic.tiny_model DIR``).

A byte-level BPE tokenizer trained on the domain's own texts, a ChatML chat template, and a
two-layer Qwen3-architecture model given a short supervised warm-up (100 updates) under h0's own system prompt
(the one every run starts from: a model this small answers a prompt it was not taught on far worse, and under h0's
longer prompt 50 updates left it at chance): enough to answer
``<answer>D</answer>`` reliably, too little to copy the asked digit D most of the time (it does in
roughly a fifth of sampled replies). So it starts well below perfect and everything above that
start must come from RSFT. Deterministic for a given seed. The result is a normal HF checkpoint folder (safetensors + config + tokenizer) that
``spec.experiment.model.name`` can point at.
"""

from __future__ import annotations

import argparse
import ast
import random
from pathlib import Path

CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + (message['content'] or '') + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
H0_PATH = Path(__file__).resolve().parent / "h0.py"


def h0_system_prompt() -> str:
    """h0's ``SYSTEM_PROMPT``, read from its source (a harness file is data to the domain, never imported):
    the prompt the warm-up teaches under, so the demo's first evaluation asks what the model was taught."""
    for node in ast.walk(ast.parse(H0_PATH.read_text())):
        if isinstance(node, ast.Assign) and [getattr(t, "id", None) for t in node.targets] == ["SYSTEM_PROMPT"]:
            value = ast.literal_eval(node.value)
            if isinstance(value, str):
                return value
    raise ValueError(f"{H0_PATH} has no SYSTEM_PROMPT string")


def build_tokenizer(vocab_size: int = 320):
    """Byte-level BPE over the domain's texts (any string still tokenises: bytes are the fallback)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    from synthetic import tasks

    corpus = []
    prompt = h0_system_prompt()
    for d in range(10):
        item = {"digit": d, "answer": str(d)}
        corpus += [prompt, tasks.user_prompt(item), f"<answer>{d}</answer>", "system\nuser\nassistant\n"]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False)]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus * 20, trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>", bos_token=None
    )
    fast.chat_template = CHAT_TEMPLATE
    return fast


def build_model(vocab_size: int, seed: int):
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(seed)
    config = Qwen3Config(
        vocab_size=vocab_size,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=256,
        tie_word_embeddings=True,
    )
    return Qwen3ForCausalLM(config)


def format_conversations(n: int, seed: int, copy_prob: float = 0.0) -> list[list[dict[str, str]]]:
    """Conversations in the answer format whose digit is the asked one with probability
    ``copy_prob`` and a random one otherwise: the format, and a weak prior for the task."""
    from synthetic import tasks

    rng = random.Random(f"whale-synthetic-format:{seed}")
    prompt = h0_system_prompt()
    out = []
    for _ in range(n):
        item = {"digit": rng.randrange(10)}
        answer = item["digit"] if rng.random() < copy_prob else rng.randrange(10)
        out.append(
            [
                {"role": "system", "content": prompt},
                {"role": "user", "content": tasks.user_prompt(item)},
                {"role": "assistant", "content": f"<answer>{answer}</answer>"},
            ]
        )
    return out


def build(
    out_dir: Path,
    *,
    seed: int = 0,
    format_updates: int = 100,
    copy_prob: float = 1.0,
    conversations: list[list[dict[str, str]]] | None = None,
) -> Path:
    """Tokenizer + tiny model taught the answer format (and, with ``copy_prob``, a weak prior for the
    task: it starts near ``copy_prob + (1 - copy_prob) / 10`` reward); saved as an HF checkpoint.
    ``conversations``: warm-up data other than :func:`format_conversations`' (a benchmark's long replies)."""
    from whale.rsft.warmup import sft_warmup  # builds a model offline: an engine, not the plugin API

    tokenizer = build_tokenizer()
    model = build_model(len(tokenizer), seed)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    sft_warmup(
        model,
        tokenizer,
        format_conversations(32 * format_updates, seed, copy_prob) if conversations is None else conversations,
        learning_rate=3e-3,
        seed=seed,
        batch_size=32,
    )
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    return out_dir


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--copy-prob", type=float, default=1.0, help="share of correct answers in the warm-up data (0: format only)"
    )
    args = parser.parse_args(argv)
    print(build(args.out_dir, seed=args.seed, copy_prob=args.copy_prob))


if __name__ == "__main__":
    main()
