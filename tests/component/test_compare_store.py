"""`whale compare` from a store alone: a synthetic store (written through the store client, laid out as the runner
writes it: spec.json, status.json, each evaluation's result and per-item file) with known answers, read from a
folder and from a real S3 server on loopback."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from whale.cli import app
from whale.core import layout
from whale.core.protocol import WeightStepMetrics
from whale.core.spec import WhaleRunSpec
from whale.core.state import best_eval
from whale.core.status import EvalPoint, RunPhase, WhaleRunStatus
from whale.store import open_store

pytest.importorskip("matplotlib")
pytest.importorskip("scipy")

#: (run, condition, proposer backend, seed, final mean@k, items solved of 10)
RUNS = [
    ("rsft-s1", "rsft_only", "replay", 1, 0.5, 5),
    ("rsft-s2", "rsft_only", "replay", 2, 0.6, 6),
    ("rsft-s3", "rsft_only", "replay", 3, 0.7, 7),
    ("whale-s1", "whale", "replay", 1, 0.8, 8),
    ("whale-s2", "whale", "replay", 2, 0.8, 8),
    ("mutate-s1", "whale", "mutate", 1, 0.4, 4),
]


def write_run(store, name: str, condition: str, backend: str, seed: int, final: float, solved: int) -> None:
    schedule = {"totalSteps": 4} if condition == "rsft_only" else {"totalSteps": 4, "weightStepsPerCycle": 2}
    proposer = {"backend": backend, "script": "p.json"} if backend == "replay" else {"backend": backend}
    spec = WhaleRunSpec.model_validate(
        {
            "domain": "synthetic",
            "condition": condition,
            "model": {"name": "m"},
            "schedule": schedule,
            "seed": seed,
            "evaluation": {"samplesPerItem": 4},
            "harnessSearch": {"proposer": proposer},
        }
    )
    points = [(0, 0, 0.1), (2, 32, final + 0.1), (4, 64, final)]
    evals = []
    for step, rollouts, mean in points:
        phase = layout.eval_phase_key(0 if step == 0 else 1, step, "start" if step == 0 else "weight")
        evals.append(
            EvalPoint(
                phase=phase,
                cycle=0 if step == 0 else 1,
                step=step,
                after="start" if step == 0 else "weight",
                rollouts_at=rollouts,
            ).finished(mean, 4)
        )
        rows = [{"item_id": f"q{i}", "rewards": [1.0 if i < solved else 0.0] * 4} for i in range(10)]
        for row in rows:
            store.append_jsonl(layout.eval_items_key(name, phase), row)
    last, top = evals[-1], evals[1]

    status = WhaleRunStatus(
        phase=RunPhase.SUCCEEDED,
        evals=evals,
        best=best_eval(top),
        final=best_eval(last),
        rollouts_spent=64,
        step=4,
        completed_phases=[layout.weight_phase_key(1)],
    )
    # four RSFT steps of 16 rollouts, 900 s each (a quarter hour): the spec's default pods hold 1 trainer GPU and a
    # 1-GPU vLLM server in a weight phase, so each step costs half a GPU-hour
    for step in range(1, 5):
        line = WeightStepMetrics(
            step=step,
            epoch=step / 4,
            reward_mean=0.5,
            acceptance_rate=0.5,
            kept=8,
            loss=1.0,
            learning_rate=1e-6,
            rollouts=16,
            seconds_sampling=600.0,
            seconds_training=300.0,
        )
        store.append_jsonl(layout.metrics_key(name, layout.weight_phase_key(1)), line.to_wire())
    store.write_json(layout.spec_key(name), spec.to_wire())
    store.write_json(layout.status_key(name), status.model_dump(mode="json", by_alias=True, exclude_none=True))


def fill(store) -> None:
    for run in RUNS:
        write_run(store, *run)


@pytest.fixture
def folder(tmp_path) -> Path:
    fill(open_store(str(tmp_path / "store")))
    return tmp_path / "store"


def invoke(*args: str, env: dict | None = None):
    return CliRunner().invoke(app, ["compare", *args], env=env)


def test_compare_groups_by_condition_and_a_spec_field_with_known_answers(folder, tmp_path):
    out = tmp_path / "out"
    res = invoke(
        str(folder),
        "--by",
        "harnessSearch.proposer.backend",
        "--items",
        "rsft-s1",
        "--items",
        "whale-s1",
        "--resamples",
        "999",
        "-o",
        "json",
        "-o",
        "html",
        "-o",
        "png",
        "--out",
        str(out),
    )
    assert res.exit_code == 0, res.output
    doc = json.loads((out / "compare.json").read_text())
    groups = {g["group"]: g for g in doc["groups"]}
    rsft = groups["rsft_only harnessSearch.proposer.backend=None"]
    assert rsft["runs"] == ["rsft-s1", "rsft-s2", "rsft-s3"] and rsft["seeds"] == [1, 2, 3]
    assert rsft["final"]["mean"] == pytest.approx(0.6) and rsft["best"]["mean"] == pytest.approx(0.7)
    assert rsft["pointsMin"] == rsft["pointsMax"] == 3
    whale = groups["whale harnessSearch.proposer.backend=replay"]
    assert whale["final"] == {"mean": pytest.approx(0.8), "lo": 0.8, "hi": 0.8, "n": 2, "confidence": 0.95}
    # groups in the order their first run is listed (the store lists runs by name)
    assert list(groups) == [
        "whale harnessSearch.proposer.backend=mutate",
        "rsft_only harnessSearch.proposer.backend=None",
        "whale harnessSearch.proposer.backend=replay",
    ]
    pairs = {(p["a"], p["b"]): p for p in doc["pairs"]}
    assert len(pairs) == 3
    p = pairs[("rsft_only harnessSearch.proposer.backend=None", "whale harnessSearch.proposer.backend=replay")]
    assert p["items"] == 10 and p["diff"] == pytest.approx(-0.2) and p["lo"] <= -0.2 <= p["hi"]
    # the per-item breakdown of the two chosen runs: q5..q7 solved by whale-s1 only
    items = doc["items"]
    assert (items["a"], items["b"], items["both"], items["onlyA"], items["onlyB"], items["neither"]) == (
        "rsft-s1",
        "whale-s1",
        5,
        0,
        3,
        2,
    )
    page = (out / "compare.html").read_text()
    assert '<table id="groups">' in page and '<table id="pairs">' in page and '<table id="per-item">' in page
    assert "60.00 [" in page  # rsft_only's final with its interval
    assert 'id="band-steps-rsft_only harnessSearch.proposer.backend=None"' in page  # the band over its seeds
    # GPU-hours: each evaluation after the training work done by its rollouts (2 steps: 1 GPU-hour; 4: 2)
    bands = {(b["axis"], b["group"]): b for b in doc["bands"]}
    assert bands[("gpu-hours", "rsft_only harnessSearch.proposer.backend=None")]["x"] == [0.0, 1.0, 2.0]
    assert bands[("hours", "rsft_only harnessSearch.proposer.backend=None")]["x"] == [0.0, 0.5, 1.0]
    assert 'id="band-gpu-hours-rsft_only harnessSearch.proposer.backend=None"' in page  # the figure's third panel
    assert (out / "compare.png").read_bytes().startswith(b"\x89PNG")
    assert "groups: mean over runs" in res.output


def test_compare_reads_an_s3_store(s3_server, tmp_path):
    uri = f"s3://whale-test/compare-{tmp_path.name}"
    fill(s3_server.store(uri))
    res = invoke(uri, "-o", "json", "--resamples", "999", "--out", str(tmp_path / "out"), env=s3_server.env())
    assert res.exit_code == 0, res.output
    doc = json.loads((tmp_path / "out" / "compare.json").read_text())
    assert [g["group"] for g in doc["groups"]] == ["whale", "rsft_only"]  # no --by: by condition only
    assert doc["groups"][0]["runs"] == ["mutate-s1", "whale-s1", "whale-s2"]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--items", "rsft-s1"], "--items: give exactly two runs"),
        (["--items", "rsft-s1", "--items", "nope"], "--items nope: not among the runs compared"),
        (["--confidence", "1.5"], "--confidence 1.5: give a level between 0 and 1"),
        (["-o", "pdf"], "choose from html, svg, png, json"),
    ],
)
def test_compare_refuses_bad_arguments_naming_them(folder, tmp_path, args, message):
    res = invoke(str(folder), *args, "--out", str(tmp_path / "o"))
    assert res.exit_code == 1 and message in res.output
