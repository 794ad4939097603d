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

from tests.fixtures.specs import flat
from whale.core.convert import convert_v1alpha1
from whale.core.schedule import PLAN_MAX_LISTED, plan, resolve
from whale.core.spec import MAX_ITERATIONS, WhaleRunSpec
from whale.metaharness.loop import SearchConfig

#: the paper's D_harness (256 items x 1 rollout per candidate, 3 candidates per proposer iteration)
SIZES = {"weight": 256 * 70, "harness": 256, "test": 60}
PER_CANDIDATE = 256
#: a proposal's smoke test (smokeTestItems, default 4) before its full score
SMOKE = 4


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
    assert p["rollouts"] == PER_CANDIDATE + n * 3 * (SMOKE + PER_CANDIDATE)
    assert p["rolloutsPerProposal"] == {"smoke": SMOKE, "full": PER_CANDIDATE} and p["rolloutsUpperBound"] is True
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
    ).experiment.schedule
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
            convert_v1alpha1(
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
    )
    result = CliRunner().invoke(app, ["plan", str(manifest)], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert "4 iterations: the incoming evaluation + 3 proposer" in result.output
    assert "harness accepted at iteration 4, if it changed there" in result.output
    assert "at most 4 eval phases" in result.output


def spec_with_trials(condition: str, schedule: dict, proposer: dict) -> WhaleRunSpec:
    spec = flat(spec_of(condition, schedule).model_dump(by_alias=True, exclude_none=True))
    spec["harnessSearch"] = {"proposer": proposer}
    return WhaleRunSpec.model_validate(spec)


def test_run_candidate_is_off_by_default_and_its_budget_is_counted_when_on():
    """The paper's proposer runs no benchmarks (the outer loop evaluates): no run_candidate by default. Turned on,
    each proposer iteration may spend its budget, so the plan counts it (an upper bound) and the task prompt offers
    the tool without telling the proposer to test first."""
    base_spec = spec_of("mh_only", {"mhOnlyIterations": 40})
    assert base_spec.experiment.harness_search.proposer.run_candidate_rollouts == 0
    assert SearchConfig(iterations=2).proposer_trial_rollouts == 0
    base = plan(base_spec, SIZES)
    assert "proposerTrialRolloutsPerIteration" not in base
    on = plan(
        spec_with_trials(
            "mh_only", {"mhOnlyIterations": 40}, {"backend": "openai", "model": "m", "runCandidateRollouts": 64}
        ),
        SIZES,
    )
    assert on["rollouts"] == base["rollouts"] + 40 * 64  # not the incoming evaluation's iteration
    assert on["proposerTrialRolloutsPerIteration"] == 64 and on["rolloutsUpperBound"] is True
    # a cli or replay proposer has no run_candidate tool: nothing to count
    replay = plan(
        spec_with_trials(
            "mh_only", {"mhOnlyIterations": 40}, {"backend": "replay", "script": "x.py", "runCandidateRollouts": 64}
        ),
        SIZES,
    )
    assert replay["rollouts"] == base["rollouts"]
    whale = spec_with_trials(
        "whale",
        {"totalSteps": 20, "weightStepsPerCycle": 10, "harnessIterationsPerCycle": 6},
        {"backend": "anthropic", "model": "m", "runCandidateRollouts": 16},
    )
    assert resolve(whale, SIZES).rollouts_per_harness_iteration == 3 * (SMOKE + PER_CANDIDATE) + 16
