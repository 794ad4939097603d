"""The local runner end to end: real subprocess workloads (the simulated double), a real store."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from tests.fixtures.bounds import RUN_BOUND_S, RUN_TEST_TIMEOUT_S
from tests.fixtures.specs import flat
from whale.core import layout
from whale.core.spec import WhaleRunSpec
from whale.core.status import RunPhase, WhaleRunStatus
from whale.runner.local import (
    MAX_LISTED_CHANGES,
    LocalRunner,
    RunConflictError,
    RunLockedError,
    RunTimeout,
    conflict_message,
    spec_changes,
)
from whale.store import open_store
from whale.store.lease import this_process

SIM = (sys.executable, "-m", "tests.workloads.simulated")
SIZES = {"weight": 2560, "harness": 4, "test": 10}

pytestmark = pytest.mark.timeout(RUN_TEST_TIMEOUT_S)


def spec_of(condition: str = "whale", **schedule) -> WhaleRunSpec:
    schedule = schedule or {"totalSteps": 6, "weightStepsPerCycle": 3, "harnessIterationsPerCycle": 2}
    return WhaleRunSpec.model_validate(
        {
            "domain": "counting",
            "condition": condition,
            "model": {"name": "tiny"},
            "schedule": schedule,
            "evaluation": {"intervalSteps": 2},
            "retry": {"maxAttempts": 2},
        }
    )


def runner(tmp_path: Path, spec: WhaleRunSpec, store=None, sim: dict | None = None, name: str = "r1", **kw):
    store = store or open_store(str(tmp_path / "store"))
    env = {"WHALE_SIM": json.dumps(sim or {})}
    return LocalRunner(
        name=name,
        spec=spec,
        store=store,
        split_sizes=kw.pop("split_sizes", SIZES),
        workdir=tmp_path / "work",
        workload_command=SIM,
        env=env,
        poll_interval_s=0.05,
        **kw,
    )


@pytest.fixture(autouse=True)
def _plugin(counting_domain):
    return counting_domain


def test_whale_run_end_to_end(tmp_path):
    r = runner(tmp_path, spec_of())
    status = r.run(max_seconds=RUN_BOUND_S)
    assert status.phase is RunPhase.SUCCEEDED, status.message
    assert status.completed_phases == ["c01-weight", "c01-harness", "c02-weight"]
    assert status.checkpoint_step == 6 and status.current_checkpoint == "runs/r1/checkpoints/step-000006"
    assert status.current_harness == "runs/r1/harnesses/c01-accepted.py"
    # evaluations: start, steps 2 4 6 (interval), 3 (end of cycle 1) and after the harness phase
    assert sorted((e.step, e.after) for e in status.evals) == [
        (0, "start"),
        (2, "weight"),
        (3, "harness"),
        (3, "weight"),
        (4, "weight"),
        (6, "weight"),
    ]
    # the simulated eval scores 0.01 per step, +0.05 with an accepted harness: the best is after cycle 1's search
    assert (status.best.step, status.best.phase) == (3, "eval-c01-s000003-harness")
    assert status.best.mean_at_k == pytest.approx(0.08) and status.best.rollouts_at == 3 * 16 + 2 * 4
    assert status.rollouts_spent == 6 * 16 + 2 * 4
    # the store holds what docs/storage.md promises
    store = r.store
    saved = WhaleRunStatus.model_validate(store.read_json(layout.status_key("r1")))
    assert saved == status
    assert store.read_json(layout.spec_key("r1"))["condition"] == "whale"
    assert store.read_json(layout.split_sizes_key("r1")) == SIZES
    assert store.exists(layout.log_key("r1", "c01-weight", 1))
    assert len(store.read_jsonl(layout.metrics_key("r1", "c02-weight"))) == 3


def test_interrupted_run_resumes_without_repeating_finished_phases(tmp_path):
    spec = spec_of()
    store = open_store(str(tmp_path / "store"))

    class Interrupt(KeyboardInterrupt):
        pass

    def ctrl_c_in_cycle_2(status, previous, decision):
        if status.active_phase == "c02-weight" and status.step >= 4:
            raise Interrupt()

    first = runner(tmp_path, spec, store, sim={"hang": {"c02-weight": 4}}, on_status=ctrl_c_in_cycle_2)
    with pytest.raises(Interrupt):
        first.run(max_seconds=RUN_BOUND_S)
    assert all(p.popen.poll() is not None for p in first.procs.values()), "children must not outlive the runner"
    mid = WhaleRunStatus.model_validate(store.read_json(layout.status_key("r1")))
    assert mid.active_phase == "c02-weight" and mid.phase is RunPhase.INTERRUPTED
    # the saved status says the runner stopped (the phase stays Running, for decide() to resume)
    assert [(c.type, c.reason) for c in mid.conditions] == [("Interrupted", "Signal")]
    assert mid.reason == "Interrupted" and "Ctrl-C" in mid.message and "to resume" in mid.message

    second = runner(tmp_path, spec, store)
    final = second.run(max_seconds=RUN_BOUND_S)
    assert final.phase is RunPhase.SUCCEEDED
    relaunched = sorted(second.procs)
    assert "c01-weight" not in relaunched and "c01-harness" not in relaunched
    assert "c02-weight" in relaunched
    # the resumed weight phase continued from its logged step: steps 4..6 are not duplicated
    steps = [m["step"] for m in store.read_jsonl(layout.metrics_key("r1", "c02-weight"))]
    assert steps == [4, 5, 6]
    assert final.conditions == [] and final.reason == "Completed"


def test_failed_phase_is_retried_then_fails_the_run(tmp_path):
    r = runner(tmp_path, spec_of("rsft_only", totalSteps=2), sim={"fail": {"c01-weight": 1}})
    status = r.run(max_seconds=RUN_BOUND_S)
    assert status.phase is RunPhase.SUCCEEDED and status.failures == {"c01-weight": 1}

    r = runner(tmp_path / "b", spec_of("rsft_only", totalSteps=2), sim={"fail": {"c01-weight": 5}})
    status = r.run(max_seconds=RUN_BOUND_S)
    assert status.phase is RunPhase.FAILED
    assert "c01-weight failed 2 time(s)" in status.message
    assert "simulated failure of c01-weight attempt 2" in status.message  # the workload's own last line


def test_adaptive_run_ends_weight_phases_by_patience(tmp_path):
    spec = spec_of(
        "adaptive_whale",
        totalSteps=12,
        adaptive={
            "weight": {"windowSteps": 1, "burnInSteps": 2, "patienceSteps": 2},
            "harness": {"minIterations": 2, "patience": 1, "maxIterations": 4},
        },
    )
    rewards = [0.2, 0.9, 0.1, 0.1, 0.1, 0.1]  # each phase peaks early, then stalls
    status = runner(tmp_path, spec, sim={"reward": rewards}).run(max_seconds=RUN_BOUND_S)
    assert status.phase is RunPhase.SUCCEEDED
    first = status.completed_phases[0]
    result = json.loads((tmp_path / "store" / layout.result_key("r1", first)).read_text())
    assert result["stoppedBy"] == "patience" and result["finalStep"] == 4
    assert status.checkpoint_step == 12
    assert len(status.completed_phases) > 3  # several cycles within the budget


def test_mh_only_and_rsft_only(tmp_path):
    s = runner(tmp_path / "a", spec_of("mh_only", mhOnlyIterations=3)).run(max_seconds=RUN_BOUND_S)
    assert s.phase is RunPhase.SUCCEEDED and s.completed_phases == ["c01-harness"] and s.checkpoint_step == 0
    s = runner(tmp_path / "b", spec_of("rsft_only", totalSteps=3)).run(max_seconds=RUN_BOUND_S)
    assert s.phase is RunPhase.SUCCEEDED and s.completed_phases == ["c01-weight"] and s.checkpoint_step == 3


def test_same_name_with_another_spec_is_refused(tmp_path):
    store = open_store(str(tmp_path / "store"))
    runner(tmp_path, spec_of("rsft_only", totalSteps=1), store).run(max_seconds=RUN_BOUND_S)
    with pytest.raises(RunConflictError, match="different spec"):
        runner(tmp_path, spec_of("rsft_only", totalSteps=2), store).run(max_seconds=RUN_BOUND_S)


def test_a_changed_manifest_names_every_field_that_differs(tmp_path):
    store = open_store(str(tmp_path / "store"))
    spec = spec_of("rsft_only", totalSteps=2)
    store.write_json(layout.spec_key("r1"), spec.to_wire())
    changed = WhaleRunSpec.model_validate(
        {
            **flat(spec.to_wire()),
            "schedule": {"totalSteps": 4},
            "rsft": {**flat(spec.to_wire())["rsft"], "learningRate": 1e-6},
        }
    )
    with pytest.raises(RunConflictError) as refused:
        runner(tmp_path, changed, store).run(max_seconds=RUN_BOUND_S)
    message = str(refused.value)
    assert "spec.experiment.schedule.totalSteps: 2 -> 4" in message
    assert "spec.experiment.rsft.learningRate: 1e-07 -> 1e-06" in message
    assert "2 field(s) of the experiment differ" in message and "(spec.execution, spec.cluster) may" in message
    assert store.read_json(layout.spec_key("r1")) == spec.to_wire()  # the stored spec is untouched


def test_fields_that_may_change_on_resume_are_taken_and_recorded(tmp_path):
    store = open_store(str(tmp_path / "store"))
    spec = spec_of("rsft_only", totalSteps=2)
    store.write_json(layout.spec_key("r1"), spec.to_wire())
    looser = WhaleRunSpec.model_validate(
        {**flat(spec.to_wire()), "retry": {"maxAttempts": 5}, "inference": {"maxConcurrency": 3}}
    )
    r = runner(tmp_path, looser, store)
    assert r.run(max_seconds=RUN_BOUND_S).phase is RunPhase.SUCCEEDED
    assert sorted(map(str, r.changes)) == [
        "spec.execution.inference.maxConcurrency: 64 -> 3",
        "spec.execution.retry.maxAttempts: 2 -> 5",
    ]
    assert store.read_json(layout.spec_key("r1")) == looser.to_wire()


def test_spec_changes_lists_leaves_by_camel_case_path():
    before = {"a": {"b": 1, "c": [1, 2]}, "gone": True, "same": "x"}
    after = {"a": {"b": 2, "c": [1, 3]}, "new": None, "same": "x"}
    assert [str(c) for c in spec_changes(before, after)] == [
        "spec.a.b: 1 -> 2",
        "spec.a.c[1]: 2 -> 3",
        "spec.gone: true -> (unset)",
        "spec.new: (unset) -> null",
    ]
    many = spec_changes({f"k{i:02d}": i for i in range(30)}, {f"k{i:02d}": -i for i in range(1, 31)})
    assert len(many) == 31
    spec = spec_of("rsft_only", totalSteps=2)
    wire = spec.to_wire()
    store_wire = {
        **wire,
        "experiment": {**wire["experiment"], "model": {"name": "other", **{f"x{i}": i for i in range(30)}}},
    }
    fixed = [c for c in spec_changes(store_wire, wire) if c.in_experiment]
    text = conflict_message("r1", "file:///s/spec.json", fixed)
    listed = [line for line in text.splitlines() if line.startswith("    spec.")]
    assert len(listed) == MAX_LISTED_CHANGES and f"... and {len(fixed) - MAX_LISTED_CHANGES} more" in text


def test_a_run_held_by_another_process_is_refused_naming_it(tmp_path):
    store = open_store(str(tmp_path / "store"))
    held = store.acquire_lease(layout.lock_key("r1"), this_process("whale run r1"), ttl_s=60)
    with pytest.raises(RunLockedError) as refused:
        runner(tmp_path, spec_of("rsft_only", totalSteps=1), store).run(max_seconds=RUN_BOUND_S)
    assert f"already being run by pid {os.getpid()}" in str(refused.value)
    assert not store.exists(layout.status_key("r1")), "a refused runner writes nothing"
    held.release()
    assert (
        runner(tmp_path, spec_of("rsft_only", totalSteps=1), store).run(max_seconds=RUN_BOUND_S).phase
        is RunPhase.SUCCEEDED
    )
    assert store.read_lease(layout.lock_key("r1")).live is False  # released on exit


def test_timeout_saves_an_interrupted_status_and_leaves_no_child(tmp_path):
    store = open_store(str(tmp_path / "store"))
    r = runner(
        tmp_path,
        spec_of("rsft_only", totalSteps=3),
        store,
        sim={"hang": {"c01-weight": 1}},
        resume_hint="whale run x.yaml",
    )
    with pytest.raises(RunTimeout, match="did not finish within 3 s"):
        r.run(max_seconds=3)
    assert all(p.popen.poll() is not None for p in r.procs.values())
    saved = WhaleRunStatus.model_validate(store.read_json(layout.status_key("r1")))
    assert saved.phase is RunPhase.INTERRUPTED and saved.conditions[0].reason == "Timeout"
    assert "--timeout of 3 s" in saved.message and "run `whale run x.yaml` to resume" in saved.message


def test_a_failed_run_is_retried_from_its_last_good_state(tmp_path):
    store = open_store(str(tmp_path / "store"))
    spec = spec_of()
    failed = runner(tmp_path, spec, store, sim={"fail": {"c01-harness": 9}}).run(max_seconds=RUN_BOUND_S)
    assert failed.phase is RunPhase.FAILED and failed.failures == {"c01-harness": 2}
    assert failed.completed_phases == ["c01-weight"]
    weight_metrics = store.read_jsonl(layout.metrics_key("r1", "c01-weight"))

    again = runner(tmp_path, spec, store).run(max_seconds=RUN_BOUND_S)  # without --retry a failed run stays failed
    assert again.phase is RunPhase.FAILED

    fixed = runner(tmp_path, spec, store)  # the cause is fixed (the workload no longer fails)
    status = fixed.run(max_seconds=RUN_BOUND_S, retry=True)
    assert status.phase is RunPhase.SUCCEEDED, status.message
    assert status.completed_phases == ["c01-weight", "c01-harness", "c02-weight"]
    assert "c01-weight" not in fixed.procs, "a completed phase must not run again"
    assert fixed.procs["c01-harness"].attempt == 3 and "c01-harness" not in status.failures
    assert store.read_jsonl(layout.metrics_key("r1", "c01-weight")) == weight_metrics
    assert store.exists(layout.log_key("r1", "c01-harness", 3))


def test_whale_run_on_s3(tmp_path, s3_server, s3_store):
    """The same run with the store on a real S3 server: the workloads reach it through the env."""
    r = LocalRunner(
        name="s3run",
        spec=spec_of(),
        store=s3_store,
        split_sizes=SIZES,
        workdir=tmp_path / "work",
        workload_command=SIM,
        env=s3_server.env(),
        poll_interval_s=0.05,
    )
    status = r.run(max_seconds=RUN_BOUND_S)
    assert status.phase is RunPhase.SUCCEEDED, status.message
    assert status.completed_phases == ["c01-weight", "c01-harness", "c02-weight"]
    saved = WhaleRunStatus.model_validate(s3_store.read_json(layout.status_key("s3run")))
    assert saved == status
    assert s3_store.exists(layout.checkpoint_complete_key("s3run", 6))


def test_a_child_without_progress_is_stalled_in_status_json_then_not(tmp_path):
    """`whale run`'s status.json shows Stalled while the child hangs past spec.execution.retry.stallAfterSeconds (the
    runner's clock is the test's: a minute per decision), and False once a metrics line appears."""
    store = open_store(str(tmp_path / "store"))
    wire = flat(spec_of("rsft_only", totalSteps=3).to_wire())
    spec = WhaleRunSpec.model_validate({**wire, "retry": {"maxAttempts": 2, "stallAfterSeconds": 600}})
    minutes = [0]
    seen: list[str] = []

    def clock() -> str:
        """Still until the weight phase has logged its step (however slowly the children start here), then a
        minute per decision."""
        if store.read_jsonl(layout.metrics_key("r1", "c01-weight")):
            minutes[0] += 1
        m = minutes[0]
        return f"2026-01-0{1 + m // 1440}T{m // 60 % 24:02d}:{m % 60:02d}:00Z"

    class Done(KeyboardInterrupt):
        pass

    def watch(status, previous, decision):
        cond = next((c for c in status.conditions if c.type == "Stalled"), None)
        state = cond.status if cond is not None else "-"
        if not seen or seen[-1] != state:
            seen.append(state)
            if state == "True":
                saved = WhaleRunStatus.model_validate(store.read_json(layout.status_key("r1")))
                assert [c.status for c in saved.conditions if c.type == "Stalled"] == ["True"]  # status.json
                assert "phase c01-weight, process " in cond.message
                # the hung child's next step lands in the store
                line = store.read_jsonl(layout.metrics_key("r1", "c01-weight"))[-1]
                store.append_jsonl(layout.metrics_key("r1", "c01-weight"), {**line, "step": line["step"] + 1})
            elif state == "False":
                raise Done()

    r = runner(
        tmp_path,
        spec,
        store,
        sim={"hang": {"c01-weight": 1}},
        on_status=watch,
        clock=clock,
    )
    with pytest.raises(Done):
        r.run(max_seconds=RUN_BOUND_S)
    assert seen == ["-", "True", "False"]
    saved = WhaleRunStatus.model_validate(store.read_json(layout.status_key("r1")))
    assert [c.status for c in saved.conditions if c.type == "Stalled"] == ["False"]


def test_without_split_sizes_the_run_prepares_its_data_first_as_a_phase(tmp_path):
    """Split sizes unknown: decide() schedules data preparation, a child like the phases, retried under
    spec.execution.retry.maxAttempts (counted in the status); the schedule starts once the sizes are in the store."""
    store = open_store(str(tmp_path / "store"))
    sim = {"splits": SIZES, "fail": {"prepare": 1}}
    r = runner(tmp_path, spec_of("rsft_only", totalSteps=2), store, sim=sim, split_sizes=None)
    status = r.run(max_seconds=RUN_BOUND_S)
    assert status.phase is RunPhase.SUCCEEDED, status.message
    assert (status.attempts["prepare"], status.failures["prepare"]) == (2, 1)
    assert store.read_json(layout.split_sizes_key("r1")) == SIZES
    assert store.exists(layout.log_key("r1", "prepare", 1)) and store.exists(layout.log_key("r1", "prepare", 2))


def test_data_preparation_that_keeps_failing_fails_the_run(tmp_path):
    store = open_store(str(tmp_path / "store"))
    r = runner(tmp_path, spec_of("rsft_only", totalSteps=2), store, sim={}, split_sizes=None)  # writes no sizes
    status = r.run(max_seconds=RUN_BOUND_S)
    assert status.phase is RunPhase.FAILED and status.reason == "PrepareFailed"
    assert status.message.startswith("data preparation failed 2 times (spec.execution.retry.maxAttempts); process ")
    assert status.message.endswith("it succeeded without writing runs/r1/control/split_sizes.json")
    assert sorted(r.procs) == ["prepare"] and status.failures == {"prepare": 2}
