"""`whale report` over real stores: the three conditions run by the local runner (simulated workloads), one
store each; the written figure and page must show one line per run and the values of each run's status."""

from __future__ import annotations

import json
import os
import re
import shutil
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tests.component.report_support import CONDITIONS, simulated_run
from tests.conftest import PLUGINS, ROOT
from whale.cli import app
from whale.core import layout
from whale.report.page import percent
from whale.store import open_store

pytest.importorskip("matplotlib")
SVG = "{http://www.w3.org/2000/svg}"


@pytest.fixture(scope="module")
def stores(tmp_path_factory) -> dict[str, tuple[Path, object]]:
    """{run name: (its store folder, its final status)}: rsft_only, mh_only and whale, each in its own store."""
    base = tmp_path_factory.mktemp("report-stores")
    with pytest.MonkeyPatch.context() as mp:  # the 'counting' test domain, for this process and the workloads
        mp.syspath_prepend(str(PLUGINS))
        mp.setenv("PYTHONPATH", os.pathsep.join([str(PLUGINS), str(ROOT), os.environ.get("PYTHONPATH", "")]))
        return {name: (base / name, simulated_run(base / name, name, base / "work" / name)) for name in CONDITIONS}


def invoke(*args: str, env: dict | None = None):
    return CliRunner().invoke(app, ["report", *args], env=env)


def svg_groups(path: Path) -> dict[str, ET.Element]:
    return {str(g.get("id")): g for g in ET.parse(path).getroot().iter(f"{SVG}g") if g.get("id")}


def test_report_of_the_three_conditions_draws_each_run_and_tables_its_status(stores, tmp_path):
    out = tmp_path / "out"
    res = invoke(
        *(str(d) for d, _ in stores.values()), "-o", "html", "-o", "svg", "-o", "png", "-o", "json", "--out", str(out)
    )
    assert res.exit_code == 0, res.output
    assert {p.name for p in out.iterdir()} == {
        "report.html",
        "report.json",
        "mean_at_k.svg",
        "mean_at_k.png",
        "training.svg",
        "training.png",
    }

    groups = svg_groups(out / "mean_at_k.svg")
    text = (out / "mean_at_k.svg").read_text()
    for label in ("training rollouts spent", "global RSFT step", "test mean@8 (%)"):
        assert label in text
    for name, (_, status) in stores.items():
        finished = [e for e in status.evals if e.mean_at_k is not None]
        for axis in ("rollouts", "steps"):
            line = groups[f"mean-{axis}-{name}"]
            # one marker per finished evaluation of the run, no more
            assert len(line.findall(f".//{SVG}use")) == len(finished), (name, axis)
            assert f"best-{axis}-{name}" in groups
        assert {p for p in status.completed_phases} == {
            g.rsplit(f"phase-rollouts-{name}-", 1)[1] for g in groups if g.startswith(f"phase-rollouts-{name}-")
        }
    training = svg_groups(out / "training.svg")
    assert {"reward-sim-rsft-only", "reward-sim-whale", "harness-sim-mh-only", "harness-sim-whale"} <= set(training)
    assert "reward-sim-mh-only" not in training  # harness-only trains no weights
    assert (out / "mean_at_k.png").read_bytes().startswith(b"\x89PNG")

    page = (out / "report.html").read_text()
    assert page.count("<svg") == 2 and "<script" not in page
    assert not re.search(r"""(src|href)=["']?(https?:)?//""", page)
    for name, (_, status) in stores.items():
        row = re.search(rf'<tr data-run="{name}">(.*?)</tr>', page).group(1)
        cells = dict(re.findall(r'<td data-field="(\w+)"[^>]*>(.*?)</td>', row))
        assert cells["best"] == percent(status.best.mean_at_k)
        assert cells["rolloutsAtBest"] == f"{status.best.rollouts_at:,}"
        assert cells["rolloutsSpent"] == f"{status.rollouts_spent:,}"
        assert cells["status"] == "Succeeded" and cells["condition"] == CONDITIONS[name]["condition"]
        assert status.best.phase in cells["where"]
        # the headline both ways: the final point of every run, beside its best
        assert cells["final"] == percent(status.final.mean_at_k) and status.final.phase in cells["finalWhere"]

    doc = json.loads((out / "report.json").read_text())
    by_name = {r["name"]: r for r in doc["runs"]}
    for name, (_, status) in stores.items():
        r = by_name[name]
        assert r["best"]["meanAtK"] == status.best.mean_at_k and r["best"]["rollouts"] == status.best.rollouts_at
        assert [(e["phase"], e["rollouts"], e["meanAtK"]) for e in r["evals"]] == sorted(
            [(e.phase, e.rollouts_at, e.mean_at_k) for e in status.evals], key=lambda t: (t[1], t[0])
        )
        assert r["rolloutsSpent"] == status.rollouts_spent and r["statusSource"] == "status"


def test_harness_only_is_evaluated_at_every_accepted_harness(stores):
    """mh_only's 3 proposer iterations after the incoming: the simulated search accepts a new candidate at
    iterations 2 and 3 (its best score rises until 3), so the run evaluates both, each from its archive
    file, and ends at the last one; iteration 4 changes nothing and costs no evaluation."""
    _, status = stores["sim-mh-only"]
    assert [(e.phase, e.iteration) for e in status.evals] == [
        ("eval-c00-s000000-start", None),
        ("eval-c01-s000000-harness-i0002", 2),
        ("eval-c01-s000000-harness-i0003", 3),
    ]
    archive = layout.archive_prefix("sim-mh-only", 1)
    assert [e.harness for e in status.evals[1:]] == [
        f"{archive}/candidates/i02-c1/harness.py",
        f"{archive}/candidates/i03-c1/harness.py",
    ]
    assert [e.rollouts_at for e in status.evals] == [0, 8, 12]  # 4 rollouts per simulated iteration
    assert status.final.phase == "eval-c01-s000000-harness-i0003" and status.final.iteration == 3
    assert "final mean@8" in status.message


