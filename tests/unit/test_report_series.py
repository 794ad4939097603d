"""whale.report.series / paper / source.parse_source: pure rules, table-driven, from real wire models."""

from __future__ import annotations

import dataclasses

import pytest

from tests.fixtures.specs import flat
from whale.core.protocol import (
    CandidateScore,
    EvalResult,
    HarnessIterationMetrics,
    HarnessPhaseResult,
    PhaseKind,
    WeightPhaseResult,
    WeightStepMetrics,
)
from whale.core.spec import Condition, WhaleRunSpec
from whale.core.status import BestEval, EvalPoint, RunPhase, WhaleRunStatus
from whale.report.paper import TABLE_1, paper_number
from whale.report.series import (
    PhaseRecords,
    RunRecords,
    StatusSource,
    build_series,
    eval_iteration,
    parse_eval_phase,
    parse_main_phase,
    run_order,
    unique_labels,
)
from whale.report.source import ReportError, parse_source


def spec(condition: str = "whale", domain: str = "chess_puzzles", **schedule) -> WhaleRunSpec:
    if not schedule:
        schedule = (
            {"totalSteps": 4, "weightStepsPerCycle": 2, "harnessIterationsPerCycle": 2}
            if condition == "whale"
            else {}
            if condition == "mh_only"
            else {"totalSteps": 4}
        )
    return WhaleRunSpec.model_validate(
        {"domain": domain, "condition": condition, "model": {"name": "m"}, "schedule": schedule}
    )


def steps(phase_from: int, n: int, rollouts: int = 10, reward: float = 0.5) -> tuple[WeightStepMetrics, ...]:
    return tuple(
        WeightStepMetrics(
            step=s,
            epoch=s / 10,
            reward_mean=reward + s / 100,
            acceptance_rate=0.25,
            kept=2,
            loss=1.0 / s,
            learning_rate=1e-6,
            rollouts=rollouts,
            seconds_sampling=1.0,
            seconds_training=2.0,
            seconds_syncing=0.5,
        )
        for s in range(phase_from + 1, phase_from + n + 1)
    )


def iterations(n: int, rollouts: int = 3) -> tuple[HarnessIterationMetrics, ...]:
    return tuple(
        HarnessIterationMetrics(
            iteration=i,
            best_score=0.1 * i,
            best_candidate=f"i{i:02d}-c1",
            rollouts=rollouts,
            seconds=60.0,
            candidates=[CandidateScore(id=f"i{i:02d}-c1", score=0.1 * i), CandidateScore(id=f"i{i:02d}-c2", error="x")],
        )
        for i in range(1, n + 1)
    )


def whale_records(status: WhaleRunStatus | None = None) -> RunRecords:
    """c01-weight (steps 1-2), c01-harness (2 iterations), c02-weight (steps 3-4), as a whale run leaves them."""
    phases = (
        # listed in store order (alphabetical), not run order: the builder must sort them
        PhaseRecords(
            "c01-harness",
            PhaseKind.HARNESS,
            harness_metrics=iterations(2),
            result=HarnessPhaseResult(
                accepted_harness="runs/r/harnesses/c01-accepted.py",
                accepted_candidate="i02-c1",
                accepted_score=0.2,
                iterations=2,
                rollouts=6,
            ),
        ),
        PhaseRecords(
            "c01-weight",
            PhaseKind.WEIGHT,
            weight_metrics=steps(0, 2),
            result=WeightPhaseResult(final_step=2, checkpoint="runs/r/checkpoints/step-000002", rollouts=20),
        ),
        PhaseRecords(
            "c02-weight",
            PhaseKind.WEIGHT,
            weight_metrics=steps(2, 2),
            result=WeightPhaseResult(final_step=4, checkpoint="runs/r/checkpoints/step-000004", rollouts=20),
        ),
    )
    evals = {
        "eval-c00-s000000-start": EvalResult(mean_at_k=0.1, k=8, items=4),
        "eval-c01-s000002-weight": EvalResult(mean_at_k=0.2, k=8, items=4),
        "eval-c01-s000002-harness": EvalResult(mean_at_k=0.4, k=8, items=4, notes=["<script>x</script>"]),
        "eval-c02-s000004-weight": EvalResult(mean_at_k=0.4, k=8, items=4),
    }
    return RunRecords(name="r", source="file:///s/runs/r", spec=spec(), status=status, phases=phases, evals=evals)


