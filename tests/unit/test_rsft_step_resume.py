"""rsft.stepResume: what a weight phase saves after every step, resolved from the model's size, and the replay
records a model too large for a checkpoint every step leaves (their round trip through a folder store; the
workload's kill-and-resume on S3 is tests/component/test_train_workload.py)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from whale.core import layout  # noqa: E402
from whale.rsft import checkpoint as ckpt  # noqa: E402
from whale.rsft.collate import IGNORE_INDEX, Example  # noqa: E402
from whale.rsft.phase import LIGHT_RESUME_MAX_BYTES, StepResume, step_resume  # noqa: E402
from whale.store import open_store  # noqa: E402

RUN, PHASE = "r", "c01-weight"


def _model_of(params: int) -> torch.nn.Module:
    """A module with ``params`` parameters on the meta device (no memory behind them)."""
    model = torch.nn.Module()
    model.weight = torch.nn.Parameter(torch.empty(params, device="meta"))
    return model


@pytest.mark.parametrize(
    ("mode", "params", "expected"),
    [
        ("auto", LIGHT_RESUME_MAX_BYTES // 12, StepResume.CHECKPOINT),  # SmolLM2-135M's side of the line
        ("auto", LIGHT_RESUME_MAX_BYTES // 12 + 1, StepResume.REPLAY),  # Qwen3.5-4B's
        ("on", 4_000_000_000, StepResume.CHECKPOINT),
        ("replay", 1, StepResume.REPLAY),
        ("off", 1, StepResume.NONE),
    ],
)
def test_step_resume_is_a_checkpoint_while_weights_and_adam_moments_fit_in_4_gib_else_a_replay_record(
    mode, params, expected
):
    assert step_resume(mode, _model_of(params)) is expected


def test_a_model_whose_parameters_cannot_be_counted_replays():
    assert step_resume("auto", object()) is StepResume.REPLAY


def test_replay_records_round_trip_and_resume_only_over_logged_steps_without_a_gap(tmp_path):
    store = open_store(str(tmp_path))
    examples = [
        Example((1, 2, 3), (IGNORE_INDEX, 2, 3)),
        Example((7,) * 300, (IGNORE_INDEX,) * 100 + (7,) * 200),  # token ids past int8/int16 lengths alike
        Example((50_000, 1), (IGNORE_INDEX, 1)),
    ]
    ckpt.save_replay(store, RUN, PHASE, 2, examples)
    ckpt.save_replay(store, RUN, PHASE, 3, [])  # a step that kept nothing
    ckpt.save_replay(store, RUN, PHASE, 4, examples[:1])
    ckpt.save_replay(store, RUN, PHASE, 6, examples[:1])  # after a gap: never replayed
    assert ckpt.load_replay(store, RUN, PHASE, 2) == examples
    assert ckpt.load_replay(store, RUN, PHASE, 3) == []

    assert ckpt.replay_steps(store, RUN, PHASE, after=1, logged=[1, 2, 3, 4, 6]) == [2, 3, 4]
    # step 4's record was written, its metrics line not (killed between the two): it is sampled again
    assert ckpt.replay_steps(store, RUN, PHASE, after=1, logged=[1, 2, 3]) == [2, 3]
    assert ckpt.replay_steps(store, RUN, PHASE, after=4, logged=[1, 2, 3, 4, 6]) == []
    assert ckpt.replay_steps(store, RUN, PHASE, after=0, logged=[1, 2, 3, 4]) == []  # no record of step 1

    ckpt.prune_replay(store, RUN, PHASE, up_to=3)
    assert store.list(layout.replay_prefix(RUN, PHASE) + "/") == [
        layout.replay_key(RUN, PHASE, 4),
        layout.replay_key(RUN, PHASE, 6),
    ]
