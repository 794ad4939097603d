"""RSFT configuration from the spec, LR schedule and checkpoint cadence."""

from __future__ import annotations

import pytest

from whale.core.protocol import WeightPhaseArgs
from whale.core.spec import WhaleRunSpec
from whale.rsft.config import RSFTConfig, lr_at, should_checkpoint


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
    args = WeightPhaseArgs(
        cycle=1, harness=None, from_checkpoint=None, from_step=0, target_step=10, steps_per_epoch=30, total_steps=60
    )  # decide resolves it: totalEpochs 2 x 30 steps per epoch
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
    args = WeightPhaseArgs(
        cycle=1, harness=None, from_checkpoint=None, from_step=0, target_step=1, steps_per_epoch=1, total_steps=1
    )
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


def test_from_spec_takes_every_rsft_field_of_the_same_name():
    """No field of ``spec.experiment.rsft`` is copied by hand: a value set in the spec arrives in the config."""
    from dataclasses import fields

    from whale.core.spec import RSFT

    shared = sorted({f.name for f in fields(RSFTConfig)} & set(RSFT.model_fields))
    assert len(shared) >= 20
    changed = {
        "prompts_per_step": 3,
        "rollouts_per_prompt": 5,
        "score_threshold": 0.25,
        "sft_epochs": 2,
        "mini_batch_size": 7,
        "micro_batch_size_per_gpu": 1,
        "learning_rate": 2e-6,
        "lr_scheduler": "linear",
        "warmup_steps": 3,
        "weight_decay": 0.5,
        "max_grad_norm": 0.5,
        "precision": "fp32",
        "gradient_checkpointing": True,
        "compile_layers": True,
        "pack_sequences": True,
        "padding": "bucket",
        "seed": 7,
        "checkpoint_every_steps": 2,
        "step_resume": "on",
        "sequences": "turn",
        "mini_batch_scope": "global",
        "attention": "sdpa",
        "async_checkpoint": False,
        "pack_tokens": 8192,
    }
    assert set(changed) == set(shared), "a new shared field: give it a non-default value here"
    spec = WhaleRunSpec.model_validate(
        {"domain": "synthetic", "condition": "rsft_only", "model": {"name": "m"}, "schedule": {"totalSteps": 4}}
    )
    spec = spec.with_sections(**{"rsft": spec.experiment.rsft.model_copy(update=changed)})
    args = WeightPhaseArgs(
        cycle=1, harness=None, from_checkpoint=None, from_step=0, target_step=2, steps_per_epoch=2, total_steps=4
    )
    cfg = RSFTConfig.from_spec(spec, args)
    assert {name: getattr(cfg, name) for name in shared} == changed
    assert (cfg.total_steps, cfg.steps_per_epoch) == (4, 2)


def test_every_config_field_comes_from_the_spec_or_is_named_as_not():
    """A field is the spec's (rsft or its sampling), derived, or the trainer's own; every spec field is in the
    config or named as left out. A new spec field cannot be missed, nor a config field gain defaults of its own."""
    from dataclasses import fields

    from whale.core.spec import RSFT, Sampling
    from whale.rsft import config

    groups = (config.FROM_RSFT, config.FROM_SAMPLING, config.DERIVED, config.TRAINER_ONLY)
    named = [name for group in groups for name in group]
    assert sorted(named) == sorted(f.name for f in fields(RSFTConfig)), "each field in exactly one group"
    assert sorted(config.FROM_RSFT + config.NOT_FROM_RSFT) == sorted(RSFT.model_fields)
    assert sorted(config.FROM_SAMPLING + config.NOT_FROM_SAMPLING) == sorted(Sampling.model_fields)


def test_config_defaults_are_the_specs():
    """The spec owns the defaults (the paper's): a config built without a spec (a test, a benchmark) trains as
    a run whose manifest sets nothing (issue #32: weight decay 0.0 and seed 0 here against the spec's 0.01 and
    42)."""
    from whale.core.spec import RSFT, Sampling
    from whale.rsft import config

    plain = RSFTConfig()
    spec_rsft, spec_sampling = RSFT(), Sampling()
    differ = {
        name: (getattr(plain, name), getattr(part, name))
        for names, part in ((config.FROM_RSFT, spec_rsft), (config.FROM_SAMPLING, spec_sampling))
        for name in names
        if getattr(plain, name) != getattr(part, name)
    }
    assert differ == {}, "config default != spec default: take the spec's"
    assert (plain.weight_decay, plain.seed) == (0.01, 42)


def test_from_parts_is_the_spec_parts_plus_the_derived_values():
    from whale.core.spec import RSFT, Sampling

    rsft = RSFT(learning_rate=3e-6, seed=5, sampling=Sampling(top_k=7))
    cfg = RSFTConfig.from_parts(rsft, rsft.sampling, max_seq_len=1024, total_steps=9, steps_per_epoch=3)
    assert (cfg.learning_rate, cfg.seed, cfg.top_k, cfg.weight_decay) == (3e-6, 5, 7, 0.01)
    assert (cfg.max_seq_len, cfg.total_steps, cfg.steps_per_epoch) == (1024, 9, 3)