def test_phase_keys_parse_and_sort_in_run_order():
    assert parse_main_phase("c03-harness") == (3, PhaseKind.HARNESS)
    assert parse_main_phase("eval-c01-s000002-weight") is None and parse_main_phase("c1-weight") is None
    assert parse_eval_phase("eval-c02-s000088-weight") == (2, 88, "weight")
    assert parse_eval_phase("c02-weight") is None
    assert sorted(["c02-weight", "c01-harness", "c01-weight"], key=run_order) == [
        "c01-weight",
        "c01-harness",
        "c02-weight",
    ]
    with pytest.raises(ValueError, match="cNN-weight"):
        run_order("eval-c00-s000000-start")


def test_series_from_the_store_alone_reconstructs_what_decide_counts():
    s = build_series(whale_records())
    assert s.status_source is StatusSource.STORE and s.run_phase is None
    assert [p.phase for p in s.phases] == ["c01-weight", "c01-harness", "c02-weight"]
    assert [(p.rollouts_start, p.rollouts_end, p.step_start, p.step_end) for p in s.phases] == [
        (0, 20, 0, 2),
        (20, 26, 2, 2),
        (26, 46, 2, 4),
    ]
    assert [(w.step, w.rollouts) for w in s.weight_steps] == [(1, 10), (2, 20), (3, 36), (4, 46)]
    assert [(h.index, h.iteration, h.rollouts, h.candidate_scores) for h in s.harness_iterations] == [
        (1, 1, 23, (0.1,)),
        (2, 2, 26, (0.2,)),
    ]
    assert [(e.phase, e.rollouts, e.mean_at_k) for e in s.evals] == [
        ("eval-c00-s000000-start", 0, 0.1),
        ("eval-c01-s000002-weight", 20, 0.2),
        ("eval-c01-s000002-harness", 26, 0.4),
        ("eval-c02-s000004-weight", 46, 0.4),
    ]
    # the first highest point wins, as decide() keeps a best only when strictly better
    assert (s.best.phase, s.best.rollouts, s.best.after, s.best.mean_at_k) == (
        "eval-c01-s000002-harness",
        26,
        "harness",
        0.4,
    )
    assert s.rollouts_spent == 46 and s.steps == 4
    assert s.weight_hours == pytest.approx(4 * 3.5 / 3600)
    # the default spec holds 1 trainer GPU + 1 vLLM GPU in a weight phase, the 1 vLLM GPU in a harness phase:
    # 4 steps of 3.5 s x 2 GPUs, 2 iterations of 60 s x 1 GPU
    assert (s.weight_gpus, s.harness_gpus) == (2, 1)
    assert s.hours == pytest.approx((4 * 3.5 + 2 * 60) / 3600)
    assert s.gpu_hours == pytest.approx((4 * 3.5 * 2 + 2 * 60) / 3600)
    # each evaluation sits after the training work done when it was reached
    assert [(round(e.hours * 3600, 6), round(e.gpu_hours * 3600, 6)) for e in s.evals] == [
        (0.0, 0.0),
        (7.0, 14.0),
        (127.0, 134.0),
        (134.0, 148.0),
    ]
    assert any("no status.json" in n for n in s.notes) and any("<script>" in n for n in s.notes)


def test_series_takes_evaluations_and_best_from_the_status_when_there_is_one():
    status = WhaleRunStatus(
        phase=RunPhase.SUCCEEDED,
        step=4,
        total_steps=4,
        rollouts_spent=46,
        completed_phases=["c01-weight", "c01-harness", "c02-weight"],
        evals=[
            EvalPoint(phase="eval-c00-s000000-start", cycle=0, step=0, after="start", mean_at_k=0.1),
            EvalPoint(phase="eval-c01-s000002-weight", cycle=1, step=2, after="weight", rollouts_at=20, mean_at_k=0.2),
            EvalPoint(phase="eval-c02-s000004-weight", cycle=2, step=4, after="weight", rollouts_at=46),
        ],
        best=BestEval(mean_at_k=0.2, k=8, phase="eval-c01-s000002-weight", cycle=1, step=2, rollouts_at=20),
    )
    s = build_series(whale_records(status))
    assert s.status_source is StatusSource.STATUS and s.run_phase == "Succeeded"
    # exactly the status' points, an unfinished one included (mean None), whatever the store has beyond them
    assert [(e.phase, e.rollouts, e.mean_at_k) for e in s.evals] == [
        ("eval-c00-s000000-start", 0, 0.1),
        ("eval-c01-s000002-weight", 20, 0.2),
        ("eval-c02-s000004-weight", 46, None),
    ]
    assert (s.best.phase, s.best.mean_at_k, s.best.rollouts, s.best.after) == (
        "eval-c01-s000002-weight",
        0.2,
        20,
        "weight",
    )
    assert s.total_steps == 4 and s.rollouts_spent == 46