def test_json_alone_goes_to_stdout_and_run_selection(stores):
    whale_dir = stores["sim-whale"][0]
    res = invoke(str(whale_dir), "-o", "json")
    assert res.exit_code == 0, res.output
    assert [r["name"] for r in json.loads(res.stdout)["runs"]] == ["sim-whale"]
    # a run named by its folder, and --run over several stores
    res = invoke(str(whale_dir / "runs" / "sim-whale"), "-o", "json")
    assert json.loads(res.stdout)["runs"][0]["name"] == "sim-whale"
    res = invoke(*(str(d) for d, _ in stores.values()), "--run", "sim-mh-only", "-o", "json")
    assert [r["name"] for r in json.loads(res.stdout)["runs"]] == ["sim-mh-only"]
    # the runs in the order of --run, not of the stores or the alphabet
    order = ["sim-whale", "sim-rsft-only", "sim-mh-only"]
    res = invoke(*(str(d) for d, _ in stores.values()), *(x for name in order for x in ("--run", name)), "-o", "json")
    assert [r["name"] for r in json.loads(res.stdout)["runs"]] == order


def test_a_store_without_status_json_is_reconstructed_to_the_same_values(stores, tmp_path):
    """A cluster run keeps its status on the WhaleRun object: the report rebuilds it from the phase results."""
    src, status = stores["sim-whale"]
    copy = tmp_path / "cluster-store"
    shutil.copytree(src, copy)
    (copy / layout.status_key("sim-whale")).unlink()
    res = invoke(str(copy), "-o", "json")
    assert res.exit_code == 0, res.output
    run = json.loads(res.stdout)["runs"][0]
    assert run["statusSource"] == "store" and run["runPhase"] is None
    assert [(e["phase"], e["rollouts"], e["meanAtK"]) for e in run["evals"]] == sorted(
        [(e.phase, e.rollouts_at, e.mean_at_k) for e in status.evals], key=lambda t: (t[1], t[0])
    )
    assert (run["best"]["phase"], run["best"]["rollouts"], run["best"]["meanAtK"]) == (
        status.best.phase,
        status.best.rollouts_at,
        status.best.mean_at_k,
    )
    assert run["rolloutsSpent"] == status.rollouts_spent


def test_report_reads_an_s3_store(stores, s3_server, tmp_path):
    src, status = stores["sim-rsft-only"]
    local = open_store(str(src))
    uri = f"s3://whale-test/report-{tmp_path.name}"
    s3 = s3_server.store(uri)
    for key in local.list(layout.run_prefix("sim-rsft-only")):
        s3.write_bytes(key, local.read_bytes(key))
    res = invoke(uri, "-o", "html", "--out", str(tmp_path / "out"), env=s3_server.env())
    assert res.exit_code == 0, res.output
    page = (tmp_path / "out" / "report.html").read_text()
    assert '<tr data-run="sim-rsft-only">' in page and percent(status.best.mean_at_k) in page


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["{missing}"], "no such folder"),
        (["{empty}"], "no runs in"),
        (["{whale}", "--run", "nope"], "--run nope: not found"),
        (["{whale}/runs/nope"], "no run named 'nope'"),
        (["{whale}", "-o", "pdf"], "choose from html, svg, png, json"),
        (["{whale}", "--export", "comet"], "choose from tensorboard, wandb, mlflow"),
        (["{corrupt}"], "is not a valid WhaleRunStatus: phase"),
    ],
)
def test_bad_input_is_one_clear_line_not_a_traceback(stores, tmp_path, args, message):
    corrupt = tmp_path / "corrupt"
    shutil.copytree(stores["sim-whale"][0], corrupt)
    (corrupt / layout.status_key("sim-whale")).write_text('{"phase": "Exploded"}')
    (tmp_path / "empty").mkdir()
    paths = {
        "missing": tmp_path / "missing",
        "empty": tmp_path / "empty",
        "whale": stores["sim-whale"][0],
        "corrupt": corrupt,
    }
    res = invoke(*(a.format(**paths) for a in args))
    assert res.exit_code == 1
    assert message in res.output and "Traceback" not in res.output
    assert not (tmp_path / "missing").exists()  # reading never creates a store


def test_harness_only_without_status_json_is_reconstructed_to_the_same_values(stores, tmp_path):
    """The iteration points of a cluster mh_only run: rollouts from the end of their iteration, the final
    point the last of them."""
    src, status = stores["sim-mh-only"]
    copy = tmp_path / "cluster-mh-store"
    shutil.copytree(src, copy)
    (copy / layout.status_key("sim-mh-only")).unlink()
    res = invoke(str(copy), "-o", "json")
    assert res.exit_code == 0, res.output
    run = json.loads(res.stdout)["runs"][0]
    assert [(e["phase"], e["rollouts"], e["iteration"]) for e in run["evals"]] == [
        (e.phase, e.rollouts_at, e.iteration) for e in status.evals
    ]
    assert (run["final"]["phase"], run["final"]["meanAtK"]) == (status.final.phase, status.final.mean_at_k)
    assert (run["best"]["phase"], run["best"]["meanAtK"]) == (status.best.phase, status.best.mean_at_k)
