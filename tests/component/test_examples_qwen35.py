"""The nine example manifests that train weights, each with its own training settings (``spec.experiment.rsft``:
packed rows, compiled layers, gradient checkpointing, micro-batches, packTokens, ...) and a tiny Qwen3.5 (the paper's hybrid
architecture, built from a config: no download), saved in the hub's multimodal form as ``Qwen/Qwen3.5-2B`` is, in
place of the model: the train workload's architecture check
passes, and the first RSFT step's SFT trains exactly what the unpacked, uncompiled reference without
recomputation trains (the same
token-mean loss over the same tokens, the same gradients).

The manifests share a few distinct training settings; each distinct one is trained once per session
(``_first_step``), every manifest is checked against its own."""

from __future__ import annotations

import dataclasses
import random
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from tests.fixtures.models import QWEN35_TINY_SHAPE  # noqa: E402
from tests.fixtures.tolerance import assert_reordered_close, reorder_tol  # noqa: E402
from whale.core.protocol import WeightPhaseArgs  # noqa: E402
from whale.manifest import load_manifest  # noqa: E402
from whale.rsft.collate import IGNORE_INDEX, Example  # noqa: E402
from whale.rsft.config import RSFTConfig  # noqa: E402
from whale.rsft.trainer import SFTTrainer  # noqa: E402
from whale.workloads.train import check_architecture  # noqa: E402

EXAMPLES = Path(__file__).resolve().parents[2] / "manifests" / "examples"
TRAINING = sorted(
    p
    for p in EXAMPLES.glob("*.yaml")
    if p.stem.split("-")[-1] in ("rsft", "whale", "adaptive") and p.parent == EXAMPLES
)
CPU = torch.device("cpu")
#: sequence lengths of the step's kept trajectories (a long one past the chunked rule's 64, a one-token reply)
LENGTHS = (300, 120, 57, 480, 33, 2)


def test_the_nine_training_manifests_are_found():
    assert len(TRAINING) == 9


def _examples(vocab: int) -> tuple[Example, ...]:
    rng = random.Random(7)
    out = []
    for n in LENGTHS:
        ids = tuple(rng.randrange(vocab) for _ in range(n))
        labels = (IGNORE_INDEX,) + tuple(t if rng.random() < 0.8 else IGNORE_INDEX for t in ids[1:])
        out.append(Example(ids, labels))
    return tuple(out)


#: each distinct training setting's first step, trained once per session (keyed by the whole config)
_STEPS: dict[str, tuple[float, int, list[torch.Tensor]]] = {}


def _first_step(cfg: RSFTConfig, model_dir: str) -> tuple[float, int, list[torch.Tensor]]:
    key = repr((dataclasses.asdict(cfg), model_dir))
    if key not in _STEPS:
        _STEPS[key] = _train_first_step(cfg, model_dir)
    return _STEPS[key]


def _train_first_step(cfg: RSFTConfig, model_dir: str) -> tuple[float, int, list[torch.Tensor]]:
    """One SFT step of ``cfg`` on the tiny Qwen3.5 as the train workload loads it: the step's token-mean loss,
    its tokens and the gradients of its (single) update, read just before the optimiser steps."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    trainer = SFTTrainer(model, cfg, device=CPU, pad_id=0)
    grads: list[torch.Tensor] = []
    step = trainer.optimizer.step

    def record_then_step(*args, **kwargs):
        grads.extend(p.grad.detach().clone() for p in model.parameters() if p.grad is not None)
        return step(*args, **kwargs)

    trainer.optimizer.step = record_then_step
    stats = trainer.train(_examples(model.config.vocab_size), lr=cfg.learning_rate, seed=0)
    assert stats.updates == 1 and stats.loss is not None
    return stats.loss, stats.tokens, grads


@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.filterwarnings("ignore:The .grad attribute of a Tensor that is not a leaf:UserWarning")  # dynamo's own
@pytest.mark.parametrize("manifest", TRAINING, ids=lambda p: p.stem)
def test_an_example_trains_its_first_step_on_qwen35_as_the_unpacked_reference(manifest, tiny_qwen35_hub_dir):
    from transformers import AutoConfig

    spec = load_manifest(manifest).spec
    spec = spec.with_sections(**{"model": spec.experiment.model.model_copy(update={"name": str(tiny_qwen35_hub_dir)})})
    check_architecture(AutoConfig.from_pretrained(tiny_qwen35_hub_dir), spec)  # the workload's check, before weights
    args = WeightPhaseArgs(
        cycle=1, harness=None, from_checkpoint=None, from_step=0, target_step=1, steps_per_epoch=1, total_steps=1
    )
    cfg = RSFTConfig.from_spec(spec, args)
    assert cfg.pack_sequences and cfg.compile_layers, "the examples pack and compile (docs/performance.md)"
    loss, tokens, grads = _first_step(dataclasses.replace(cfg, precision="fp32"), str(tiny_qwen35_hub_dir))
    reference = dataclasses.replace(
        cfg,
        precision="fp32",
        pack_sequences=False,
        compile_layers=False,
        padding="longest",
        gradient_checkpointing=False,
    )
    ref_loss, ref_tokens, ref_grads = _first_step(reference, str(tiny_qwen35_hub_dir))
    assert tokens == ref_tokens
    # two fp32 computations of one token mean (tests.fixtures.tolerance): the loss sums the tokens' losses,
    # a weight's gradient sums over the tokens and the hidden features that reach it
    assert abs(loss - ref_loss) <= reorder_tol(sum(LENGTHS)) * abs(ref_loss)
    assert len(grads) == len(ref_grads)
    terms = sum(LENGTHS) * QWEN35_TINY_SHAPE["hidden_size"]
    for got, want in zip(grads, ref_grads, strict=True):
        assert_reordered_close(got, want, terms)
