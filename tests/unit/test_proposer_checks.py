"""A proposer that cannot run is refused by `whale validate` and `whale run` before anything starts,
naming the field: no model / endpoint / key Secret (the manifest), an unset key variable (this machine)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from whale.cli import app
from whale.core.convert import convert_v1alpha1

cli = CliRunner()

MH = {"domain": "counting", "condition": "mh_only", "model": {"name": "tiny"}}


@pytest.fixture(autouse=True)
def _plugin(counting_domain):
    return counting_domain


def write(tmp_path: Path, proposer: dict) -> Path:
    path = tmp_path / "run.yaml"
    spec = {**MH, "harnessSearch": {"proposer": proposer}}
    path.write_text(
        yaml.safe_dump(
            convert_v1alpha1(
                {"apiVersion": "whale.dev/v1alpha1", "kind": "WhaleRun", "metadata": {"name": "mh"}, "spec": spec}
            )
        )
    )
    return path


def test_validate_refuses_an_api_proposer_without_its_model_endpoint_or_key(tmp_path: Path):
    res = cli.invoke(app, ["validate", str(write(tmp_path, {"backend": "anthropic"}))])
    assert res.exit_code == 1 and "2 problem(s)" in res.output
    assert "spec.experiment.harnessSearch.proposer.model: backend anthropic needs the model" in res.output
    assert "spec.experiment.harnessSearch.proposer.apiKeySecret: backend anthropic needs the API key" in res.output
    res = cli.invoke(app, ["validate", str(write(tmp_path, {"backend": "openai", "model": "m"}))])
    assert (
        res.exit_code == 1
        and "spec.experiment.harnessSearch.proposer.baseUrl: backend openai needs the endpoint" in res.output
    )
    assert "Traceback" not in res.output
    good = {"backend": "anthropic", "model": "claude-opus-4-1", "apiKeySecret": {"name": "p", "key": "k"}}
    res = cli.invoke(app, ["validate", str(write(tmp_path, good))])
    assert res.exit_code == 0, res.output  # validate reads the manifest only: the key is the cluster's business


def test_run_refuses_an_unset_key_variable_before_any_phase(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    proposer = {
        "backend": "anthropic",
        "model": "claude-opus-4-1",
        "apiKeySecret": {"name": "p", "key": "k", "env": "ANTHROPIC_API_KEY"},
    }
    store = tmp_path / "store"
    res = cli.invoke(app, ["run", str(write(tmp_path, proposer)), "--store", str(store)])
    assert res.exit_code == 1
    assert (
        "spec.experiment.harnessSearch.proposer.apiKeySecret.env: environment variable ANTHROPIC_API_KEY is not set"
        in res.output
    )
    assert not store.exists() or not any(store.rglob("*.json"))  # nothing was started, nothing written
