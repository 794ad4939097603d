"""The train workload tells where it is (``progress.json``) as it goes, with the real tiny model: a step's
reward is written as soon as its rollouts are sampled — before its SFT update and its metrics line — so the
display of `whale run` is never one step behind; rollouts are counted while they are sampled."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.component.rsft_support import RUN, spec, tiny_model_dir, write_request
from whale.core import layout
from whale.core.protocol import PhaseProgress, ProgressStage
from whale.store.local import LocalStore

pytest.importorskip("transformers")
pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

PHASE = "c01-weight"


class RecordingStore(LocalStore):
    """A real folder store that records, in order, each progress object and metrics line written (named
    as such: it only watches the writes)."""

    def __init__(self, root: Path):
        super().__init__(root)
        self.writes: list[tuple[str, dict]] = []

    def write_json(self, key: str, obj) -> None:
        if key == layout.progress_key(RUN, PHASE):
            self.writes.append(("progress", dict(obj)))
        super().write_json(key, obj)

    def append_jsonl(self, key: str, records) -> None:
        if key == layout.metrics_key(RUN, PHASE):
            self.writes.append(("metrics", dict(records)))
        super().append_jsonl(key, records)


def test_each_step_reports_its_sampled_reward_before_its_update_and_metrics_line(tmp_path):
    from whale.workloads.train import run_train

    model_dir = tiny_model_dir(tmp_path)
    store = RecordingStore(tmp_path / "store")
    write_request(store, PHASE, spec(model_dir), target=2)
    run_train(store, RUN, PHASE)

    progress = [(i, PhaseProgress.model_validate(o)) for i, (what, o) in enumerate(store.writes) if what == "progress"]
    metrics = [(i, o) for i, (what, o) in enumerate(store.writes) if what == "metrics"]
    assert [m["step"] for _, m in metrics] == [1, 2]
    for at, line in metrics:
        step = line["step"]
        trained = [(i, p) for i, p in progress if p.stage is ProgressStage.TRAINING and p.step == step]
        assert trained, f"no 'training' progress for step {step}"
        i, p = trained[0]
        assert i < at, "the sampled reward must be written before the step's metrics line"
        assert p.reward_mean == pytest.approx(line["rewardMean"]) and p.kept == line["kept"]
        assert p.rollouts == line["rollouts"] == 8 * 4 and p.acceptance_rate == pytest.approx(line["acceptanceRate"])
        sampling = [p for _, p in progress if p.stage is ProgressStage.SAMPLING and p.step == step]
        assert sampling[0].done == 0 and sampling[0].total == 32 and sampling[0].unit == "rollouts"
    # the rollouts were counted while they were sampled: the last sampling write of a step says all of them
    assert any(p.stage is ProgressStage.SAMPLING and p.done == p.total == 32 for _, p in progress)
    assert progress[-1][1].stage is ProgressStage.CHECKPOINTING and progress[-1][1].step == 2
