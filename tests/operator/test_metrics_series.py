"""Per-run metric series go away with the run (a long-lived operator must not grow a series per run ever seen)."""

from __future__ import annotations

from prometheus_client import generate_latest

from whale.core.status import RunPhase
from whale_operator.metrics import OperatorMetrics


def test_a_deleted_run_leaves_no_series():
    m = OperatorMetrics()
    m.set_run_phase("uid-1", RunPhase.RUNNING)
    m.rollouts.labels(namespace="team-a", run="demo").set(1024)
    text = generate_latest(m.registry).decode()
    assert 'whale_operator_rollouts_spent{namespace="team-a",run="demo"} 1024.0' in text
    assert 'whale_operator_runs{phase="Running"} 1.0' in text
    m.forget_run("uid-1", "team-a", "demo")
    text = generate_latest(m.registry).decode()
    assert 'run="demo"' not in text
    assert 'whale_operator_runs{phase="Running"} 0.0' in text
    m.forget_run("uid-2", "team-a", "never-reconciled")  # nothing to remove: no error


def test_the_runs_gauge_counts_each_run_once_in_its_latest_phase():
    m = OperatorMetrics()
    m.set_run_phase("uid-1", RunPhase.RUNNING)
    m.set_run_phase("uid-2", RunPhase.RUNNING)
    m.set_run_phase("uid-1", RunPhase.RUNNING)  # the same phase again: still one run
    m.set_run_phase("uid-2", RunPhase.SUCCEEDED)
    m.set_run_phase("uid-3", RunPhase.SUSPENDED)
    m.forget_run("uid-3", "team-a", "gone")
    text = generate_latest(m.registry).decode()
    assert 'whale_operator_runs{phase="Running"} 1.0' in text
    assert 'whale_operator_runs{phase="Succeeded"} 1.0' in text
    assert 'whale_operator_runs{phase="Suspended"} 0.0' in text
    assert 'whale_operator_runs{phase="Failed"} 0.0' in text  # every phase has its series from the start
