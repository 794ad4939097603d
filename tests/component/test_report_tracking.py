"""whale.tracking: real backends, offline — TensorBoard event files (tensorboardX) read back record by record,
a W&B offline run's transaction log read back, an MLflow file store read back through its client."""

from __future__ import annotations

import json
import logging
import os
import struct
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tests.component.report_support import simulated_run
from tests.conftest import PLUGINS, ROOT
from tests.unit.test_report_series import whale_records
from whale.cli import app
from whale.core import layout
from whale.report.series import build_series
from whale.report.source import read_run
from whale.store import open_store
from whale.tracking import (
    MlflowTracker,
    RunIdentity,
    TensorBoardTracker,
    WandbTracker,
    export_phase,
    export_series,
    points,
)


def tb_scalars(logdir: Path) -> tuple[dict[str, list[tuple[int, float]]], dict[str, str]]:
    """{tag: [(step, value)]} and {tag: text} of every events file under ``logdir`` (TFRecord framing)."""
    from tensorboardX.proto.event_pb2 import Event

    scalars: dict[str, list[tuple[int, float]]] = {}
    texts: dict[str, str] = {}
    for path in sorted(logdir.rglob("events.out.tfevents.*")):
        raw, pos = path.read_bytes(), 0
        while pos < len(raw):
            (length,) = struct.unpack("<Q", raw[pos : pos + 8])
            event = Event.FromString(raw[pos + 12 : pos + 12 + length])
            pos += 12 + length + 4
            for v in event.summary.value:
                if v.HasField("tensor") and v.tensor.string_val:
                    texts[v.tag] = v.tensor.string_val[0].decode()
                elif v.HasField("simple_value") or v.simple_value:
                    scalars.setdefault(v.tag, []).append((event.step, v.simple_value))
    return scalars, texts


def wandb_history(root: Path) -> tuple[list[dict], list[tuple[str, list[str]]], set[str]]:
    """History rows, artifacts (name, files) and run ids of the offline runs under ``root`` (W&B's
    LevelDB-style log: 7-byte file header, 32 KiB blocks, 7-byte record headers, FULL/FIRST/MIDDLE/LAST)."""
    from wandb.proto import wandb_internal_pb2 as pb

    rows, artifacts, ids = [], [], set()
    for path in sorted(root.rglob("run-*.wandb")):
        raw, pos, buf = path.read_bytes(), 7, b""
        while pos + 7 <= len(raw):
            left = 32768 - pos % 32768
            if left < 7:
                pos += left
                continue
            _, length, kind = struct.unpack("<IHB", raw[pos : pos + 7])
            pos += 7
            if kind == 0 and length == 0:
                pos += left - 7
                continue
            data, pos = raw[pos : pos + length], pos + length
            if kind in (2, 3):
                buf = data if kind == 2 else buf + data
                continue
            record = pb.Record.FromString(buf + data if kind == 4 else data)  # type: ignore[attr-defined]  # protobuf-generated
            which = record.WhichOneof("record_type")
            if which == "history":
                rows.append({i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in record.history.item})
            elif which == "artifact":
                artifacts.append((record.artifact.name, [e.path for e in record.artifact.manifest.contents]))
            elif which == "run":
                ids.add(record.run.run_id)
    return rows, artifacts, ids


@pytest.fixture
def series():
    return build_series(whale_records())


CODE = {"c01-harness": "def build(ctx):\n    return 'accepted'\n"}


def test_points_put_each_series_on_its_axis(series):
    got = points(series)
    weight = [(p.x, p.scalars["reward_mean"], p.scalars["rollouts_spent"]) for p in got if p.namespace == "weight"]
    assert weight == [(1, 0.51, 10.0), (2, 0.52, 20.0), (3, 0.53, 36.0), (4, 0.54, 46.0)]
    assert [(p.x, p.scalars["best_score"]) for p in got if p.namespace == "harness"] == [(1, 0.1), (2, 0.2)]
    assert [(p.x, p.scalars["mean_at_k"]) for p in got if p.namespace == "eval"] == [
        (0, 0.1),
        (20, 0.2),
        (26, 0.4),
        (46, 0.4),
    ]
    assert [p.x for p in got if p.namespace == "eval_by_step"] == [0, 2, 2, 4]
    only = points(series, phases=["c01-harness"])
    assert {p.namespace for p in only} == {"harness"}


def test_tensorboard_event_files_hold_the_scalars_and_the_harness_code(series, tmp_path):
    pytest.importorskip("tensorboardX")
    tracker = TensorBoardTracker(tmp_path / "tb", suffix="c01-harness")
    n = export_series(series, [tracker], CODE)
    tracker.close()
    assert n == len(points(series))
    scalars, texts = tb_scalars(tmp_path / "tb")
    assert scalars["weight/reward_mean"] == [
        (1, pytest.approx(0.51)),
        (2, pytest.approx(0.52)),
        (3, pytest.approx(0.53)),
        (4, pytest.approx(0.54)),
    ]
    assert [s for s, _ in scalars["eval/mean_at_k"]] == [0, 20, 26, 46]
    assert scalars["harness/best_score"][-1] == (2, pytest.approx(0.2))
    assert "return 'accepted'" in texts["harness/c01-harness-accepted.py/text_summary"]


