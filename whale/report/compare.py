"""`whale compare`'s statistics: runs grouped by condition (and any spec field), a band over seeds, and paired
bootstrap intervals over test items. Pure: series and per-item rewards in, typed values out; no store, no plotting.

- **Groups.** A run's group is its condition, plus the value of every ``--by`` spec field (a dotted camelCase path
  such as ``harnessSearch.proposer.backend``); the runs of one group are its repeats (different ``spec.experiment.seed``).
- **Bands.** Each run's test mean@k is a step function of an axis (rollouts spent, global RSFT step, measured
  training wall hours, or GPU-hours: those hours x the GPUs each phase held): at ``x`` it is the last evaluation at or before ``x``. On the union of the group's
  evaluation points, over the range every run covers, the band is the mean over runs with a Student-t interval
  (``scipy.stats.t``): the uncertainty over seeds. One run: no band, only its line.
- **Headline both ways.** Per group, the mean (with its t interval) of the runs' best over evaluation points (the
  paper's figure, optimistic by construction: the more points, the higher) and of their final point, with the
  number of evaluation points the best was taken over.
- **Pairs.** For each pair of groups, the difference of their final test score with a paired bootstrap interval over
  the test items they share (``scipy.stats.bootstrap``, ``paired=True``): an item's score in a group is its mean
  reward at each run's final evaluation, averaged over the group's runs. It resamples items, not seeds: it says
  whether the two conditions differ on this test set, given these runs.
"""

from __future__ import annotations

import bisect
import dataclasses
import enum
import itertools
import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from whale.core.convert import raw_section
from whale.report.series import RunSeries, _camel

#: the default confidence of every interval (the issue's 95 %)
CONFIDENCE = 0.95
#: bootstrap resamples of each pair (scipy's default)
RESAMPLES = 9999


class Axis(str, enum.Enum):
    """What a band is drawn against."""

    ROLLOUTS = "rollouts"  #: training rollouts spent
    STEPS = "steps"  #: global RSFT step
    HOURS = "hours"  #: measured wall hours of the training work (weight steps and harness iterations)
    GPU_HOURS = "gpu-hours"  #: those hours x the GPUs each phase held (0 for a CPU run)


@dataclasses.dataclass(frozen=True)
class CompareRun:
    """One run as the comparison sees it."""

    label: str
    group: str
    condition: str
    seed: int | None
    series: RunSeries
    #: item id -> mean reward at the run's final evaluation point; empty when its per-item file is missing
    items: Mapping[str, float] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class Interval:
    """A mean and its two-sided interval at ``confidence``; ``lo``/``hi`` None when it cannot be had (n < 2)."""

    mean: float
    lo: float | None
    hi: float | None
    n: int
    confidence: float


@dataclasses.dataclass(frozen=True)
class Band:
    """A group's mean test mean@k over its runs along one axis."""

    group: str
    axis: Axis
    x: tuple[float, ...]
    mean: tuple[float, ...]
    #: None where the group has one run
    lo: tuple[float, ...] | None
    hi: tuple[float, ...] | None
    runs: int


@dataclasses.dataclass(frozen=True)
class GroupSummary:
    group: str
    condition: str
    runs: tuple[str, ...]
    seeds: tuple[int | None, ...]
    best: Interval | None
    final: Interval | None
    #: evaluation points the best was taken over (min and max over the group's runs)
    points_min: int
    points_max: int
    rollouts_spent: float


@dataclasses.dataclass(frozen=True)
class PairedDiff:
    """Final test score of ``a`` minus ``b`` over their shared test items, with a paired bootstrap interval."""

    a: str
    b: str
    items: int
    diff: float
    lo: float | None
    hi: float | None
    confidence: float
    resamples: int
    note: str | None = None


@dataclasses.dataclass(frozen=True)
class Comparison:
    groups: tuple[GroupSummary, ...]
    bands: tuple[Band, ...]
    pairs: tuple[PairedDiff, ...]
    notes: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return _camel(dataclasses.asdict(self))


# ----- grouping ------------------------------------------------------------------------------------


def field_value(spec_wire: Mapping[str, Any], path: str) -> Any:
    """The value at a dotted camelCase path of a spec's wire form (None when a part is absent). A path may name a
    section by itself (``harnessSearch.proposer.backend``, as v1alpha1 wrote it): it is looked for in its group."""
    first, _, rest = path.partition(".")
    node: Any = spec_wire.get(first) if first in spec_wire else raw_section(spec_wire, first)
    if node is None:
        return None
    for part in filter(None, rest.split(".")):
        if not isinstance(node, Mapping) or part not in node:
            return None
        node = node[part]
    return node


