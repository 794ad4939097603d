"""How harness iterations are counted, as the paper counts them, and what `whale plan` shows of it.

The paper: I = 6 per whale cycle counts the re-evaluation of the incoming harness (incoming + 5 proposer
iterations); mh_only runs 40 / 60 / 40 PROPOSER iterations plus the incoming evaluation (41 / 61 / 41 in the
archive); the adaptive harness side stops after min 6 (incoming included), patience 2, at most 15 proposer
iterations plus the incoming (16). mh_only is evaluated at every accepted harness: at most one evaluation
per proposer iteration, listed in the plan as an upper bound.
"""

from __future__ import annotations

import json
import tracemalloc

import pytest
from typer.testing import CliRunner

from whale.schedule import PLAN_MAX_LISTED, plan, resolve
from whale.spec import MAX_ITERATIONS, WhaleRunSpec

#: the paper's D_harness (256 items x 1 rollout per candidate, 3 candidates per proposer iteration)
SIZES = {"weight": 256 * 70, "harness": 256, "test": 60}
PER_CANDIDATE = 256


def spec_of(condition: str, schedule: dict, evaluation: dict | None = None) -> WhaleRunSpec:
    return WhaleRunSpec.model_validate(
        {
            "domain": "synthetic",
            "condition": condition,
            "model": {"name": "tiny"},
            "schedule": schedule,
            "evaluation": evaluation or {},
        }
    )


def harness_entries(p: dict) -> list[dict]:
    return [e for e in p["phases"] if e["kind"] == "harness"]


@pytest.mark.parametrize(("n", "domain_run"), [(40, "search QA / chess"), (60, "math")])
def test_mh_only_plan_is_n_proposer_iterations_plus_the_incoming(n, domain_run):
    p = plan(spec_of("mh_only", {"mhOnlyIterations": n}), SIZES)
    (h,) = harness_entries(p)
    assert (h["iterations"], h["proposerIterations"]) == (n + 1, n), domain_run
    # the incoming evaluation scores 1 candidate, every proposer iteration 3
    assert p["rollouts"] == PER_CANDIDATE + n * 3 * PER_CANDIDATE
    # (theta0, h0) at the start, then at most one evaluation per proposer iteration (where the accepted
    # harness changes); the last of them is the accepted harness, so no separate end evaluation
    evals = [e for e in p["phases"] if e["kind"] == "eval"]
    assert evals[0] == {"cycle": 0, "kind": "eval", "step": 0, "after": "start"}
    assert [e["iteration"] for e in evals[1:]] == list(range(2, n + 2))
    assert all(e["upperBound"] and e["after"] == "harness" for e in evals[1:])
    assert p["counts"] == {"weight": 0, "harness": 1, "eval": 1 + n} and p["evaluationsUpperBound"] is True


def test_mh_only_without_every_accepted_harness_plans_the_end_only():
    p = plan(spec_of("mh_only", {"mhOnlyIterations": 40}, {"everyAcceptedHarness": False}), SIZES)
    assert [(e["kind"], e.get("after")) for e in p["phases"]] == [
        ("eval", "start"),
        ("harness", None),
        ("eval", "harness"),
    ]
    assert "evaluationsUpperBound" not in p


def test_whale_i_counts_the_incoming_evaluation():
    p = plan(spec_of("whale", {"totalSteps": 420, "weightStepsPerCycle": 42, "harnessIterationsPerCycle": 6}), SIZES)
    hs = harness_entries(p)
    assert len(hs) == 9 and {(h["iterations"], h["proposerIterations"]) for h in hs} == {(6, 5)}
    assert "evaluationsUpperBound" not in p  # whale evaluates each phase's accepted harness once


def test_adaptive_plan_bounds_in_the_papers_counts():
    spec = spec_of(
        "adaptive_whale",
        {"totalSteps": 420, "adaptive": {"harness": {"minIterations": 6, "patience": 2, "maxIterations": 15}}},
    )
    p = plan(spec, SIZES)
    h = harness_entries(p)[0]
    assert (h["iterations"], h["proposerIterations"], h["minIterations"], h["upperBound"]) == (16, 15, 6, True)
    rule = resolve(spec, SIZES).harness_rule
    assert (rule.min_iterations, rule.max_iterations) == (6, 16)  # the wire rule counts archive iterations


def test_the_defaults_are_the_papers():
    sched = WhaleRunSpec.model_validate(
        {"domain": "synthetic", "condition": "mh_only", "model": {"name": "tiny"}}
    ).schedule
    assert (sched.mh_only_iterations, sched.harness_iterations_per_cycle) == (40, 6)
    assert (
        sched.adaptive.harness.min_iterations,
        sched.adaptive.harness.patience,
        sched.adaptive.harness.max_iterations,
    ) == (6, 2, 15)


def test_mh_only_plan_at_the_iteration_bound_stays_small():
    spec = spec_of("mh_only", {"mhOnlyIterations": MAX_ITERATIONS})
    tracemalloc.start()
    try:
        p = plan(spec, SIZES)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 4 << 20
    assert len(p["phases"]) == PLAN_MAX_LISTED and p["counts"]["eval"] == 1 + MAX_ITERATIONS
    assert p["phasesOmitted"] == sum(p["counts"].values()) - PLAN_MAX_LISTED


def test_whale_plan_cli_shows_the_counts(tmp_path):
    from whale.cli import app

    manifest = tmp_path / "mh.yaml"
    manifest.write_text(
        json.dumps(
            {
                "apiVersion": "whale.dev/v1alpha1",
                "kind": "WhaleRun",
                "metadata": {"name": "mh"},
                "spec": {
                    "domain": "synthetic",
                    "condition": "mh_only",
                    "model": {"name": "tiny"},
                    "schedule": {"mhOnlyIterations": 3},
                    "harnessSearch": {"proposer": {"model": "m", "baseUrl": "http://127.0.0.1:8000/v1"}},
                },
            }
        )
    )
    result = CliRunner().invoke(app, ["plan", str(manifest)], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert "4 iterations: the incoming evaluation + 3 proposer" in result.output
    assert "harness accepted at iteration 4, if it changed there" in result.output
    assert "at most 4 eval phases" in result.output