def test_wandb_offline_run_holds_history_with_its_axes_and_the_harness_artifact(series, tmp_path, monkeypatch):
    pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    monkeypatch.setenv("WANDB_SILENT", "true")
    identity = RunIdentity(name="r", source="file:///s/runs/r")
    tracker = WandbTracker(identity, "whale-test", {"domain": "chess_puzzles"})
    export_series(series, [tracker], CODE)
    tracker.close()
    rows, artifacts, ids = wandb_history(tmp_path)
    assert ids == {identity.run_id}
    weight = [(r["weight/step"], r["weight/reward_mean"]) for r in rows if "weight/step" in r]
    assert weight == [(1, 0.51), (2, 0.52), (3, 0.53), (4, 0.54)]
    assert [r["eval/rollouts"] for r in rows if "eval/rollouts" in r] == [0, 20, 26, 46]
    assert artifacts == [("r-c01-harness-accepted.py", ["c01-harness-accepted.py"])]


def test_mlflow_run_is_found_again_by_its_whale_id(series, tmp_path, monkeypatch):
    pytest.importorskip("mlflow")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"file://{tmp_path / 'mlruns'}")
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    identity = RunIdentity(name="r", source="file:///s/runs/r")
    first = MlflowTracker(identity, "whale-test", {"domain": "chess_puzzles"})
    export_series(series, [first], CODE, phases=["c01-weight", "c01-harness"])
    first.close()
    second = MlflowTracker(identity, "whale-test", {"domain": "chess_puzzles"})  # the next phase's process
    export_series(series, [second], CODE, phases=["c02-weight"])
    second.close()
    assert second.run_id == first.run_id
    history = first.client.get_metric_history(first.run_id, "weight/reward_mean")
    assert sorted((m.step, m.value) for m in history) == [(1, 0.51), (2, 0.52), (3, 0.53), (4, 0.54)]
    run = first.client.get_run(first.run_id)
    assert run.data.params["domain"] == "chess_puzzles" and run.data.tags["whale.run"] == "r"
    local = first.client.download_artifacts(first.run_id, "harnesses/c01-harness-accepted.py", str(tmp_path))
    assert Path(local).read_text() == CODE["c01-harness"]


@pytest.fixture
def tracked_store(tmp_path, monkeypatch):
    """A whale run by the local runner (simulated workloads) whose spec asks for TensorBoard."""
    monkeypatch.syspath_prepend(str(PLUGINS))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(PLUGINS), str(ROOT), os.environ.get("PYTHONPATH", "")]))
    tb = tmp_path / "tb"
    status = simulated_run(
        tmp_path / "store",
        "sim-whale",
        tmp_path / "work",
        tracking={"reportTo": ["tensorboard"], "tensorboardDir": str(tb)},
    )
    return open_store(str(tmp_path / "store")), status, tb


def test_export_phase_logs_each_finished_phase_as_the_workloads_call_it(tracked_store):
    pytest.importorskip("tensorboardX")
    store, status, tb = tracked_store
    phases = status.completed_phases + [e.phase for e in status.evals]
    logged = {phase: export_phase(store, "sim-whale", phase) for phase in phases}
    assert all(n > 0 for n in logged.values()), logged
    assert export_phase(store, "sim-whale", "prepare") == 0  # not a phase of decide()
    scalars, texts = tb_scalars(tb / "sim-whale")
    assert [s for s, _ in scalars["weight/reward_mean"]] == list(range(1, 7))
    assert sorted(s for s, _ in scalars["eval/mean_at_k"]) == sorted(e.rollouts_at for e in status.evals)
    assert dict(scalars["eval/mean_at_k"])[status.best.rollouts_at] == pytest.approx(status.best.mean_at_k)
    assert "simulated harness accepted in cycle 1" in texts["harness/c01-harness-accepted.py/text_summary"]
    assert len(list((tb / "sim-whale").glob("events.out.tfevents.*"))) == len(phases)  # one file per phase


def test_export_phase_is_off_by_default_and_never_fails_a_phase(tracked_store, caplog, monkeypatch):
    store, _status, _ = tracked_store
    spec_key = layout.spec_key("sim-whale")
    spec = store.read_json(spec_key)
    execution = {k: v for k, v in spec["execution"].items() if k != "tracking"}
    store.write_json(spec_key, {**spec, "execution": execution})
    assert export_phase(store, "sim-whale", "c01-weight") == 0
    # a tracker that cannot start (MLflow's file store refused) is logged, with the way out, and skipped
    pytest.importorskip("mlflow")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"file://{store.local_path('mlruns')}")
    monkeypatch.delenv("MLFLOW_ALLOW_FILE_STORE", raising=False)
    store.write_json(spec_key, {**spec, "execution": {**execution, "tracking": {"reportTo": ["mlflow"]}}})
    with caplog.at_level(logging.WARNING, logger="whale.tracking"):
        assert export_phase(store, "sim-whale", "c01-weight") == 0
    assert "whale report --export" in caplog.text and "Traceback" in caplog.text


def test_report_export_replays_a_run_into_tensorboard(tracked_store, tmp_path):
    pytest.importorskip("tensorboardX")
    store, status, _ = tracked_store
    out = tmp_path / "out"
    res = CliRunner().invoke(
        app,
        ["report", str(store.local_path("runs/sim-whale")), "-o", "json", "--out", str(out), "--export", "tensorboard"],
    )
    assert res.exit_code == 0, res.output
    assert "exported" in res.output and (out / "report.json").exists()
    scalars, _ = tb_scalars(out / "tensorboard" / "sim-whale")
    assert len(scalars["weight/reward_mean"]) == status.step
    assert read_run(store, "sim-whale").status == status
