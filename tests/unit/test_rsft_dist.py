"""Pure parts of the multi-rank weight phase: the torchrun environment, the DeepSpeed config the
engine gets, the tensor/skeleton split of broadcast_tree, and the operator command torchrun parses."""

from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")

from whale.rsft import dist  # noqa: E402
from whale.rsft.config import RSFTConfig  # noqa: E402
from whale.rsft.deepspeed_trainer import DeepSpeedConfigError, engine_config, read_config, zero_stage  # noqa: E402


def test_world_from_torchrun_env():
    world = dist.world_from_env({"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1"})
    assert (world.rank, world.size, world.local_rank, world.is_leader, world.distributed) == (3, 4, 1, False, True)
    assert dist.world_from_env({}) == dist.World(0, 1, 0)
    assert not dist.world_from_env({"WORLD_SIZE": "1"}).distributed


@pytest.mark.parametrize("env", [{"RANK": "2", "WORLD_SIZE": "2"}, {"RANK": "x", "WORLD_SIZE": "2"}])
def test_bad_torchrun_env_names_the_variables(env):
    with pytest.raises(ValueError, match="RANK"):
        dist.world_from_env(env)


def test_tree_split_and_refill_keeps_structure_and_tensors():
    state = {
        "state": {0: {"exp_avg": torch.ones(2, 3), "step": torch.tensor(4.0)}},
        "param_groups": [{"lr": 1e-3, "params": [0]}],
        "blob": b"x",
    }
    tensors: list[torch.Tensor] = []
    skeleton = dist._strip(state, tensors)
    assert len(tensors) == 2 and not isinstance(skeleton["state"][0]["exp_avg"], torch.Tensor)
    refs: list = []
    dist._strip_refs(skeleton, refs)
    assert [r.shape for r in refs] == [(2, 3), ()]
    back = dist._fill(skeleton, tensors)
    assert back["param_groups"] == state["param_groups"] and back["blob"] == b"x"
    assert back["state"][0]["exp_avg"] is tensors[0]


def test_engine_config_takes_batches_clipping_and_precision_from_the_spec(tmp_path):
    path = tmp_path / "ds.json"
    path.write_text(
        json.dumps(
            {
                "train_micro_batch_size_per_gpu": 99,
                "gradient_accumulation_steps": 7,
                "optimizer": {"type": "Adam"},
                "zero_optimization": {"stage": 3},
                "bf16": {"enabled": False},
            }
        )
    )
    raw = read_config(path)
    cfg = RSFTConfig(mini_batch_size=64, micro_batch_size_per_gpu=2, max_grad_norm=0.5, mini_batch_scope="global")
    out = engine_config(raw, cfg, world_size=8, bf16=True)
    assert out["train_micro_batch_size_per_gpu"] == 2
    assert out["gradient_accumulation_steps"] == 4  # 64 / (2 x 8)
    assert out["train_batch_size"] == 64
    assert out["gradient_clipping"] == 0.5 and out["bf16"]["enabled"] is True
    assert "optimizer" not in out and zero_stage(out) == 3
    # per rank (the paper's): 64 sequences on each of the 8 ranks per update
    per_rank = engine_config(raw, RSFTConfig(mini_batch_size=64, micro_batch_size_per_gpu=2), 8, True)
    assert (per_rank["gradient_accumulation_steps"], per_rank["train_batch_size"]) == (32, 512)
    # a minibatch that does not divide: accumulation rounds up, never below one
    assert (
        engine_config(
            raw, RSFTConfig(mini_batch_size=5, micro_batch_size_per_gpu=2, mini_batch_scope="global"), 4, False
        )["gradient_accumulation_steps"]
        == 1
    )


def test_shipped_deepspeed_configs_are_zero2_and_zero3():
    assert zero_stage(read_config("images/worker/ds_zero2.json")) == 2
    assert zero_stage(read_config("images/worker/ds_zero3.json")) == 3


def test_missing_deepspeed_config_names_the_spec_field(tmp_path):
    with pytest.raises(DeepSpeedConfigError, match="spec.execution.train.deepspeedConfig"):
        read_config(tmp_path / "nope.json")


def test_torchrun_passes_the_workload_args_through_after_double_dash():
    """torchrun's argparse takes ``--run`` for its own ``--run-path`` unless ``--`` comes first."""
    from torch.distributed.run import parse_args

    tail = ["train", "--store", "s3://b/p", "--run", "r1", "--phase", "c01-weight"]
    args = parse_args(["--nnodes=2", "--nproc-per-node=8", "-m", "--", "whale.workloads", *tail])
    assert args.module and args.training_script == "whale.workloads" and args.training_script_args == tail
    with pytest.raises(SystemExit):
        parse_args(["--nnodes=2", "--nproc-per-node=8", "-m", "whale.workloads", *tail])