def test_a_running_phase_counts_the_rollouts_of_its_logged_steps():
    records = whale_records()
    running = dataclasses.replace(records.phases[2], result=None, weight_metrics=steps(2, 1))
    s = build_series(dataclasses.replace(records, phases=(*records.phases[:2], running)))
    last = s.phases[-1]
    assert (last.done, last.rollouts_end, last.step_end) == (False, 36, 3)


def test_mh_only_lays_its_iterations_at_step_zero():
    records = RunRecords(
        name="m",
        source="s",
        spec=spec("mh_only"),
        status=None,
        phases=(
            PhaseRecords(
                "c01-harness",
                PhaseKind.HARNESS,
                harness_metrics=iterations(3),
                result=HarnessPhaseResult(
                    accepted_harness="h", accepted_candidate="i03-c1", accepted_score=0.3, iterations=3, rollouts=9
                ),
            ),
        ),
        evals={
            "eval-c00-s000000-start": EvalResult(mean_at_k=0.0, k=4, items=1),
            "eval-c01-s000000-harness": EvalResult(mean_at_k=0.5, k=4, items=1),
        },
    )
    s = build_series(records)
    assert s.weight_steps == () and s.steps == 0 and s.k == 4
    assert [(e.step, e.rollouts) for e in s.evals] == [(0, 0), (0, 9)]
    assert s.schedule is None and s.condition == "mh_only"


def test_to_dict_is_camel_case_json_without_nan():
    import json

    records = whale_records()
    diverged = steps(0, 2)[0].model_copy(update={"loss": float("nan")})
    first = dataclasses.replace(records.phases[1], weight_metrics=(diverged, *records.phases[1].weight_metrics[1:]))
    d = build_series(dataclasses.replace(records, phases=(records.phases[0], first, records.phases[2]))).to_dict()
    json.dumps(d, allow_nan=False)
    assert d["weightSteps"][0]["loss"] is None
    assert d["statusSource"] == "store" and d["rolloutsSpent"] == 46
    assert d["phases"][1]["kind"] == "harness" and d["phases"][1]["acceptedScore"] == 0.2
    assert d["best"]["meanAtK"] == 0.4 and d["weightSteps"][0]["keptFraction"] == 0.25


@pytest.mark.parametrize(
    ("condition", "domain", "schedule", "expected"),
    [
        (
            "whale",
            "chess_puzzles",
            {"totalEpochs": 4, "weightEpochsPerCycle": 0.6, "harnessIterationsPerCycle": 6},
            ("WHALE (0.6, 6)", "chess", 29.83),
        ),
        (
            "whale",
            "chess_puzzles",
            {"totalEpochs": 4, "weightEpochsPerCycle": 0.5, "harnessIterationsPerCycle": 6},
            None,
        ),
        ("whale", "chess_puzzles", {"totalSteps": 40, "weightStepsPerCycle": 4}, None),
        ("rsft_only", "math_reasoning", {"totalEpochs": 4}, ("weight-only", "AIME 24+25", 15.42)),
        ("mh_only", "search_qa", {}, ("harness-only", "search QA avg (7)", 38.29)),
        ("adaptive_whale", "search_qa", {"totalEpochs": 4}, ("adaptive WHALE", "search QA avg (7)", 52.82)),
        ("adaptive_whale", "chess_puzzles", {"totalEpochs": 4}, None),  # the paper has no such run
        ("rsft_only", "synthetic", {"totalSteps": 4}, None),
    ],
)
def test_paper_number_matches_domain_condition_and_schedule(condition, domain, schedule, expected):
    got = paper_number(spec(condition, domain, **schedule))
    assert (None if got is None else (got.method, got.column, got.mean_at_8_percent)) == expected


