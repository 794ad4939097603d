"""Opt-in (--run-e2e; needs the internet, ~1 GB of downloads): `whale prepare` of the paper manifests
fetches the real files, verifies them and writes the paper-sized splits."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from whale.cli import app

EXAMPLES = Path(__file__).resolve().parents[2] / "manifests" / "examples"
PAPER_SIZES = {
    "math-rsft": {"weight": 17_917, "harness": 256, "test": 60},
    "chess-rsft": {"weight": 16_384, "harness": 256, "test": 256},
    "searchqa-rsft": {"weight": 18_946, "harness": 256, "test": 700},
}


@pytest.mark.e2e
@pytest.mark.timeout(3 * 3600)
@pytest.mark.parametrize("run", sorted(PAPER_SIZES))
def test_whale_prepare_downloads_the_real_data_and_writes_the_papers_splits(run, tmp_path):
    argv = [
        "prepare",
        str(EXAMPLES / f"{run}.yaml"),
        "--store",
        str(tmp_path / "st"),
        "--cache-dir",
        str(tmp_path / "cache"),
        "--splits-only",
        "-o",
        "json",
    ]
    res = CliRunner().invoke(app, argv)
    assert res.exit_code == 0, res.output
    out = json.loads(res.output)
    assert out["sizes"] == PAPER_SIZES[run]
    assert all(s["action"] == "fetched" for s in out["sources"])
    again = json.loads(CliRunner().invoke(app, argv).output)
    assert all(s["action"] == "reused" for s in again["sources"])