def group_name(condition: str, spec_wire: Mapping[str, Any], by: Sequence[str]) -> str:
    """``whale`` or ``whale harnessSearch.proposer.backend=mutate``: the condition and each ``by`` field."""
    return " ".join([condition, *(f"{p}={field_value(spec_wire, p)}" for p in by)])


# ----- one number over seeds ----------------------------------------------------------------------


def mean_interval(values: Sequence[float], confidence: float = CONFIDENCE) -> Interval:
    """The mean of ``values`` with its Student-t interval (the runs are independent repeats)."""
    from scipy import stats

    arr = np.asarray(values, dtype=float)
    if arr.size == 0:
        raise ValueError("no values to average")
    mean = float(arr.mean())
    if arr.size < 2:
        return Interval(mean, None, None, int(arr.size), confidence)
    sem = float(stats.sem(arr))
    if sem == 0.0:
        return Interval(mean, mean, mean, int(arr.size), confidence)
    lo, hi = stats.t.interval(confidence, arr.size - 1, loc=mean, scale=sem)
    return Interval(mean, float(lo), float(hi), int(arr.size), confidence)


# ----- bands --------------------------------------------------------------------------------------


def curve(series: RunSeries, axis: Axis) -> list[tuple[float, float]]:
    """A run's finished, unflagged evaluations as (x, mean@k), in schedule order."""
    out = []
    for e in series.evals:
        if e.mean_at_k is None or e.flagged:
            continue
        x = {Axis.ROLLOUTS: e.rollouts, Axis.STEPS: e.step, Axis.HOURS: e.hours, Axis.GPU_HOURS: e.gpu_hours}[axis]
        out.append((float(x), float(e.mean_at_k)))
    return sorted(out, key=lambda p: p[0])  # stable: points at one x keep schedule order, the last one counts


def _at(points: list[tuple[float, float]], x: float) -> float:
    """The step function's value at ``x``: the last point at or before it."""
    xs = [p[0] for p in points]
    return points[bisect.bisect_right(xs, x) - 1][1]


def seed_band(group: str, curves: Sequence[list[tuple[float, float]]], axis: Axis, confidence: float) -> Band | None:
    """The group's mean over runs on the union of their points, where every run has started and none has ended."""
    curves = [c for c in curves if c]
    if not curves:
        return None
    start = max(c[0][0] for c in curves)
    end = min(c[-1][0] for c in curves)
    grid = sorted({x for c in curves for x, _ in c if start <= x <= end})
    xs, mean, lo, hi = [], [], [], []
    for x in grid:
        iv = mean_interval([_at(c, x) for c in curves], confidence)
        xs.append(x)
        mean.append(iv.mean)
        lo.append(iv.mean if iv.lo is None else iv.lo)
        hi.append(iv.mean if iv.hi is None else iv.hi)
    one = len(curves) == 1
    return Band(
        group, axis, tuple(xs), tuple(mean), None if one else tuple(lo), None if one else tuple(hi), len(curves)
    )


# ----- pairs --------------------------------------------------------------------------------------


def group_items(runs: Sequence[CompareRun]) -> dict[str, float]:
    """Item id -> the item's final score averaged over the runs that have it (every run of a group is
    evaluated on the same test items: their union is taken, each item over the runs that scored it)."""
    sums: dict[str, list[float]] = {}
    for r in runs:
        for item, score in r.items.items():
            sums.setdefault(item, []).append(score)
    return {item: float(np.mean(v)) for item, v in sums.items()}


def paired_bootstrap(
    a: Mapping[str, float],
    b: Mapping[str, float],
    *,
    names: tuple[str, str] = ("a", "b"),
    confidence: float = CONFIDENCE,
    resamples: int = RESAMPLES,
    seed: int = 0,
) -> PairedDiff:
    """mean(a - b) over the items both score, with scipy's paired percentile bootstrap interval."""
    from scipy import stats

    shared = sorted(set(a) & set(b))
    if not shared:
        return PairedDiff(*names, 0, math.nan, None, None, confidence, resamples, "no test item in common")
    x = np.array([a[i] for i in shared], dtype=float)
    y = np.array([b[i] for i in shared], dtype=float)
    diff = float(np.mean(x - y))
    if len(shared) < 2:
        return PairedDiff(*names, 1, diff, None, None, confidence, resamples, "one item: no interval")
    if np.ptp(x - y) == 0.0:  # every resample gives the same difference
        return PairedDiff(*names, len(shared), diff, diff, diff, confidence, resamples)

    def statistic(u: np.ndarray, v: np.ndarray, axis: int = -1) -> np.ndarray:
        return np.mean(u - v, axis=axis)

    res = stats.bootstrap(
        (x, y),
        statistic,
        paired=True,
        vectorized=True,
        n_resamples=resamples,
        confidence_level=confidence,
        method="percentile",
        rng=np.random.default_rng(seed),
    )
    ci = res.confidence_interval
    return PairedDiff(*names, len(shared), diff, float(ci.low), float(ci.high), confidence, resamples)