def test_table_1_is_the_papers():
    assert TABLE_1[Condition.WHALE] == {"search_qa": 48.34, "math_reasoning": 24.79, "chess_puzzles": 29.83}
    assert TABLE_1[Condition.MH_ONLY]["math_reasoning"] == 0.42


@pytest.mark.parametrize(
    ("arg", "store", "run"),
    [
        (".whale/store", ".whale/store", None),
        (".whale/store/", ".whale/store", None),
        (".whale/store/runs/tiny-synthetic-whale", ".whale/store", "tiny-synthetic-whale"),
        ("runs/r1/", ".", "r1"),
        ("/abs/st/runs/r1", "/abs/st", "r1"),
        ("s3://whale/dev", "s3://whale/dev", None),
        ("s3://whale/dev/runs/math-whale", "s3://whale/dev", "math-whale"),
        ("s3://whale/runs/r", "s3://whale", "r"),
        ("file:///data/st/runs/r", "file:///data/st", "r"),
    ],
)
def test_parse_source(arg, store, run):
    got = parse_source(arg)
    assert (got.store_uri, got.run) == (store, run)


def test_parse_source_refuses_bad_names():
    with pytest.raises(ReportError, match="DNS-1035"):
        parse_source("st/runs/Not_A_Name")
    with pytest.raises(ReportError, match="empty"):
        parse_source("  ")


def test_unique_labels_only_qualify_repeated_names():
    assert unique_labels([("a", "s1"), ("b", "s1"), ("a", "s2")]) == ["a@s1", "b", "a@s2"]


# ----- the headline both ways: best over the evaluation points, and the final point -------------------


def test_final_is_the_last_point_and_best_the_highest_from_the_store():
    s = build_series(whale_records())
    # best: the first highest (after the c01 harness phase); final: the last point of the schedule
    assert (s.best.phase, s.best.mean_at_k) == ("eval-c01-s000002-harness", 0.4)
    assert (s.final.phase, s.final.mean_at_k, s.final.rollouts, s.final.k) == ("eval-c02-s000004-weight", 0.4, 46, 8)
    assert s.final_is_end is False  # the store alone cannot say the run ended
    d = s.to_dict()
    assert d["final"]["phase"] == "eval-c02-s000004-weight" and d["finalIsEnd"] is False


def test_final_comes_from_the_status_once_the_run_succeeded():
    final = BestEval(mean_at_k=0.3, k=8, phase="eval-c02-s000004-weight", cycle=2, step=4, rollouts_at=46)
    status = WhaleRunStatus(
        phase=RunPhase.SUCCEEDED,
        completed_phases=["c01-weight", "c01-harness", "c02-weight"],
        evals=[
            EvalPoint(phase="eval-c00-s000000-start", cycle=0, step=0, after="start", mean_at_k=0.5, k=8),
            EvalPoint(
                phase="eval-c02-s000004-weight", cycle=2, step=4, after="weight", rollouts_at=46, mean_at_k=0.3, k=8
            ),
        ],
        best=BestEval(mean_at_k=0.5, k=8, phase="eval-c00-s000000-start", cycle=0, step=0),
        final=final,
    )
    s = build_series(whale_records(status))
    assert (s.best.mean_at_k, s.final.mean_at_k, s.final.phase, s.final_is_end) == (
        0.5,
        0.3,
        "eval-c02-s000004-weight",
        True,
    )
    from whale.report.page import summary_row

    row = summary_row(s)
    assert (row["best"], row["final"]) == ("50.00", "30.00")
    assert row["finalWhere"] == "cycle 2, step 4, after weight (eval-c02-s000004-weight)"


def test_a_running_run_shows_its_latest_point_as_such():
    status = WhaleRunStatus(
        phase=RunPhase.RUNNING,
        active_phase="c02-weight",
        completed_phases=["c01-weight", "c01-harness"],
        evals=[
            EvalPoint(phase="eval-c00-s000000-start", cycle=0, step=0, after="start", mean_at_k=0.1, k=8),
            EvalPoint(
                phase="eval-c01-s000002-weight", cycle=1, step=2, after="weight", rollouts_at=20, mean_at_k=0.2, k=8
            ),
            EvalPoint(phase="eval-c02-s000004-weight", cycle=2, step=4, after="weight", rollouts_at=46),
        ],
        best=BestEval(mean_at_k=0.2, k=8, phase="eval-c01-s000002-weight", cycle=1, step=2, rollouts_at=20),
    )
    s = build_series(whale_records(status))
    assert (s.final.phase, s.final_is_end) == ("eval-c01-s000002-weight", False)  # the unfinished one is not it
    from whale.report.page import summary_row

    assert summary_row(s)["final"] == "20.00 (latest)"


