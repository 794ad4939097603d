"""The prepare workload on real domains and a real local store: what the operator's prepare Job runs."""

from __future__ import annotations

import subprocess
import sys

import pytest

from whale import plugins
from whale.core import layout
from whale.core.spec import WhaleRunSpec
from whale.store import open_store
from whale.workloads import prepare


def write_spec(store, run: str, domain: str, **data) -> WhaleRunSpec:
    spec = WhaleRunSpec.model_validate(
        {
            "domain": domain,
            "condition": "whale",
            "model": {"name": "synthetic-tiny"},
            "schedule": {"totalSteps": 2, "weightStepsPerCycle": 1},
            "data": data,
            "storage": {"uri": store.uri},
        }
    )
    store.write_json(layout.spec_key(run), spec.to_wire())
    return spec


def test_the_workload_process_writes_the_synthetic_split_sizes(tmp_path):
    store = open_store(f"file://{tmp_path / 'store'}")
    spec = write_spec(store, "syn", "synthetic", harnessSize=6)
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "whale.workloads",
            "prepare",
            "--store",
            store.uri,
            "--run",
            "syn",
            "--phase",
            "prepare",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    sizes = store.read_json(layout.split_sizes_key("syn"))
    assert sizes == plugins.load("synthetic").split_sizes(spec.experiment.data)
    assert sizes["harness"] == 6


def test_chess_splits_are_materialised_in_the_store_before_the_sizes(tmp_path):
    store = open_store(str(tmp_path / "store"))
    write_spec(store, "chess", "chess_puzzles", testSize=64)
    sizes = prepare.main(store, "chess", "prepare")
    assert store.read_json(layout.split_sizes_key("chess")) == sizes
    assert sizes["test"] == 64 and sizes["weight"] > 0 and sizes["harness"] > 0
    files = store.list(layout.data_prefix("chess_puzzles") + "/")
    assert any(f.endswith("/weight.jsonl") for f in files) and any(f.endswith("/manifest.json") for f in files)


def test_a_missing_spec_is_a_one_line_error_naming_the_key(tmp_path):
    store = open_store(f"file://{tmp_path / 'store'}")
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "whale.workloads",
            "prepare",
            "--store",
            store.uri,
            "--run",
            "nospec",
            "--phase",
            "prepare",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 1
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("prepare workload failed: PrepareError:") and "runs/nospec/spec.json" in last
    assert not store.exists(layout.split_sizes_key("nospec"))


def test_sizes_that_disagree_with_the_plugin_fail_before_anything_is_written(tmp_path):
    store = open_store(str(tmp_path / "store"))
    write_spec(store, "bad", "synthetic")
    real = plugins.load("synthetic")

    class Liar(type(real)):
        def load_split(self, split, data, store=None):
            return real.load_split(split, data, store)[:1]

    with pytest.raises(prepare.PrepareError, match="split_sizes\\(\\) says"):
        prepare.main(store, "bad", "prepare", domain=Liar())
    assert not store.exists(layout.split_sizes_key("bad"))


def test_preparing_a_judged_run_needs_no_judges_key_and_scoring_does(tmp_path, monkeypatch):
    """The prepare Job gets no judge's key (it scores nothing: whale_operator.builders.judge_key_env), so
    preparing a run with ``searchAnswer: llmJudge`` must not ask for one; the workloads that score still do."""
    from whale.domain import DomainError
    from whale.workloads.common import load_domain

    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    store = open_store(str(tmp_path / "store"))
    spec = write_spec(store, "judged", "search_qa")
    spec = spec.with_sections(domain_options={"searchAnswer": "llmJudge"})
    store.write_json(layout.spec_key("judged"), spec.to_wire())
    sizes = prepare.main(store, "judged")
    assert sizes == store.read_json(layout.split_sizes_key("judged")) and sizes["harness"] > 0
    with pytest.raises(DomainError, match=r"apiKeyEnv: \$OPENAI_API_KEY is not set"):
        load_domain(spec)
