"""`whale compare`'s statistics (pure): intervals with known answers, and their coverage over many draws."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from scipy import stats

from whale.report.compare import (
    Axis,
    CompareRun,
    compare,
    curve,
    group_name,
    item_breakdown,
    mean_interval,
    paired_bootstrap,
    seed_band,
)
from whale.report.series import EvalSample, RunSeries, StatusSource


def series(name: str, points: list[tuple[int, int, float]], condition: str = "rsft_only") -> RunSeries:
    """A run whose evaluations are (step, rollouts, mean@k); the last one is its final point."""
    from whale.report.series import BestPoint

    evals = tuple(EvalSample(f"eval-{i}", 0, s, "weight", r, m) for i, (s, r, m) in enumerate(points))
    top = max(evals, key=lambda e: e.mean_at_k or 0.0)

    def point(e: EvalSample) -> BestPoint:
        return BestPoint(e.mean_at_k or 0.0, 4, e.phase, 0, e.step, e.rollouts)

    return RunSeries(
        name=name,
        label=name,
        source="mem",
        domain="synthetic",
        condition=condition,
        schedule=None,
        k=4,
        run_phase="Succeeded",
        status_source=StatusSource.STATUS,
        evals=evals,
        weight_steps=(),
        harness_iterations=(),
        phases=(),
        best=point(top),
        final=point(evals[-1]),
        final_is_end=True,
        rollouts_spent=points[-1][1],
        steps=points[-1][0],
        total_steps=points[-1][0],
        weight_hours=0.0,
        hours=0.0,
        gpu_hours=0.0,
        weight_gpus=0,
        harness_gpus=0,
        paper=None,
    )


def test_mean_interval_is_students_t():
    iv = mean_interval([0.5, 0.6, 0.7])
    half = stats.t.ppf(0.975, 2) * 0.1 / np.sqrt(3)
    assert iv.mean == pytest.approx(0.6)
    assert (iv.lo, iv.hi) == (pytest.approx(0.6 - half), pytest.approx(0.6 + half))
    assert mean_interval([0.4]).lo is None  # one run: no interval
    same = mean_interval([0.3, 0.3])
    assert (same.lo, same.hi) == (0.3, 0.3)


def test_band_takes_the_last_point_at_or_before_each_x_over_the_common_range():
    a = [(0.0, 0.1), (2.0, 0.3), (4.0, 0.5)]
    b = [(0.0, 0.1), (3.0, 0.5)]  # ends at 3: the band stops there
    band = seed_band("g", [a, b], Axis.STEPS, 0.95)
    assert band is not None and band.runs == 2
    assert band.x == (0.0, 2.0, 3.0)
    assert band.mean == pytest.approx((0.1, 0.2, 0.4))
    assert band.lo is not None and band.lo[0] == pytest.approx(0.1)  # equal values: a zero-width band
    single = seed_band("g", [a], Axis.STEPS, 0.95)
    assert single is not None and single.lo is None and single.mean == (0.1, 0.3, 0.5)


def test_curve_reads_each_axis():
    s = series("r", [(0, 0, 0.1), (2, 32, 0.3), (4, 64, 0.2)])
    assert curve(s, Axis.ROLLOUTS) == [(0.0, 0.1), (32.0, 0.3), (64.0, 0.2)]
    assert curve(s, Axis.STEPS) == [(0.0, 0.1), (2.0, 0.3), (4.0, 0.2)]
    assert curve(s, Axis.HOURS) == [(0.0, 0.1), (0.0, 0.3), (0.0, 0.2)]  # no work recorded: no time
    timed = dataclasses.replace(
        s, evals=tuple(dataclasses.replace(e, hours=e.step / 4, gpu_hours=e.step / 2) for e in s.evals)
    )
    assert curve(timed, Axis.HOURS) == [(0.0, 0.1), (0.5, 0.3), (1.0, 0.2)]
    assert curve(timed, Axis.GPU_HOURS) == [(0.0, 0.1), (1.0, 0.3), (2.0, 0.2)]


def test_paired_bootstrap_known_difference_and_degenerate_cases():
    a = {f"i{i}": 1.0 if i < 60 else 0.0 for i in range(100)}
    b = {f"i{i}": 1.0 if i < 30 else 0.0 for i in range(100)}
    d = paired_bootstrap(a, b, resamples=999)
    assert d.items == 100 and d.diff == pytest.approx(0.3)
    assert d.lo is not None and d.hi is not None and 0.15 < d.lo < 0.3 < d.hi < 0.45
    same = paired_bootstrap(a, a)
    assert (same.diff, same.lo, same.hi) == (0.0, 0.0, 0.0)
    none = paired_bootstrap({"x": 1.0}, {"y": 1.0})
    assert none.items == 0 and none.lo is None and none.note == "no test item in common"


def test_paired_bootstrap_covers_the_truth_at_its_stated_rate():
    """300 draws of 80 items (correlated pairs: a shared item difficulty); the truth is 0.1. A 95 % interval
    should cover it ~95 % of the time: 300 draws put the rate within ±0.04 of it (3 standard errors)."""
    rng = np.random.default_rng(123)
    covered = 0
    draws = 300
    for d in range(draws):
        difficulty = rng.uniform(0.1, 0.8, size=80)
        a = rng.binomial(4, np.clip(difficulty + 0.1, 0, 1)) / 4  # mean@4 per item
        b = rng.binomial(4, difficulty) / 4
        res = paired_bootstrap(
            {str(i): float(v) for i, v in enumerate(a)},
            {str(i): float(v) for i, v in enumerate(b)},
            resamples=999,
            seed=d,
        )
        assert res.lo is not None and res.hi is not None
        # the truth is the population difference: E[a - b] = 0.1 for every item (difficulty + 0.1 stays <= 0.9)
        covered += res.lo <= 0.1 <= res.hi
    assert 0.91 <= covered / draws <= 0.99


def test_seed_band_covers_the_true_mean_at_its_stated_rate():
    """Three seeds of a run whose points are the truth plus normal noise: the t band covers the truth ~95 %."""
    rng = np.random.default_rng(7)
    truth = np.array([0.1, 0.3, 0.5])
    hits = total = 0
    for _ in range(400):
        curves = [
            [(float(x), float(y)) for x, y in zip((0, 2, 4), truth + rng.normal(0, 0.05, 3), strict=True)]
            for _ in range(3)
        ]
        band = seed_band("g", curves, Axis.STEPS, 0.95)
        assert band is not None and band.lo is not None and band.hi is not None
        for t, lo, hi in zip(truth, band.lo, band.hi, strict=True):
            hits += lo <= t <= hi
            total += 1
    assert 0.92 <= hits / total <= 0.98


def test_compare_groups_reports_best_beside_final_and_every_pair():
    def run(name, condition, final, seed, solved):
        s = series(name, [(0, 0, 0.1), (2, 32, final + 0.1), (4, 64, final)], condition)
        return CompareRun(name, condition, condition, seed, s, {f"q{i}": float(i < solved) for i in range(10)})

    runs = [
        run("a1", "rsft_only", 0.5, 1, 5),
        run("a2", "rsft_only", 0.6, 2, 6),
        run("a3", "rsft_only", 0.7, 3, 7),
        run("b1", "whale", 0.8, 1, 8),
    ]
    c = compare(runs, resamples=999)
    a, b = c.groups
    assert a.group == "rsft_only" and a.runs == ("a1", "a2", "a3") and a.seeds == (1, 2, 3)
    assert a.final is not None and a.final.mean == pytest.approx(0.6) and a.final.lo is not None
    assert a.best is not None and a.best.mean == pytest.approx(0.7)  # each run's best is one point above its final
    assert (a.points_min, a.points_max) == (3, 3)
    assert b.final is not None and b.final.lo is None  # one run
    (pair,) = c.pairs
    # items: rsft_only solves q0..q5 on average (5, 6, 7 of 10: item q5 2/3, q6 1/3), whale q0..q7
    assert (pair.a, pair.b, pair.items) == ("rsft_only", "whale", 10)
    assert pair.diff == pytest.approx(0.6 - 0.8)
    assert {band.axis for band in c.bands} == set(Axis)
    assert c.to_dict()["pairs"][0]["diff"] == pytest.approx(-0.2)


def test_group_names_take_any_spec_field_and_breakdown_counts_items():
    wire = {"harnessSearch": {"proposer": {"backend": "mutate"}}}
    assert (
        group_name("whale", wire, ["harnessSearch.proposer.backend"]) == "whale harnessSearch.proposer.backend=mutate"
    )
    assert group_name("whale", wire, ["nope.field"]) == "whale nope.field=None"
    s = series("x", [(0, 0, 0.1)])
    a = CompareRun("a", "g", "whale", 0, s, {"q1": 1.0, "q2": 0.0, "q3": 1.0})
    b = CompareRun("b", "g", "whale", 0, s, {"q1": 1.0, "q2": 0.75, "q4": 0.0})
    br = item_breakdown(a, b)
    assert (br.both, br.only_a, br.only_b, br.neither) == (1, 1, 1, 1)
    assert [r.item for r in br.rows] == ["q2", "q3", "q1", "q4"]  # the items that differ first