def test_mh_only_points_at_every_accepted_harness_from_the_store():
    """mh_only evaluates the harness accepted at iterations 2 and 3: each point lies where its iteration ended."""
    records = RunRecords(
        name="m",
        source="s",
        spec=spec("mh_only"),
        status=None,
        phases=(
            PhaseRecords(
                "c01-harness",
                PhaseKind.HARNESS,
                harness_metrics=iterations(3),
                result=HarnessPhaseResult(
                    accepted_harness="h", accepted_candidate="i03-c1", accepted_score=0.3, iterations=3, rollouts=9
                ),
            ),
        ),
        evals={
            "eval-c00-s000000-start": EvalResult(mean_at_k=0.1, k=8, items=1),
            "eval-c01-s000000-harness-i0002": EvalResult(mean_at_k=0.5, k=8, items=1),
            "eval-c01-s000000-harness-i0003": EvalResult(mean_at_k=0.4, k=8, items=1),
        },
    )
    s = build_series(records)
    assert parse_eval_phase("eval-c01-s000000-harness-i0002") == (1, 0, "harness")
    assert eval_iteration("eval-c01-s000000-harness-i0002") == 2 and eval_iteration("eval-c01-s000000-harness") is None
    assert [(e.phase, e.rollouts, e.iteration) for e in s.evals] == [
        ("eval-c00-s000000-start", 0, None),
        ("eval-c01-s000000-harness-i0002", 6, 2),
        ("eval-c01-s000000-harness-i0003", 9, 3),
    ]
    assert (s.best.iteration, s.best.mean_at_k, s.final.iteration, s.final.mean_at_k) == (2, 0.5, 3, 0.4)
    from whale.report.page import describe_short, where

    assert where(s) == "cycle 1, step 0, after harness, iteration 2 (eval-c01-s000000-harness-i0002)"
    assert describe_short(s.final) == "c01 s0 after harness i3"


def test_a_cpu_run_spends_hours_but_no_gpu_hours():
    records = whale_records()
    cpu = WhaleRunSpec.model_validate(
        {**flat(records.spec.model_dump(by_alias=True, exclude_none=True)), "train": {"gpusPerNode": 0}}
    )
    s = build_series(dataclasses.replace(records, spec=cpu))
    assert (s.weight_gpus, s.harness_gpus) == (0, 0)
    assert s.hours == pytest.approx((4 * 3.5 + 2 * 60) / 3600) and s.gpu_hours == 0.0
    assert all(e.gpu_hours == 0.0 for e in s.evals) and s.evals[-1].hours > 0


def test_work_recorded_on_cpu_holds_no_gpu_whatever_the_spec_asks():
    """`whale run` on a CPU machine with a spec that asks a cluster for GPUs: the lines say cpu, so 0 GPU-hours."""
    records = whale_records()
    on_cpu = tuple(
        dataclasses.replace(
            p,
            weight_metrics=tuple(m.model_copy(update={"device": "cpu"}) for m in p.weight_metrics),
            harness_metrics=tuple(h.model_copy(update={"device": "cpu"}) for h in p.harness_metrics),
        )
        for p in records.phases
    )
    s = build_series(dataclasses.replace(records, phases=on_cpu))
    assert records.spec.execution.train.gpus_per_node == 1
    assert s.gpu_hours == 0.0 and (s.weight_gpus, s.harness_gpus) == (0, 0)
    assert s.hours == pytest.approx((4 * 3.5 + 2 * 60) / 3600)
    cuda = tuple(
        dataclasses.replace(p, weight_metrics=tuple(m.model_copy(update={"device": "cuda"}) for m in p.weight_metrics))
        for p in on_cpu
    )
    s = build_series(dataclasses.replace(records, phases=cuda))
    assert s.gpu_hours == pytest.approx(4 * 3.5 * 2 / 3600) and (s.weight_gpus, s.harness_gpus) == (2, 0)
