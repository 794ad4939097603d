"""Supervised warm-up of an example model: how a domain's tiny example model is taught its answer format before
any run (``python -m synthetic.tiny_model``), with the RSFT trainer.

An engine, not part of the plugin API (``whale.domain`` sits below the engines: the layers in pyproject.toml);
the tool that builds an example model imports it by name.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any


def sft_warmup(
    model: Any,
    tokenizer: Any,
    conversations: Iterable[Sequence[dict[str, Any]]],
    *,
    learning_rate: float,
    seed: int = 0,
    batch_size: int = 32,
) -> None:
    """Supervised fine-tuning of ``model`` on fixed chat conversations, on the CPU in fp32, with the RSFT
    trainer (one optimizer update per ``batch_size`` conversations): how a domain's example model is
    taught its answer format before any run (``synthetic.tiny_model``)."""
    import torch

    from whale.rsft.collate import encode_trajectories
    from whale.rsft.config import RSFTConfig
    from whale.rsft.rejection import Trajectory
    from whale.rsft.trainer import SFTTrainer

    cfg = (
        RSFTConfig(  # no weight decay: the warm-up teaches a format, it is not a run (and its models stay as they were)
            mini_batch_size=batch_size,
            micro_batch_size_per_gpu=batch_size,
            learning_rate=learning_rate,
            precision="fp32",
            weight_decay=0.0,
        )
    )
    trainer = SFTTrainer(model, cfg, device=torch.device("cpu"), pad_id=tokenizer.pad_token_id)
    # one call: the warm-up repeats a few conversations thousands of times, each rendered and tokenised once
    examples = encode_trajectories(
        tokenizer, (Trajectory(prompt_index=0, messages=tuple(conv), reward=1.0) for conv in conversations)
    )
    trainer.train(examples, lr=learning_rate, seed=seed)