# ----- the whole comparison -----------------------------------------------------------------------


def compare(
    runs: Sequence[CompareRun],
    *,
    confidence: float = CONFIDENCE,
    resamples: int = RESAMPLES,
    seed: int = 0,
) -> Comparison:
    """Groups in first-seen order, a band per group and axis, and every pair of groups."""
    if not 0 < confidence < 1:
        raise ValueError(f"confidence {confidence}: give a level between 0 and 1 (e.g. 0.95)")
    groups: dict[str, list[CompareRun]] = {}
    for r in runs:
        groups.setdefault(r.group, []).append(r)
    notes: list[str] = []
    summaries, bands = [], []
    for name, members in groups.items():
        best = [m.series.best.mean_at_k for m in members if m.series.best is not None]
        final = [m.series.final.mean_at_k for m in members if m.series.final is not None]
        points = [sum(1 for e in m.series.evals if e.mean_at_k is not None and not e.flagged) for m in members]
        seeds = [m.seed for m in members]
        if len(set(seeds)) < len(seeds):
            notes.append(f"{name}: runs share a seed ({', '.join(map(str, seeds))}): they are not independent repeats")
        summaries.append(
            GroupSummary(
                group=name,
                condition=members[0].condition,
                runs=tuple(m.label for m in members),
                seeds=tuple(seeds),
                best=mean_interval(best, confidence) if best else None,
                final=mean_interval(final, confidence) if final else None,
                points_min=min(points),
                points_max=max(points),
                rollouts_spent=float(np.mean([m.series.rollouts_spent for m in members])),
            )
        )
        for axis in Axis:
            band = seed_band(name, [curve(m.series, axis) for m in members], axis, confidence)
            if band is not None:
                bands.append(band)
        missing = [m.label for m in members if not m.items]
        if missing:
            notes.append(f"{name}: no per-item results at the final point of {', '.join(missing)}")
    pairs = [
        paired_bootstrap(
            group_items(groups[a]),
            group_items(groups[b]),
            names=(a, b),
            confidence=confidence,
            resamples=resamples,
            seed=seed,
        )
        for a, b in itertools.combinations(groups, 2)
    ]
    return Comparison(tuple(summaries), tuple(bands), tuple(pairs), tuple(notes))


# ----- one pair of runs, item by item -------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class ItemRow:
    item: str
    a: float | None
    b: float | None


@dataclasses.dataclass(frozen=True)
class ItemBreakdown:
    """Which test items each of two runs solves at its final point (an item is solved when its mean reward > 0.5)."""

    a: str
    b: str
    rows: tuple[ItemRow, ...]
    both: int
    only_a: int
    only_b: int
    neither: int

    def to_dict(self) -> dict[str, Any]:
        return _camel(dataclasses.asdict(self))


#: an item counts as solved by a run when its mean reward over the k samples is above this
SOLVED_ABOVE = 0.5


def item_breakdown(a: CompareRun, b: CompareRun) -> ItemBreakdown:
    """Rows sorted by what differs first (solved by one run only), then by item id."""
    ids = sorted(set(a.items) | set(b.items))
    rows = [ItemRow(i, a.items.get(i), b.items.get(i)) for i in ids]

    def solved(v: float | None) -> bool:
        return v is not None and v > SOLVED_ABOVE

    counts = {(True, True): 0, (True, False): 0, (False, True): 0, (False, False): 0}
    for r in rows:
        counts[(solved(r.a), solved(r.b))] += 1
    rows.sort(key=lambda r: (solved(r.a) == solved(r.b), r.item))
    return ItemBreakdown(
        a.label,
        b.label,
        tuple(rows),
        both=counts[(True, True)],
        only_a=counts[(True, False)],
        only_b=counts[(False, True)],
        neither=counts[(False, False)],
    )
