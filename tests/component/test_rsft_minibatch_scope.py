"""rsft.miniBatchScope on real data-parallel ranks (gloo on the CPU, a tiny real model): the trainer
makes exactly the optimiser steps ``optimizer_updates`` documents, counted on ``optimizer.step``, and
per rank on two ranks updates the weights as one process does with twice the (global) minibatch."""

from __future__ import annotations

import os
import socket
from typing import Literal

import pytest

torch = pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402

from tests.fixtures.tolerance import assert_adam_trained_close  # noqa: E402
from whale.core.batching import optimizer_updates  # noqa: E402
from whale.rsft.collate import encode_trajectory  # noqa: E402
from whale.rsft.config import RSFTConfig  # noqa: E402
from whale.rsft.rejection import Trajectory  # noqa: E402
from whale.rsft.trainer import SFTTrainer  # noqa: E402

SEQUENCES = 10
MINI = 2
EPOCHS = 2
LR = 1e-3
#: (scope, miniBatchSize) each rank trains with; one process also trains global with 2 x MINI
RUNS: list[tuple[Literal["perRank", "global"], int]] = [("perRank", MINI), ("global", MINI), ("global", 2 * MINI)]


def _examples(tok):
    out = []
    for i in range(SEQUENCES):
        msgs = (
            {"role": "user", "content": f"Repeat the digit {i % 10}." + " x" * (i % 3)},
            {"role": "assistant", "content": f"<answer>{i % 10}</answer>" + " more" * (i % 4)},
        )
        out += encode_trajectory(tok, Trajectory(i, msgs, 1.0))
    assert len(out) == SEQUENCES
    return out


def _train(rank: int, world: int, port: int, out_dir: str) -> None:
    from synthetic.tiny_model import build_model, build_tokenizer

    if world > 1:
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        tok = build_tokenizer()
        out = {}
        for scope, mini in RUNS:
            model = build_model(len(tok), seed=0)
            cfg = RSFTConfig(
                mini_batch_size=mini,
                micro_batch_size_per_gpu=1,
                sft_epochs=EPOCHS,
                precision="fp32",
                mini_batch_scope=scope,
            )
            trainer = SFTTrainer(model, cfg, device=torch.device("cpu"), pad_id=tok.pad_token_id)
            steps: list[int] = []
            real_step = trainer.optimizer.step

            def counting_step(*args, _steps=steps, _real=real_step, **kwargs):
                _steps.append(1)
                return _real(*args, **kwargs)

            trainer.optimizer.step = counting_step
            stats = trainer.train(_examples(tok), lr=LR, seed=0)
            out[(scope, mini)] = {
                "steps": len(steps),
                "updates": stats.updates,
                "tokens": stats.tokens,
                "weights": {k: v.detach().clone() for k, v in model.state_dict().items()},
            }
        torch.save(out, f"{out_dir}/rank{rank}-of{world}.pt")
    finally:
        if world > 1:
            dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.timeout(240)
def test_per_rank_and_global_minibatches_make_the_documented_optimizer_steps(tmp_path):
    _train(0, 1, 0, str(tmp_path))
    mp.spawn(_train, args=(2, _free_port(), str(tmp_path)), nprocs=2, join=True)
    one = torch.load(tmp_path / "rank0-of1.pt")
    two = [torch.load(tmp_path / f"rank{r}-of2.pt") for r in (0, 1)]

    def documented(scope, mini, ranks):
        return optimizer_updates(SEQUENCES, ranks=ranks, mini_batch_size=mini, sft_epochs=EPOCHS, scope=scope)

    # one process: the scopes agree (2 epochs x 5 updates)
    assert one[("perRank", MINI)]["steps"] == one[("global", MINI)]["steps"] == documented("global", MINI, 1) == 10
    for rank in two:  # two ranks: every rank steps the optimiser together, as often as documented
        assert (
            rank[("perRank", MINI)]["steps"]
            == rank[("perRank", MINI)]["updates"]
            == documented("perRank", MINI, 2)
            == 6
        )
        assert rank[("global", MINI)]["steps"] == documented("global", MINI, 2) == 10
        assert rank[("perRank", MINI)]["tokens"] == one[("perRank", MINI)]["tokens"] > 0
    # the weights agree across ranks, and per rank on 2 ranks = one process with a global minibatch of 2 x MINI
    per_rank = two[0][("perRank", MINI)]["weights"]
    twin = one[("global", 2 * MINI)]["weights"]
    start = {k: v for k, v in _fresh_weights().items()}
    assert max(float((twin[k] - start[k]).abs().max()) for k in twin) > 1e-4, "training did not move the weights"
    updates = one[("global", 2 * MINI)]["updates"]
    assert updates == two[0][("perRank", MINI)]["updates"]
    for name, value in per_rank.items():
        # every rank applies the same all-reduced gradient: the same bits
        torch.testing.assert_close(two[1][("perRank", MINI)]["weights"][name], value, rtol=0, atol=0)
        assert_adam_trained_close(value, twin[name], lr=LR, updates=updates, msg=name)


def _fresh_weights():
    from synthetic.tiny_model import build_model, build_tokenizer

    return build_model(len(build_tokenizer()), seed=0).state_dict()
