"""Shared helpers of the RSFT tests: the synthetic tiny model (built once per session) and requests."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from whale.core import layout
from whale.core.protocol import PhaseRequest, WeightPhaseArgs, WeightStopRule, phase_request
from whale.core.spec import WhaleRunSpec

RUN = "rsft-test"


def tiny_model_dir(base: Path) -> Path:
    """The synthetic domain's tiny model, built once under ``base`` (a session temp dir)."""
    from synthetic import tiny_model

    out = base / "synthetic-tiny-model"
    if not (out / "config.json").exists():
        tiny_model.build(out)
    return out


def spec(model_dir: Path, **rsft: Any) -> dict[str, Any]:
    knobs = {
        "promptsPerStep": 8,
        "rolloutsPerPrompt": 4,
        "miniBatchSize": 16,
        "microBatchSizePerGpu": 8,
        "learningRate": 3e-4,
        "sampling": {"maxResponseTokens": 12},
    }
    knobs.update(rsft)
    return {
        "domain": "synthetic",
        "condition": "rsft_only",
        "model": {"name": str(model_dir), "maxModelLen": 256},
        "schedule": {"totalSteps": 40},
        "rsft": knobs,
        "inference": {"backend": "transformers", "maxConcurrency": 64},
    }


def write_request(
    store: Any,
    phase: str,
    spec_wire: dict[str, Any],
    *,
    target: int,
    from_step: int = 0,
    from_checkpoint: str | None = None,
    save_steps: list[int] | None = None,
    stop_rule: WeightStopRule | None = None,
) -> PhaseRequest:
    request = phase_request(
        spec_wire,
        run=RUN,
        phase=phase,
        attempt=1,
        args=WeightPhaseArgs(
            cycle=1,
            harness=None,
            from_checkpoint=from_checkpoint,
            from_step=from_step,
            target_step=target,
            save_steps=save_steps or [],
            steps_per_epoch=125,
            total_steps=WhaleRunSpec.model_validate(spec_wire).experiment.schedule.total_steps or target,
            stop_rule=stop_rule,
        ),
    )
    store.write_json(layout.spec_key(RUN), spec_wire)
    store.write_json(layout.request_key(RUN, phase), request.to_wire())
    return request
