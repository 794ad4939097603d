"""A succeeded run keeps its last checkpoint and its best (and final) evaluation's, the others deleted
(``spec.experiment.rsft.keepCheckpoints: lastAndBest``, the default); ``all`` keeps every one; nothing is deleted before
the run succeeds. End to end through `whale run` with simulated workloads (real checkpoint folders)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import yaml
from typer.testing import CliRunner

from whale.cli import app
from whale.core import layout
from whale.core.convert import convert_v1alpha1
from whale.core.retention import kept_steps, prunable
from whale.core.status import BestEval, RunPhase, WhaleRunStatus


def best(step: int, phase: str = "eval") -> BestEval:
    return BestEval(mean_at_k=0.5, k=8, phase=phase, cycle=1, step=step, checkpoint=layout.checkpoint_prefix("r", step))


def test_the_last_and_the_best_are_kept_once_the_run_succeeds():
    status = WhaleRunStatus(
        phase=RunPhase.SUCCEEDED,
        current_checkpoint=layout.checkpoint_prefix("r", 8),
        best=best(4),
        final=best(8),
    )
    assert kept_steps(status) == {4, 8}
    assert prunable(status, [2, 4, 6, 8], "lastAndBest") == (2, 6)
    assert prunable(status, [2, 4, 6, 8], "all") == ()
    for phase in (RunPhase.RUNNING, RunPhase.FAILED, RunPhase.INTERRUPTED):  # a resume may need any of them
        assert prunable(status.model_copy(update={"phase": phase}), [2, 4, 6, 8], "lastAndBest") == ()


def run_manifest(tmp_path: Path, keep: str | None) -> Path:
    rsft = {"keepCheckpoints": keep} if keep else {}
    spec = {
        "domain": "counting",
        "condition": "rsft_only",
        "model": {"name": "tiny"},
        "schedule": {"totalSteps": 6},
        "evaluation": {"intervalSteps": 2},
        "rsft": rsft,
    }
    path = tmp_path / f"run-{keep}.yaml"
    meta = {"name": f"keep-{(keep or 'default').lower()}"}
    path.write_text(
        yaml.safe_dump(
            convert_v1alpha1({"apiVersion": "whale.dev/v1alpha1", "kind": "WhaleRun", "metadata": meta, "spec": spec})
        )
    )
    return path


def test_a_finished_run_deletes_the_others_and_all_keeps_them(tmp_path, monkeypatch, counting_domain):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("WHALE_WORKLOAD_COMMAND", f"{sys.executable} -m tests.workloads.simulated")
    cli = CliRunner()
    for keep in (None, "all"):
        manifest = run_manifest(tmp_path, keep)
        res = cli.invoke(app, ["run", str(manifest), "--store", "st", "--timeout", "90", "-o", "json"])
        assert res.exit_code == 0, res.output
        run_dir = tmp_path / "st" / "runs" / yaml.safe_load(manifest.read_text())["metadata"]["name"]
        status = WhaleRunStatus.model_validate(json.loads((run_dir / "status.json").read_text()))
        folders = sorted(p.name for p in (run_dir / "checkpoints").iterdir())
        if keep == "all":
            assert folders == ["step-000002", "step-000004", "step-000006"]
        else:  # the last (6) and the best evaluation's: at least one of 2 and 4 is gone
            assert folders == sorted(f"step-{s:06d}" for s in kept_steps(status)) and "step-000006" in folders
            assert len(folders) < 3, folders


def test_both_controllers_prune_through_one_idempotent_function(tmp_path):
    """What the local runner and the operator call when the run finishes: a second call deletes nothing."""
    from whale.control.planner import prune_checkpoints
    from whale.store import open_store

    store = open_store(str(tmp_path / "st"))
    for step in (2, 4, 6, 8):
        store.write_bytes(f"{layout.checkpoint_prefix('r', step)}/model.safetensors", b"w")
        store.write_bytes(layout.checkpoint_complete_key("r", step), b"")
    status = WhaleRunStatus(
        phase=RunPhase.SUCCEEDED, current_checkpoint=layout.checkpoint_prefix("r", 8), best=best(4), final=best(8)
    )
    assert prune_checkpoints(store, "r", status, "lastAndBest") == (2, 6)
    assert prune_checkpoints(store, "r", status, "lastAndBest") == ()
    assert store.list(layout.checkpoints_prefix("r") + "/", recursive=False) == [
        f"{layout.checkpoint_prefix('r', 4)}/",
        f"{layout.checkpoint_prefix('r', 8)}/",
    ]
