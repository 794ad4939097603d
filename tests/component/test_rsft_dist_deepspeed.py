"""DeepSpeed (``spec.execution.train.deepspeedConfig``) on two gloo ranks on the CPU, against one plain process.

In CI (``make install`` installs the ``deepspeed`` extra): DeepSpeed compiles its shared-memory comm op on
first use (over a minute on two cores), and each rank initialises an engine, so these are ``slow``.

* ZeRO-2 through the workload: two phases (the second starts from the first's checkpoint and
  carries its optimiser state, gathered from both ranks' ZeRO partitions) give the weights a
  single plain process gives on the same data.
* ZeRO-3 trainer: one SFT call on fixed sequences equals the single-process update, and the
  weights gathered to rank 0 for the HF checkpoint are the full ones.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from tests.component.rsft_support import RUN, tiny_model_dir, write_request
from tests.component.test_rsft_data_parallel import _examples
from tests.component.test_rsft_dist import (
    PHASE,
    _data_of,
    _free_port,
    _greedy_spec,
    _optimizer_updates,
    _rank_main,
    _single_process_twin,
)
from tests.fixtures.tolerance import assert_adam_trained_close, reorder_tol
from whale.core import layout
from whale.store import open_store

torch = pytest.importorskip("torch")
pytest.importorskip("deepspeed")
import torch.multiprocessing as mp  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory) -> Path:
    return tiny_model_dir(tmp_path_factory.getbasetemp())


def _weights(root: Path, step: int) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    folder = open_store(str(root)).local_path(layout.checkpoint_prefix(RUN, step))
    assert folder is not None
    return load_file(folder / "model.safetensors")


def _cpu_config(stage: int, tmp: Path) -> str:
    """The shipped config less overlap_comm: the CPU accelerator has no side stream to overlap on,
    and with it on, an update now and then differed from the plain one on the CPU."""
    ds_json = json.loads((REPO / f"images/worker/ds_zero{stage}.json").read_text())
    ds_json["zero_optimization"]["overlap_comm"] = False
    path = tmp / f"ds_zero{stage}_cpu.json"
    path.write_text(json.dumps(ds_json))
    return str(path)


def _two_phases(root: Path, wire: dict, run_phase) -> None:
    store = open_store(str(root))
    write_request(store, PHASE, wire, target=1)
    run_phase()
    second = "c02-weight"
    write_request(store, second, wire, target=2, from_step=1, from_checkpoint=layout.checkpoint_prefix(RUN, 1))
    run_phase(second)


def test_zero2_workload_with_carried_optimiser_matches_one_process(tmp_path, model_dir):
    from whale.workloads.train import run_train

    wire = _greedy_spec(model_dir)
    single, multi = tmp_path / "single", tmp_path / "multi"
    # one process makes the 2-rank per-rank updates with a global minibatch twice the size
    _two_phases(
        single, _single_process_twin(wire, ranks=2), lambda phase=PHASE: run_train(open_store(str(single)), RUN, phase)
    )

    ds_wire = {**wire, "train": {"deepspeedConfig": _cpu_config(2, tmp_path), "gpusPerNode": 2}}

    def spawn(phase=PHASE):
        mp.spawn(_rank_main_phase, args=(2, _free_port(), str(multi), str(tmp_path), phase), nprocs=2, join=True)

    _two_phases(multi, ds_wire, spawn)
    state = open_store(str(multi)).read_json(f"{layout.state_prefix(RUN, PHASE)}/latest.json")
    assert state["step"] == 1
    for phase in (PHASE, "c02-weight"):
        assert _data_of(multi, phase) == _data_of(single, phase), f"{phase}: the runs trained on different data"
    reference, got = _weights(single, 2), _weights(multi, 2)
    assert max(float((reference[k] - _weights(single, 1)[k]).abs().max()) for k in reference) > 1e-4
    updates = _optimizer_updates(single, PHASE, "c02-weight")
    assert updates == _optimizer_updates(multi, PHASE, "c02-weight") > 0
    for name, value in got.items():
        assert_adam_trained_close(
            value.float(), reference[name], lr=wire["rsft"]["learningRate"], updates=updates, msg=name
        )


def _rank_main_phase(rank: int, world: int, port: int, store_root: str, out_dir: str, phase: str) -> None:
    import tests.component.test_rsft_dist as base

    base.PHASE = phase
    _rank_main(rank, world, port, store_root, out_dir)


def _zero3_model(kind: str) -> tuple[Any, Any, Any]:
    """(tokenizer, model, config) of a ZeRO-3 test: the synthetic tiny model padded, or the tiny Qwen3.5
    hybrid packed (its linear-attention layers get the packed rows' boundaries under ZeRO-3's gathered
    parameters too)."""
    from synthetic.tiny_model import build_model, build_tokenizer
    from whale.rsft.config import RSFTConfig

    if kind == "qwen35":
        from tests.fixtures.models import build_tiny_qwen35, build_tiny_tokenizer

        tok = build_tiny_tokenizer()
        cfg = RSFTConfig(
            mini_batch_size=8, micro_batch_size_per_gpu=2, precision="fp32", max_grad_norm=0.0, pack_sequences=True
        )
        return tok, build_tiny_qwen35(len(tok), seed=0), cfg
    tok = build_tokenizer()
    cfg = RSFTConfig(mini_batch_size=8, micro_batch_size_per_gpu=2, precision="fp32", max_grad_norm=0.0)
    return tok, build_model(len(tok), seed=0), cfg


def _zero3_rank(rank: int, world: int, port: int, out_dir: str, kind: str = "synthetic") -> None:
    from whale.rsft.trainer import SFTTrainer

    tok, model, cfg = _zero3_model(kind)
    if world == 1:
        trainer = SFTTrainer(model, cfg, device=torch.device("cpu"), pad_id=tok.pad_token_id)
        stats = trainer.train(_examples(tok), lr=1e-3, seed=0)
        torch.save({"weights": model.state_dict(), "loss": stats.loss}, f"{out_dir}/single.pt")
        return
    os.environ.update(
        RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port)
    )
    torch.distributed.init_process_group("gloo", rank=rank, world_size=world)
    try:
        from whale.rsft.deepspeed_trainer import DeepSpeedTrainer

        ds_trainer = DeepSpeedTrainer(
            model,
            cfg,
            device=torch.device("cpu"),
            pad_id=tok.pad_token_id,
            config_path=Path(out_dir) / "ds_zero3_cpu.json",
            world_size=world,
        )
        stats = ds_trainer.train(_examples(tok), lr=1e-3, seed=0)
        weights = ds_trainer.gathered_state_dict()
        optimizer = ds_trainer.optimizer_state()
        if rank == 0:
            torch.save(
                {"weights": weights, "loss": stats.loss, "shards": len(optimizer["shards"])}, f"{out_dir}/zero3.pt"
            )
    finally:
        torch.distributed.destroy_process_group()


@pytest.mark.parametrize("kind", ["synthetic", "qwen35"])
def test_zero3_update_equals_one_process_and_gathers_full_weights(tmp_path, kind):
    """ZeRO-3 on two gloo ranks makes the one-process update; ``qwen35``: the tiny Qwen3.5 hybrid, packed."""
    _cpu_config(3, tmp_path)
    _zero3_rank(0, 1, 0, str(tmp_path), kind)
    mp.spawn(_zero3_rank, args=(2, _free_port(), str(tmp_path), kind), nprocs=2, join=True)
    single = torch.load(tmp_path / "single.pt")
    zero3 = torch.load(tmp_path / "zero3.pt")
    assert zero3["shards"] == 2
    terms = sum(len(e) for e in _examples(_zero3_model(kind)[0]))  # the token-mean loss sums every token
    assert zero3["loss"] == pytest.approx(single["loss"], rel=reorder_tol(terms))
    start = _zero3_model(kind)[1].state_dict()
    assert sorted(zero3["weights"]) == sorted(single["weights"])
    for name, value in single["weights"].items():
        got = zero3["weights"][name].float()
        assert got.shape == value.shape, f"{name}: not gathered in full"
        # AdamW's first update is about lr * sign(grad): where a gradient is ~0, rounding noise flips
        # the sign, so compare the update as a whole, not element by element.
        update = (value - start[name]).abs().mean()
        assert float((got - value).abs().mean()) <= 0.02 * float(update) + 1e-9, name


def _compiled_layers_rank(rank: int, port: int, out_dir: str) -> None:
    from synthetic.tiny_model import build_model, build_tokenizer
    from whale.rsft.config import RSFTConfig
    from whale.rsft.deepspeed_trainer import DeepSpeedTrainer

    os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.distributed.init_process_group("gloo", rank=0, world_size=1)
    try:
        tok = build_tokenizer()
        out = {}
        for stage, compile_layers in ((2, False), (2, True), (3, True)):
            cfg = RSFTConfig(
                mini_batch_size=8,
                micro_batch_size_per_gpu=2,
                precision="fp32",
                max_grad_norm=0.0,
                compile_layers=compile_layers,
            )
            model = build_model(len(tok), seed=0)
            trainer = DeepSpeedTrainer(
                model,
                cfg,
                device=torch.device("cpu"),
                pad_id=tok.pad_token_id,
                config_path=Path(out_dir) / f"ds_zero{stage}_cpu.json",
                world_size=1,
            )
            kinds = set(model._no_split_modules)
            layers = [m for m in model.modules() if type(m).__name__ in kinds]
            stats = trainer.train(_examples(tok), lr=1e-3, seed=0)
            out[(stage, compile_layers)] = {
                "layers": len(layers),
                "compiled": sum(m._compiled_call_impl is not None for m in layers),
                "loss": stats.loss,
                "weights": trainer.gathered_state_dict() or model.state_dict(),
            }
        torch.save(out, f"{out_dir}/compiled.pt")
    finally:
        torch.distributed.destroy_process_group()


def test_zero2_compiles_the_layers_to_the_same_update_and_zero3_leaves_them_eager(tmp_path):
    _cpu_config(2, tmp_path)
    _cpu_config(3, tmp_path)
    mp.spawn(_compiled_layers_rank, args=(_free_port(), str(tmp_path)), nprocs=1, join=True)
    out = torch.load(tmp_path / "compiled.pt")
    eager, compiled, zero3 = out[(2, False)], out[(2, True)], out[(3, True)]
    assert compiled["layers"] > 0 and compiled["compiled"] == compiled["layers"]
    assert eager["compiled"] == 0 and zero3["compiled"] == 0  # ZeRO-3: compileLayers ignored, with a warning
    from synthetic.tiny_model import build_model, build_tokenizer

    assert compiled["loss"] == pytest.approx(
        eager["loss"], rel=reorder_tol(sum(len(e) for e in _examples(build_tokenizer())))
    )

    start = build_model(len(build_tokenizer()), seed=0).state_dict()
    for name, value in eager["weights"].items():  # the update as a whole (see the ZeRO-3 test)
        update = (value - start[name]).abs().mean()
        assert float((compiled["weights"][name] - value).abs().mean()) <= 0.02 * float(update) + 1e-9, name
