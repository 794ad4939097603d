"""The CLI is a shell over the library: exit codes, messages and JSON shapes."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from tests.fixtures.bounds import RUN_BOUND_S
from whale.cli import app
from whale.core.convert import convert_v1alpha1

cli = CliRunner()


def write(tmp_path: Path, spec: dict, name: str = "tiny") -> Path:
    path = tmp_path / f"{name}.yaml"
    path.write_text(
        yaml.safe_dump(
            convert_v1alpha1(
                {"apiVersion": "whale.dev/v1alpha1", "kind": "WhaleRun", "metadata": {"name": name}, "spec": spec}
            )
        )
    )
    return path


WHALE = {
    "domain": "counting",
    "condition": "whale",
    "model": {"name": "tiny"},
    "schedule": {"totalEpochs": 1, "weightEpochsPerCycle": 0.4, "harnessIterationsPerCycle": 2},
    "evaluation": {"intervalEpochs": 0.5},
    "harnessSearch": {"proposer": {"baseUrl": "http://127.0.0.1:8000/v1", "model": "local-proposer"}},
}


@pytest.fixture(autouse=True)
def _plugin(counting_domain):
    return counting_domain


def test_validate_ok_prints_one_line(tmp_path):
    res = cli.invoke(app, ["validate", str(write(tmp_path, WHALE))])
    assert res.exit_code == 0, res.output
    assert res.output.strip().splitlines() == [
        "ok: WhaleRun tiny (counting, whale): 10 steps/epoch, 10 steps, E=4; 5 phases, <= 20536 rollouts"
    ]


def test_validate_lists_every_problem(tmp_path):
    bad = {**WHALE, "condition": "sometimes", "domain": "nochess", "rsft": {"rolloutsPerPrompt": 0}}
    res = cli.invoke(app, ["validate", str(write(tmp_path, bad))])
    assert res.exit_code == 1
    out = res.output
    assert "3 problem(s)" in out
    assert "spec.condition: must be one of" in out and "spec.domain: unknown domain 'nochess'" in out
    assert "spec.experiment.rsft.rolloutsPerPrompt" in out
    assert "Traceback" not in out


def test_validate_schedule_against_the_data(tmp_path):
    spec = {**WHALE, "schedule": {"totalEpochs": 1, "weightEpochsPerCycle": 2}}
    res = cli.invoke(app, ["validate", str(write(tmp_path, spec))])
    assert res.exit_code == 1
    assert (
        "spec.experiment.schedule.weightEpochsPerCycle: E = 20 steps is larger than the total budget of 10 steps"
        in res.output
    )


def test_validate_missing_file_and_bad_yaml(tmp_path):
    res = cli.invoke(app, ["validate", str(tmp_path / "nope.yaml")])
    assert res.exit_code == 1 and "cannot read the file" in res.output
    (tmp_path / "bad.yaml").write_text("spec: [unclosed")
    res = cli.invoke(app, ["validate", str(tmp_path / "bad.yaml")])
    assert res.exit_code == 1 and "not valid YAML" in res.output


def test_plan_json_shape(tmp_path):
    res = cli.invoke(app, ["plan", str(write(tmp_path, WHALE)), "-o", "json"])
    assert res.exit_code == 0, res.output
    p = json.loads(res.output)
    assert (p["stepsPerEpoch"], p["totalSteps"]) == (10, 10)
    main = [ph for ph in p["phases"] if ph["kind"] != "eval"]
    # each phase's rollouts: steps x 256 prompts x 8; a harness phase: incoming 4 items + 1 iteration x 3 x (4 smoke + 4 items)
    assert main == [
        {"cycle": 1, "kind": "weight", "fromStep": 0, "toStep": 4, "rollouts": 4 * 256 * 8},
        {"cycle": 1, "kind": "harness", "iterations": 2, "proposerIterations": 1, "rollouts": 4 + 3 * 8},
        {"cycle": 2, "kind": "weight", "fromStep": 4, "toStep": 8, "rollouts": 4 * 256 * 8},
        {"cycle": 2, "kind": "harness", "iterations": 2, "proposerIterations": 1, "rollouts": 4 + 3 * 8},
        {"cycle": 3, "kind": "weight", "fromStep": 8, "toStep": 10, "rollouts": 2 * 256 * 8},
    ]
    assert p["rollouts"] == 10 * 256 * 8 + 2 * (4 + 3 * 8) == sum(ph["rollouts"] for ph in main)
    evals = [(ph["step"], ph["after"], ph["rollouts"]) for ph in p["phases"] if ph["kind"] == "eval"]
    # every evaluation: the 10 test items x 8 samples
    assert evals == [
        (0, "start", 80),
        (4, "weight", 80),
        (4, "harness", 80),
        (5, "weight", 80),
        (8, "weight", 80),
        (8, "harness", 80),
        (10, "weight", 80),
    ]
    assert p["evaluation"] == {"count": 7, "items": 10, "samplesPerItem": 8, "rolloutsEach": 80, "rollouts": 560}


def test_plan_table_shows_each_phase_rollouts_and_the_evaluation_cost(tmp_path):
    spec = {**WHALE, "evaluation": {"intervalEpochs": 0.5, "maxItems": 4, "samplesPerItem": 2}}
    res = cli.invoke(app, ["plan", str(write(tmp_path, spec))], env={"COLUMNS": "200"})
    assert res.exit_code == 0, res.output
    assert "8,192" in res.output and "4,096" in res.output  # the weight phases of 4 and 2 steps
    assert "evaluation: 7 point(s) x 4 items x 2 samples = 8 rollouts each, 56 in all" in res.output


def test_plan_adaptive_marks_bounds(tmp_path):
    spec = {**WHALE, "condition": "adaptive_whale", "schedule": {"totalEpochs": 1}}
    res = cli.invoke(app, ["plan", str(write(tmp_path, spec)), "-o", "json"])
    p = json.loads(res.output)
    assert p["rolloutsUpperBound"] is True
    first = p["phases"][1]
    assert first["kind"] == "weight" and first["upperBound"] and first["minSteps"] == 3  # 0.2 epoch = 2 steps
    res = cli.invoke(app, ["plan", str(write(tmp_path, spec))])
    assert res.exit_code == 0 and "ends by patience" in res.output


def test_plan_summarises_a_long_run(tmp_path):
    """A run with more entries than the plan lists: the first and last ones, a marker, and the counts."""
    spec = {**WHALE, "condition": "rsft_only", "schedule": {"totalSteps": 10_000}, "evaluation": {"intervalSteps": 10}}
    res = cli.invoke(app, ["plan", str(write(tmp_path, spec)), "-o", "json"])
    assert res.exit_code == 0, res.output
    p = json.loads(res.output)
    assert len(p["phases"]) == 200 and p["phasesOmitted"] == 802
    assert p["counts"] == {"weight": 1, "harness": 0, "eval": 1001}
    res = cli.invoke(app, ["plan", str(write(tmp_path, spec))])
    assert res.exit_code == 0, res.output
    assert "802 more" in res.output and "1 weight, 0 harness and 1001 eval phases" in res.output
    assert "at step 10000" in res.output and "at step 5000" not in res.output


def test_validate_and_plan_at_the_largest_budget(tmp_path):
    spec = {
        **WHALE,
        "condition": "rsft_only",
        "schedule": {"totalSteps": 1_000_000},
        "evaluation": {"intervalSteps": 1000},
    }
    res = cli.invoke(app, ["validate", str(write(tmp_path, spec))])
    assert res.exit_code == 0, res.output
    assert "1000000 steps; 1 phases" in res.output
    res = cli.invoke(app, ["plan", str(write(tmp_path, spec)), "-o", "json"])
    assert res.exit_code == 0 and len(res.output) < 64 * 1024


def test_validate_refuses_evaluating_every_step_of_a_large_budget(tmp_path):
    spec = {
        **WHALE,
        "condition": "rsft_only",
        "schedule": {"totalSteps": 1_000_000},
        "evaluation": {"intervalSteps": 1},
    }
    for command in ("validate", "plan"):
        res = cli.invoke(app, [command, str(write(tmp_path, spec))])
        assert res.exit_code == 1 and isinstance(res.exception, SystemExit)
        assert (
            "spec.experiment.evaluation.intervalSteps: an evaluation every 1 step(s) over 1000000 steps" in res.output
        )


def test_validate_prints_a_file_name_with_brackets_as_it_is(tmp_path):
    bad = tmp_path / "[red]run[bold].yaml"
    bad.write_text("spec: [unclosed")
    res = cli.invoke(app, ["validate", str(bad)])
    assert res.exit_code == 1 and "[red]run[bold].yaml: 1 problem(s)" in res.output


@pytest.mark.timeout(RUN_BOUND_S + 60)
def test_status_after_a_run(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    from whale.core.spec import WhaleRunSpec
    from whale.runner.local import LocalRunner
    from whale.store import open_store

    spec = WhaleRunSpec.model_validate({**WHALE, "condition": "rsft_only", "schedule": {"totalSteps": 2}})
    LocalRunner(
        name="tiny",
        spec=spec,
        store=open_store("st"),
        split_sizes={"weight": 2560, "harness": 4},
        workdir=tmp_path / "w",
        workload_command=(sys.executable, "-m", "tests.workloads.simulated"),
        poll_interval_s=0.05,
    ).run(max_seconds=RUN_BOUND_S)
    res = cli.invoke(app, ["status", "tiny", "--store", "st", "-o", "json"])
    assert res.exit_code == 0, res.output
    st = json.loads(res.output)
    assert st["phase"] == "Succeeded" and st["checkpointStep"] == 2 and st["best"]["meanAtK"] == 0.02
    res = cli.invoke(app, ["status", "tiny", "--store", "st"])
    assert res.exit_code == 0 and "Succeeded" in res.output and "eval-c01-s000002-weight" in res.output
    res = cli.invoke(app, ["status", "ghost", "--store", "st"])
    assert res.exit_code == 1 and "no run named 'ghost'" in res.output


def test_crd_check(tmp_path):
    committed = Path(__file__).resolve().parents[2] / "chart" / "crds" / "whaleruns.yaml"
    assert cli.invoke(app, ["crd", "--check", str(committed)]).exit_code == 0
    stale = tmp_path / "crd.yaml"
    stale.write_text("old")
    res = cli.invoke(app, ["crd", "--check", str(stale)])
    assert res.exit_code == 1 and "whale crd >" in res.output


def test_replay_rejects_unknown_domain(tmp_path):
    item = tmp_path / "item.json"
    item.write_text("{}")
    res = cli.invoke(app, ["replay", "nodomain", "--item", str(item), "--", "hello"])
    assert res.exit_code == 1 and "unknown domain 'nodomain'" in res.output


def test_core_cli_imports_no_heavy_engines():
    code = (
        "import sys, whale.cli, whale.core.alternation, whale.core.schedule, whale.runner.local, whale_operator.crd;"
        "print([m for m in ('torch', 'transformers', 'kopf', 'vllm', 'deepspeed') if m in sys.modules])"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.strip() == "[]"


def test_help_runs_as_a_program():
    out = subprocess.run([sys.executable, "-m", "whale.cli", "--help"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0
    for command in ("validate", "plan", "run", "status", "replay", "crd"):
        assert command in out.stdout


def test_run_command_end_to_end(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("WHALE_WORKLOAD_COMMAND", f"{sys.executable} -m tests.workloads.simulated")
    manifest = write(
        tmp_path, {**WHALE, "schedule": {"totalSteps": 4, "weightStepsPerCycle": 2, "harnessIterationsPerCycle": 2}}
    )
    res = cli.invoke(app, ["run", str(manifest), "--store", "st", "--timeout", "90"], env={"COLUMNS": "200"})
    assert res.exit_code == 0, res.output
    out = res.output
    # not a terminal: one timestamped line per event
    stamped = [line for line in out.splitlines() if re.match(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ ", line)]
    assert any(line.endswith("c02-weight started (attempt 1): steps 2 -> 4, harness c01-accepted") for line in stamped)
    assert any("c01-harness done: accepted c01-accepted, score 0.200" in line for line in stamped)
    assert stamped[-1].endswith(
        "run tiny: Succeeded (schedule complete; best mean@8 0.0700 at eval-c01-s000002-harness; "
        "final mean@8 0.0400 at eval-c02-s000004-weight)"
    )
    # the end of the run: the evaluation table, the best point, the accepted harness's URI, the next commands
    assert "run tiny Succeeded after" in out and "evaluations" in out
    assert re.search(r"eval-c01-s000002-harness\s.*\s2\s.*c01-accepted\s.*\s40\s.*0\.0700 \*", out), out
    assert "best: mean@8 0.0700 at eval-c01-s000002-harness (step 2, harness c01-accepted, 40 training rollouts)" in out
    assert f"accepted harness: file://{tmp_path}/st/runs/tiny/harnesses/c01-accepted.py" in out
    assert "whale status tiny --store st" in out and "whale report st/runs/tiny" in out
    assert (tmp_path / "st" / "runs" / "tiny" / "status.json").exists()
    # running it again is a no-op on a finished run; -o json prints the summary for scripts
    res = cli.invoke(app, ["run", str(manifest), "--store", "st", "--timeout", "30", "-o", "json"])
    assert res.exit_code == 0 and json.loads(res.stdout)["phase"] == "Succeeded"


def test_run_retry_resumes_a_failed_run(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("WHALE_WORKLOAD_COMMAND", f"{sys.executable} -m tests.workloads.simulated")
    monkeypatch.setenv("WHALE_SIM", json.dumps({"fail": {"c01-weight": 9}}))
    manifest = write(
        tmp_path, {**WHALE, "condition": "rsft_only", "schedule": {"totalSteps": 2}, "retry": {"maxAttempts": 1}}
    )
    res = cli.invoke(app, ["run", str(manifest), "--store", "st", "--timeout", "60"])
    assert res.exit_code == 1 and "run tiny Failed after" in res.output
    assert "c01-weight attempt 1 failed: phase c01-weight failed 1 time(s)" in res.output
    assert "whale logs tiny --store st --phase c01-weight" in res.output  # the next commands
    assert f"`whale run {manifest} --store st --retry` resumes it" in res.output
    res = cli.invoke(app, ["status", "tiny", "--store", "st"])
    assert res.exit_code == 0 and "runner" in res.output and "none" in res.output

    monkeypatch.setenv("WHALE_SIM", "{}")  # the cause is fixed
    res = cli.invoke(app, ["run", str(manifest), "--store", "st", "--timeout", "60", "--retry"])
    assert res.exit_code == 0, res.output
    assert "run tiny Succeeded" in res.output
    status = json.loads(cli.invoke(app, ["status", "tiny", "--store", "st", "-o", "json"]).output)
    assert status["attempts"]["c01-weight"] == 2 and "c01-weight" not in status["failures"]


def test_a_timeout_exits_with_its_own_code_and_is_resumable(tmp_path, monkeypatch):
    from whale.cli import EXIT_TIMEOUT

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("WHALE_WORKLOAD_COMMAND", f"{sys.executable} -m tests.workloads.simulated")
    monkeypatch.setenv("WHALE_SIM", json.dumps({"hang": {"c01-weight": 1}}))
    manifest = write(tmp_path, {**WHALE, "condition": "rsft_only", "schedule": {"totalSteps": 2}})
    res = cli.invoke(app, ["run", str(manifest), "--store", "st", "--timeout", "2"])
    assert res.exit_code == EXIT_TIMEOUT == 124, res.output
    assert "did not finish within 2 s" in res.output and f"whale run {manifest} --store st" in res.output
    status = json.loads(cli.invoke(app, ["status", "tiny", "--store", "st", "-o", "json"]).output)
    assert status["phase"] == "Interrupted"


def test_help_shows_no_value_type_for_flags():
    """typer labels every flag `<bool>`: a flag takes no value, so -h shows none (options that take one keep it)."""
    for command in ([], ["run"], ["validate"], ["report"], ["prepare"], ["logs"]):
        res = cli.invoke(app, [*command, "-h"], env={"COLUMNS": "200"})
        assert res.exit_code == 0 and "<bool>" not in res.output, (command, res.output)
    assert "<float>" in cli.invoke(app, ["run", "-h"], env={"COLUMNS": "200"}).output


def test_piped_tables_are_not_cut_at_80_columns_and_commands_name_whale_as_invoked():
    code = (
        "from rich.table import Table; from whale.console.streams import cli_console;"
        "t = Table(); [t.add_column(c) for c in 'abc']; t.add_row(*['x' * 60] * 3); cli_console().print(t)"
    )
    env = {k: v for k, v in os.environ.items() if k != "COLUMNS"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=env, check=True)
    assert ("x" * 60 + " ") in out.stdout and max(len(line) for line in out.stdout.splitlines()) > 180
    from whale.console.streams import invoked_as

    assert invoked_as(".venv/bin/whale") == ".venv/bin/whale"
    assert invoked_as("/usr/local/bin/whale") == "/usr/local/bin/whale"
    assert invoked_as("/repo/whale/cli.py") == invoked_as("") == "whale"


def test_delete_asks_first_refuses_while_the_run_runs_and_keeps_the_shared_data(tmp_path, monkeypatch):
    from whale.core import layout
    from whale.store import open_store
    from whale.store.lease import this_process

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("WHALE_WORKLOAD_COMMAND", f"{sys.executable} -m tests.workloads.simulated")
    manifest = write(tmp_path, {**WHALE, "condition": "rsft_only", "schedule": {"totalSteps": 2}})
    assert cli.invoke(app, ["run", str(manifest), "--store", "st", "--timeout", "60"]).exit_code == 0
    (tmp_path / "st" / "data" / "counting").mkdir(parents=True)
    (tmp_path / "st" / "data" / "counting" / "splits.json").write_text("{}")  # prepared data, shared by runs
    run_dir = tmp_path / "st" / "runs" / "tiny"
    objects = sum(1 for p in run_dir.rglob("*") if p.is_file())
    # `whale list` shows what the run takes in the store
    (row,) = json.loads(cli.invoke(app, ["list", "--store", "st", "-o", "json"]).output)["runs"]
    assert row["diskBytes"] == sum(p.stat().st_size for p in run_dir.rglob("*") if p.is_file()) > 0
    from whale.console.runs import size_words

    assert size_words(row["diskBytes"]) in cli.invoke(app, ["list", "--store", "st"], env={"COLUMNS": "200"}).output
    assert [size_words(n) for n in (None, 812, 4_200_000, 5_100_000_000)] == ["-", "812 B", "4.2 MB", "5.1 GB"]

    res = cli.invoke(app, ["delete", "tiny", "--store", "st"], input="n\n")
    assert res.exit_code == 1 and f"delete run tiny: {objects} objects under file://{run_dir}/?" in res.output
    assert "nothing deleted" in res.output and (run_dir / "status.json").is_file()

    store = open_store("st")  # a runner holds the run: refused, naming it, nothing deleted
    lease = store.acquire_lease(layout.lock_key("tiny"), this_process("whale run tiny"), 60.0)
    try:
        res = cli.invoke(app, ["delete", "tiny", "--store", "st", "--yes"])
    finally:
        lease.release()
    assert res.exit_code == 1 and "is being run now by pid" in res.output and "whale stop tiny" in res.output
    assert (run_dir / "status.json").is_file()

    res = cli.invoke(app, ["delete", "tiny", "--store", "st"], input="y\n")
    assert res.exit_code == 0 and f"deleted run tiny: {objects} objects" in res.output, res.output
    assert not [p for p in run_dir.rglob("*") if p.is_file()]
    assert (tmp_path / "st" / "data" / "counting" / "splits.json").is_file()
    res = cli.invoke(app, ["delete", "tiny", "--store", "st", "--yes"])
    assert res.exit_code == 1 and "no run named 'tiny'" in res.output


def test_validate_warns_that_a_queue_does_not_count_colocated_gpus_unmapped(tmp_path):
    """Issue #29 item 5: colocated GPUs are a DRA claim; Kueue counts it only with a DeviceClass mapping."""
    queued = {**WHALE, "cluster": {"queueName": "team-a"}}
    colocated = {**queued, "inference": {"placement": "colocated"}}
    res = cli.invoke(app, ["validate", str(write(tmp_path, colocated))])
    assert res.exit_code == 0, res.output
    assert "warning: spec.cluster.queueName with spec.execution.inference.placement colocated" in res.output
    assert "resources.deviceClassMappings" in res.output
    for quiet in (queued, {**WHALE, "inference": {"placement": "colocated"}}):
        res = cli.invoke(app, ["validate", str(write(tmp_path, quiet))])
        assert res.exit_code == 0 and "deviceClassMappings" not in res.output, res.output


def test_validate_checks_the_cluster_section_with_the_operators_model(tmp_path):
    """The core keeps spec.cluster opaque; `whale validate` checks it with whale_operator.cluster_spec, naming the
    field and the fix (the cross-field rule with execution too)."""
    bad = {**WHALE, "cluster": {"tolerations": [{"operator": "Equal", "value": "x"}], "queueName": "Team A"}}
    res = cli.invoke(app, ["validate", str(write(tmp_path, bad))])
    assert res.exit_code == 1, res.output
    assert "spec.cluster.tolerations[0]: a toleration without a key must have operator Exists" in res.output
    assert "spec.cluster.queueName: must be a Kubernetes object name" in res.output
    jobset = {**WHALE, "cluster": {"admission": "jobSet"}, "inference": {"placement": "colocated"}}
    res = cli.invoke(app, ["validate", str(write(tmp_path, jobset))])
    assert res.exit_code == 1 and "cluster.admission: jobSet puts each phase's own vLLM server" in res.output
