"""RSFT configuration from the spec, LR schedule and checkpoint cadence."""

from __future__ import annotations

import pytest

from whale.protocol import WeightPhaseArgs
from whale.rsft.config import RSFTConfig, lr_at, should_checkpoint
from whale.spec import WhaleRunSpec


def test_from_spec_reads_rsft_and_derives_the_schedule_horizon():
    spec = WhaleRunSpec.model_validate(
        {
            "domain": "synthetic",
            "condition": "rsft_only",
            "model": {"name": "m", "maxModelLen": 512},
            "schedule": {"totalEpochs": 2},
            "rsft": {"promptsPerStep": 4, "learningRate": 1e-5, "lrScheduler": "cosine", "sampling": {"topK": 5}},
        }
    )
    args = WeightPhaseArgs(cycle=1, harness=None, from_checkpoint=None, from_step=0, target_step=10, steps_per_epoch=30)
    cfg = RSFTConfig.from_spec(spec, args)
    assert (cfg.prompts_per_step, cfg.learning_rate, cfg.lr_scheduler, cfg.top_k) == (4, 1e-5, "cosine", 5)
    assert cfg.total_steps == 60 and cfg.max_seq_len == 512 and cfg.steps_per_epoch == 30
    assert cfg.padding == "auto" and cfg.micro_padding == "longest"


@pytest.mark.parametrize(
    ("padding", "compiled", "resolved"),
    [
        ("auto", True, "bucket"),
        ("auto", False, "longest"),
        ("masked", True, "masked"),
        ("bucket", False, "bucket"),
    ],
)
def test_padding_auto_buckets_only_for_compiled_layers(padding, compiled, resolved):
    spec = WhaleRunSpec.model_validate(
        {
            "domain": "synthetic",
            "condition": "rsft_only",
            "model": {"name": "m"},
            "schedule": {"totalSteps": 1},
            "rsft": {"padding": padding, "compileLayers": compiled},
        }
    )
    args = WeightPhaseArgs(cycle=1, harness=None, from_checkpoint=None, from_step=0, target_step=1, steps_per_epoch=1)
    assert RSFTConfig.from_spec(spec, args).micro_padding == resolved


def test_lr_schedules_follow_the_global_step():
    base = dict(learning_rate=1.0, total_steps=10)
    assert lr_at(7, RSFTConfig(**base)) == 1.0
    assert lr_at(0, RSFTConfig(**base, warmup_steps=4)) == pytest.approx(0.25)
    assert lr_at(5, RSFTConfig(**base, lr_scheduler="linear")) == pytest.approx(0.5)
    assert lr_at(10, RSFTConfig(**base, lr_scheduler="cosine")) == pytest.approx(0.0)
    assert lr_at(0, RSFTConfig(**base, lr_scheduler="cosine")) == pytest.approx(1.0)


def test_checkpoints_at_save_steps_every_n_and_the_target():
    cfg = RSFTConfig(checkpoint_every_steps=3)
    marks = [s for s in range(1, 11) if should_checkpoint(s, cfg, frozenset({5}), target=10)]
    assert marks == [3, 5, 6, 9, 10]
    assert [s for s in range(1, 5) if should_checkpoint(s, RSFTConfig(), frozenset(), target=4)] == [4]
