"""Data-parallel SFT (torchrun-style, gloo on the CPU): two ranks each take every second sequence,
the token count is all-reduced, and the summed gradients equal the single-process token mean."""

from __future__ import annotations

import os
import socket

import pytest

torch = pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402

from tests.fixtures.tolerance import assert_reordered_close, reorder_tol  # noqa: E402
from whale.rsft.collate import encode_trajectory  # noqa: E402
from whale.rsft.config import RSFTConfig  # noqa: E402
from whale.rsft.rejection import Trajectory  # noqa: E402

#: the synthetic tiny model's hidden size (synthetic.tiny_model.build_model)
HIDDEN = 128
from whale.rsft.trainer import SFTTrainer  # noqa: E402


def _examples(tok):
    out = []
    for i in range(5):  # odd count: the ranks get different numbers of sequences and tokens
        msgs = (
            {"role": "user", "content": f"Repeat the digit {i}." + " x" * i},
            {"role": "assistant", "content": f"<answer>{i}</answer>" + " more" * (2 * i)},
        )
        out += encode_trajectory(tok, Trajectory(i, msgs, 1.0))
    return out


def _grads_after_one_update(rank: int, world: int, port: int, out_dir: str) -> None:
    from synthetic.tiny_model import build_model, build_tokenizer

    if world > 1:
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        tok = build_tokenizer()
        model = build_model(len(tok), seed=0)
        cfg = RSFTConfig(mini_batch_size=8, micro_batch_size_per_gpu=2, precision="fp32", max_grad_norm=0.0)
        trainer = SFTTrainer(model, cfg, device=torch.device("cpu"), pad_id=tok.pad_token_id)
        captured = []
        trainer.optimizer.step = lambda *a, **k: captured.append([p.grad.clone() for p in model.parameters()])
        stats = trainer.train(_examples(tok), lr=1e-3, seed=0)
        torch.save(
            {"grads": captured[0], "loss": stats.loss, "tokens": stats.tokens}, f"{out_dir}/rank{rank}-of{world}.pt"
        )
    finally:
        if world > 1:
            dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.timeout(180)
def test_two_ranks_give_the_single_process_gradient(tmp_path):
    _grads_after_one_update(0, 1, 0, str(tmp_path))
    mp.spawn(_grads_after_one_update, args=(2, _free_port(), str(tmp_path)), nprocs=2, join=True)
    single = torch.load(tmp_path / "rank0-of1.pt")
    for rank in (0, 1):
        ddp = torch.load(tmp_path / f"rank{rank}-of2.pt")
        assert ddp["tokens"] == single["tokens"]
        # the same sums split over two ranks (tests.fixtures.tolerance): tokens x hidden features per weight
        terms = single["tokens"] * HIDDEN
        assert abs(ddp["loss"] - single["loss"]) <= reorder_tol(single["tokens"]) * abs(single["loss"])
        for a, b in zip(ddp["grads"], single["grads"], strict=True):
            assert_reordered_close(a, b, terms)
