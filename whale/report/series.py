"""From a run's wire records to one typed :class:`RunSeries`: what every figure, table and exporter draws.

Pure: no I/O, no plotting. :mod:`whale.report.source` reads the records from a store
(:class:`RunRecords`: the spec, the status when the store has one, each main phase's metrics lines and
result, each evaluation's result); :func:`build_series` lays them on the two axes the paper uses —
training rollouts spent and global RSFT steps.

The status is the truth when there is one (``status.json``, written by the local runner): evaluation
points, their rollouts and the best point are taken from it as they are, so a report's table shows what
``whale status`` shows. A cluster run keeps its status on the WhaleRun object, not in the store; then the
same values are reconstructed from the store alone, the way ``decide()`` computes them: phases in run
order (cycle, weight before harness), each phase's rollouts from its result (or its metrics lines while it
runs), an evaluation's rollouts from the phase it follows (mh_only's evaluation of the harness accepted at
iteration i: the rollouts by the end of that iteration), and the best point is the first highest mean@k.

The headline both ways: ``best`` is the best mean@k over every evaluation point (the paper's figure),
``final`` the mean@k of the last evaluation point in schedule order — the agent the run ends with. A
condition evaluated more often has more chances at a high ``best``; every condition has one ``final``.
"""

from __future__ import annotations

import bisect
import dataclasses
import enum
import math
from collections.abc import Mapping, Sequence
from typing import Any

from whale.core.layout import PhaseId
from whale.core.protocol import (
    EvalResult,
    HarnessIterationMetrics,
    HarnessPhaseResult,
    PhaseKind,
    WeightPhaseResult,
    WeightStepMetrics,
)
from whale.core.spec import WhaleRunSpec
from whale.core.status import WhaleRunStatus
from whale.cost import held_gpus
from whale.report.paper import PaperNumber, paper_number

_AFTER_ORDER = {"start": 0, "weight": 1, "harness": 2}


class StatusSource(str, enum.Enum):
    """Where a series' evaluation points and best point come from."""

    STATUS = "status"  #: the run's status.json (local runner)
    STORE = "store"  #: reconstructed from phase results (a cluster run: the status is on the object)


def _phase_id(phase: str) -> PhaseId | None:
    """The identity a store key names (``whale.core.layout.PhaseId``, the one parser of phase keys), or None."""
    try:
        return PhaseId.parse(phase)
    except ValueError:
        return None


def parse_main_phase(phase: str) -> tuple[int, PhaseKind] | None:
    """``c03-harness`` -> (3, HARNESS); anything else -> None."""
    pid = _phase_id(phase)
    if pid is None or pid.kind not in (PhaseKind.WEIGHT, PhaseKind.HARNESS):
        return None
    return pid.cycle, pid.kind


def parse_eval_phase(phase: str) -> tuple[int, int, str] | None:
    """``eval-c02-s000088-weight`` -> (2, 88, "weight"); anything else -> None."""
    pid = _phase_id(phase)
    if pid is None or pid.kind is not PhaseKind.EVAL or pid.step is None or pid.after is None:
        return None
    return pid.cycle, pid.step, pid.after


def eval_iteration(phase: str) -> int | None:
    """``eval-c01-s000000-harness-i0007`` -> 7 (mh_only's harness accepted at iteration 7); else None."""
    pid = _phase_id(phase)
    return pid.iteration if pid is not None and pid.kind is PhaseKind.EVAL else None


def run_order(phase: str) -> tuple[int, int]:
    """Sort key of main phases in the order a run executes them: by cycle, the weight phase first."""
    parsed = parse_main_phase(phase)
    if parsed is None:
        raise ValueError(f"not a main phase key: {phase!r} (expected cNN-weight or cNN-harness)")
    cycle, kind = parsed
    return cycle, 0 if kind is PhaseKind.WEIGHT else 1


# ----- what the store holds ---------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class PhaseRecords:
    """One main phase as the store holds it."""

    phase: str
    kind: PhaseKind
    weight_metrics: tuple[WeightStepMetrics, ...] = ()
    harness_metrics: tuple[HarnessIterationMetrics, ...] = ()
    #: None while the phase runs (no result.json yet)
    result: WeightPhaseResult | HarnessPhaseResult | None = None


@dataclasses.dataclass(frozen=True)
class RunRecords:
    """Everything a report reads of one run: wire models only."""

    name: str
    #: where the run lives, e.g. ``file:///…/runs/r1`` or ``s3://bucket/prefix/runs/r1``
    source: str
    spec: WhaleRunSpec
    #: None for a cluster run (its status is on the WhaleRun object)
    status: WhaleRunStatus | None
    phases: tuple[PhaseRecords, ...] = ()
    #: eval phase key -> its result
    evals: Mapping[str, EvalResult] = dataclasses.field(default_factory=dict)


# ----- what a report draws ---------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class EvalSample:
    """One test evaluation: mean@k of (checkpoint, harness) at a point of the run."""

    phase: str
    cycle: int
    #: global RSFT step of the evaluated checkpoint
    step: int
    after: str
    #: training rollouts spent when the evaluated point was reached
    rollouts: int
    #: None while the evaluation is owed but not finished
    mean_at_k: float | None
    harness: str | None = None
    checkpoint: str | None = None
    #: mh_only: the search iteration whose accepted harness this evaluates
    iteration: int | None = None
    #: flagged for reward integrity (never the best; the notes say why)
    flagged: bool = False
    #: measured wall hours of the training work (weight steps, harness iterations) done by this point
    hours: float = 0.0
    #: those hours x the GPUs each phase held (``whale.cost.held_gpus``): 0 for a CPU run
    gpu_hours: float = 0.0


@dataclasses.dataclass(frozen=True)
class WeightStep:
    """One RSFT step of a weight phase."""

    phase: str
    #: global step (1-based)
    step: int
    epoch: float
    reward_mean: float
    #: fraction of the step's rollouts kept for SFT (reward above the threshold)
    kept_fraction: float
    kept: int
    loss: float | None
    learning_rate: float
    #: training rollouts spent at the end of this step (the whole run's, not the phase's)
    rollouts: int
    #: wall time of the step: sampling + training + weight sync
    seconds: float


@dataclasses.dataclass(frozen=True)
class HarnessIteration:
    """One Meta-Harness iteration of a harness phase."""

    phase: str
    cycle: int
    #: iteration within its phase (1 = the incoming harness's re-evaluation)
    iteration: int
    #: iteration counted over the whole run (1-based), the x axis of the harness-score panel
    index: int
    #: the phase archive's best D_harness score after this iteration
    best_score: float
    best_candidate: str
    #: scores of the candidates proposed in this iteration (unscored ones left out)
    candidate_scores: tuple[float, ...]
    #: training rollouts spent at the end of this iteration (the whole run's)
    rollouts: int
    #: wall time of the iteration (proposing and scoring); 0 when its metrics line predates the field
    seconds: float = 0.0


@dataclasses.dataclass(frozen=True)
class PhaseSpan:
    """Where one main phase lies on both x axes (the shaded bands of the figures)."""

    phase: str
    kind: PhaseKind
    cycle: int
    rollouts_start: int
    rollouts_end: int
    step_start: int
    step_end: int
    #: False while the phase runs (no result yet)
    done: bool
    stopped_by: str | None = None
    #: harness phases: the accepted harness and its D_harness score
    accepted_harness: str | None = None
    accepted_score: float | None = None


@dataclasses.dataclass(frozen=True)
class BestPoint:
    """One headline point of a run: its best test mean@k (the paper's number) or its final one, and where."""

    mean_at_k: float
    k: int
    phase: str
    cycle: int
    step: int
    rollouts: int
    after: str | None = None
    harness: str | None = None
    checkpoint: str | None = None
    iteration: int | None = None


@dataclasses.dataclass(frozen=True)
class RunSeries:
    """One run laid out for drawing: every series and the summary row."""

    name: str
    #: a label unique among the runs of one report (the name, or name@store when names repeat)
    label: str
    source: str
    domain: str
    condition: str
    #: (E in epochs or steps as the spec gives it, I); None for conditions without cycles
    schedule: str | None
    #: k of mean@k
    k: int
    #: Pending / Running / Succeeded / ...; None when the status is not in the store
    run_phase: str | None
    status_source: StatusSource
    evals: tuple[EvalSample, ...]
    weight_steps: tuple[WeightStep, ...]
    harness_iterations: tuple[HarnessIteration, ...]
    phases: tuple[PhaseSpan, ...]
    #: the best test mean@k over every evaluation point
    best: BestPoint | None
    #: the last finished evaluation point in schedule order: the agent the run ends with (once it ended)
    final: BestPoint | None
    #: True when ``final`` is the end of the run (it succeeded); False: the latest point so far
    final_is_end: bool
    rollouts_spent: int
    #: global RSFT steps reached
    steps: int
    total_steps: int | None
    #: measured wall hours of the weight steps (sampling + training + sync), from the metrics lines
    weight_hours: float
    #: measured wall hours of the training work: weight steps and harness iterations (evaluations not counted)
    hours: float
    #: GPU-hours of that work: each step's or iteration's wall time x the GPUs its phase's pods hold
    #: (``whale.cost.held_gpus``, the rule ``whale plan`` prices with); 0 for a CPU run
    gpu_hours: float
    #: GPUs a weight step and a harness iteration held (the spec's rule; 0 when each ran on cpu or none ran)
    weight_gpus: int
    harness_gpus: int
    paper: PaperNumber | None
    notes: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        """camelCase, JSON-ready (enums as their values), like every other wire form of the project."""
        return _camel(dataclasses.asdict(self))


def _camel(value: Any) -> Any:
    if isinstance(value, dict):
        return {_to_camel(str(k)): _camel(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_camel(v) for v in value]
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, float) and not math.isfinite(value):
        return None  # a diverged loss: JSON has no NaN
    return value


def _to_camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(part[:1].upper() + part[1:] for part in rest)


# ----- building ---------------------------------------------------------------------------------------


def schedule_label(spec: WhaleRunSpec) -> str | None:
    """``(0.6, 6)`` (E in epochs) or ``(4 steps, 2)`` for ``whale``; ``adaptive`` for adaptive_whale."""
    sched = spec.experiment.schedule
    if spec.condition.value == "whale":
        e = (
            f"{sched.weight_epochs_per_cycle:g}"
            if sched.weight_epochs_per_cycle is not None
            else f"{sched.weight_steps_per_cycle} steps"
        )
        return f"({e}, {sched.harness_iterations_per_cycle})"
    if spec.condition.value == "adaptive_whale":
        return "adaptive"
    return None


def _ordered_phases(records: RunRecords) -> list[PhaseRecords]:
    by_key = {p.phase: p for p in records.phases}
    order: list[str] = []
    if records.status is not None:
        order = [p for p in records.status.completed_phases if p in by_key]
        if records.status.active_phase in by_key and records.status.active_phase not in order:
            order.append(records.status.active_phase)
    order += sorted((p for p in by_key if p not in order), key=run_order)
    return [by_key[p] for p in order]


def _phase_rollouts(p: PhaseRecords) -> int:
    if p.result is not None:
        return p.result.rollouts
    metrics = p.weight_metrics if p.kind is PhaseKind.WEIGHT else p.harness_metrics
    return sum(m.rollouts for m in metrics)


def build_series(records: RunRecords, label: str | None = None) -> RunSeries:
    """Lay one run's records on the rollouts and steps axes; see the module docstring for the rules."""
    spec, status = records.spec, records.status
    spans: list[PhaseSpan] = []
    steps: list[WeightStep] = []
    iterations: list[HarnessIteration] = []
    rollouts = step = 0
    gpus = held_gpus(spec)
    spent = _Spent()
    for p in _ordered_phases(records):
        cycle = run_order(p.phase)[0]
        start_rollouts, start_step = rollouts, step
        if p.kind is PhaseKind.WEIGHT:
            for m in p.weight_metrics:
                rollouts += m.rollouts
                step = max(step, m.step)
                steps.append(
                    WeightStep(
                        phase=p.phase,
                        step=m.step,
                        epoch=m.epoch,
                        reward_mean=m.reward_mean,
                        kept_fraction=m.acceptance_rate,
                        kept=m.kept,
                        loss=m.loss,
                        learning_rate=m.learning_rate,
                        rollouts=rollouts,
                        seconds=m.seconds_sampling + m.seconds_training + m.seconds_syncing,
                    )
                )
                spent.add(rollouts, steps[-1].seconds, 0 if m.device == "cpu" else gpus.weight, PhaseKind.WEIGHT)
            if isinstance(p.result, WeightPhaseResult):
                step = max(step, p.result.final_step)
        else:
            for h in sorted(p.harness_metrics, key=lambda h: h.iteration):
                rollouts += h.rollouts
                iterations.append(
                    HarnessIteration(
                        phase=p.phase,
                        cycle=cycle,
                        iteration=h.iteration,
                        index=len(iterations) + 1,
                        best_score=h.best_score,
                        best_candidate=h.best_candidate,
                        candidate_scores=tuple(c.score for c in h.candidates if c.score is not None),
                        rollouts=rollouts,
                        seconds=h.seconds,
                    )
                )
                spent.add(rollouts, h.seconds, 0 if h.device == "cpu" else gpus.harness, PhaseKind.HARNESS)
        # the result's count is the one decide() adds up; metrics lines cover a running phase
        rollouts = start_rollouts + _phase_rollouts(p)
        result = p.result
        spans.append(
            PhaseSpan(
                phase=p.phase,
                kind=p.kind,
                cycle=cycle,
                rollouts_start=start_rollouts,
                rollouts_end=rollouts,
                step_start=start_step,
                step_end=step,
                done=result is not None,
                stopped_by=result.stopped_by if result is not None else None,
                accepted_harness=result.accepted_harness if isinstance(result, HarnessPhaseResult) else None,
                accepted_score=result.accepted_score if isinstance(result, HarnessPhaseResult) else None,
            )
        )

    k = spec.experiment.evaluation.samples_per_item
    notes: list[str] = []
    final: BestPoint | None = None
    if status is not None:
        evals = [
            EvalSample(
                phase=e.phase,
                cycle=e.cycle,
                step=e.step,
                after=e.after,
                rollouts=e.rollouts_at,
                mean_at_k=e.mean_at_k,
                harness=e.harness,
                checkpoint=e.checkpoint,
                iteration=e.iteration,
                flagged=e.flagged,
            )
            for e in status.evals
        ]
        best = _point(status.best)
        final = _point(status.final)
        run_phase: str | None = status.phase.value
        rollouts_spent = status.rollouts_spent
        total_steps = status.total_steps
        steps_reached = status.step
        source = StatusSource.STATUS
    else:
        evals = _evals_from_store(records, spans, steps, iterations)
        best = _first_best(evals, records.evals)
        run_phase = None
        rollouts_spent = rollouts
        total_steps = None
        steps_reached = step
        source = StatusSource.STORE
        notes.append(
            "no status.json in the store (a cluster run keeps its status on the WhaleRun object): "
            "evaluation points and the best point are reconstructed from the phase results"
        )
    evals = [
        dataclasses.replace(e, hours=spent.hours_at(e.rollouts), gpu_hours=spent.gpu_hours_at(e.rollouts))
        for e in evals
    ]
    if final is None:  # a run still going (or one whose status predates status.final): the latest point
        final = _last_point(evals, records.evals, k)
    if best is not None:
        k = best.k
    elif records.evals:
        k = next(iter(records.evals.values())).k
    for key, res in sorted(records.evals.items()):
        notes += [f"{key}: {note}" for note in res.notes]
        if res.integrity_flags:
            notes.append(f"{key}: FLAGGED for reward integrity (never the best): {'; '.join(res.integrity_flags)}")
    return RunSeries(
        name=records.name,
        label=label or records.name,
        source=records.source,
        domain=spec.domain,
        condition=spec.condition.value,
        schedule=schedule_label(spec),
        k=k,
        run_phase=run_phase,
        status_source=source,
        evals=tuple(sorted(evals, key=_eval_order)),
        weight_steps=tuple(steps),
        harness_iterations=tuple(iterations),
        phases=tuple(spans),
        best=best,
        final=final,
        final_is_end=run_phase == "Succeeded",
        rollouts_spent=rollouts_spent,
        steps=steps_reached,
        total_steps=total_steps,
        weight_hours=sum(s.seconds for s in steps) / 3600.0,
        hours=spent.hours_at(None),
        gpu_hours=spent.gpu_hours_at(None),
        weight_gpus=spent.held.get(PhaseKind.WEIGHT, 0),
        harness_gpus=spent.held.get(PhaseKind.HARNESS, 0),
        paper=paper_number(spec),
        notes=tuple(notes),
    )


class _Spent:
    """The training work done so far, unit by unit (a weight step, a harness iteration), in schedule order: the
    run's rollouts after each unit, and its cumulative wall and GPU seconds. An evaluation that looks at the point
    reached with R rollouts spent sits after every unit that ended at R or before."""

    def __init__(self) -> None:
        self.rollouts: list[int] = []
        self.seconds: list[float] = []
        self.gpu_seconds: list[float] = []
        #: the most GPUs a unit of each kind held
        self.held: dict[PhaseKind, int] = {}

    def add(self, rollouts: int, seconds: float, gpus: int, kind: PhaseKind) -> None:
        self.held[kind] = max(self.held.get(kind, 0), gpus)
        self.rollouts.append(rollouts)
        self.seconds.append((self.seconds[-1] if self.seconds else 0.0) + seconds)
        self.gpu_seconds.append((self.gpu_seconds[-1] if self.gpu_seconds else 0.0) + seconds * gpus)

    def _index(self, rollouts: int | None) -> int:
        """The last unit ended with at most ``rollouts`` spent (None: every unit); -1: none."""
        if rollouts is None:
            return len(self.rollouts) - 1
        return bisect.bisect_right(self.rollouts, rollouts) - 1

    def hours_at(self, rollouts: int | None) -> float:
        i = self._index(rollouts)
        return self.seconds[i] / 3600.0 if i >= 0 else 0.0

    def gpu_hours_at(self, rollouts: int | None) -> float:
        i = self._index(rollouts)
        return self.gpu_seconds[i] / 3600.0 if i >= 0 else 0.0


def _eval_order(e: EvalSample) -> tuple[int, int, int, int]:
    """Schedule order, as ``whale.core.alternation.schedule_order`` sorts the status's points."""
    return e.rollouts, e.step, _AFTER_ORDER[e.after], e.iteration or 0


def _point(b: Any) -> BestPoint | None:
    """A status ``BestEval`` as a :class:`BestPoint`."""
    if b is None:
        return None
    after = parse_eval_phase(b.phase)
    return BestPoint(
        mean_at_k=b.mean_at_k,
        k=b.k,
        phase=b.phase,
        cycle=b.cycle,
        step=b.step,
        rollouts=b.rollouts_at,
        after=after[2] if after else None,
        harness=b.harness,
        checkpoint=b.checkpoint,
        iteration=b.iteration,
    )


def _sample_point(e: EvalSample, k: int) -> BestPoint:
    return BestPoint(
        mean_at_k=e.mean_at_k or 0.0,
        k=k,
        phase=e.phase,
        cycle=e.cycle,
        step=e.step,
        rollouts=e.rollouts,
        after=e.after,
        harness=e.harness,
        checkpoint=e.checkpoint,
        iteration=e.iteration,
    )


def _last_point(evals: Sequence[EvalSample], results: Mapping[str, EvalResult], k: int) -> BestPoint | None:
    """The last evaluated point in schedule order (the run's final one once it has ended)."""
    done = [e for e in evals if e.mean_at_k is not None]
    if not done:
        return None
    last = max(done, key=_eval_order)
    return _sample_point(last, results[last.phase].k if last.phase in results else k)


def _evals_from_store(
    records: RunRecords,
    spans: Sequence[PhaseSpan],
    steps: Sequence[WeightStep],
    iterations: Sequence[HarnessIteration] = (),
) -> list[EvalSample]:
    out = []
    for key, res in records.evals.items():
        parsed = parse_eval_phase(key)
        if parsed is None:
            continue
        cycle, step, after = parsed
        it = eval_iteration(key)
        out.append(
            EvalSample(
                phase=key,
                cycle=cycle,
                step=step,
                after=after,
                rollouts=_rollouts_at(cycle, step, after, spans, steps, it, iterations),
                mean_at_k=res.mean_at_k,
                harness=res.harness,
                checkpoint=res.checkpoint,
                iteration=it,
                flagged=bool(res.integrity_flags),
            )
        )
    return out


def _rollouts_at(
    cycle: int,
    step: int,
    after: str,
    spans: Sequence[PhaseSpan],
    steps: Sequence[WeightStep],
    iteration: int | None = None,
    iterations: Sequence[HarnessIteration] = (),
) -> int:
    """Training rollouts spent when the point an evaluation looks at was reached (as ``decide()`` counts)."""
    if after == "start":
        return 0
    if after == "harness" and iteration is not None:  # mh_only: the end of that search iteration
        for h in iterations:
            if h.cycle == cycle and h.iteration == iteration:
                return h.rollouts
    if after == "harness":
        for span in spans:
            if span.kind is PhaseKind.HARNESS and span.cycle == cycle:
                return span.rollouts_end
        return 0
    for s in steps:
        if s.step == step:
            return s.rollouts
    ends = [span.rollouts_end for span in spans if span.kind is PhaseKind.WEIGHT and span.step_end == step]
    return ends[-1] if ends else 0


def _first_best(evals: Sequence[EvalSample], results: Mapping[str, EvalResult]) -> BestPoint | None:
    best: EvalSample | None = None
    for e in sorted(evals, key=_eval_order):
        if e.mean_at_k is not None and not e.flagged and (best is None or e.mean_at_k > (best.mean_at_k or 0.0)):
            best = e
    if best is None or best.mean_at_k is None:
        return None
    return _sample_point(best, results[best.phase].k)


def unique_labels(names: Sequence[tuple[str, str]]) -> list[str]:
    """Labels for (run name, store uri) pairs: the name, or ``name@store`` where a name repeats."""
    counts: dict[str, int] = {}
    for name, _ in names:
        counts[name] = counts.get(name, 0) + 1
    return [name if counts[name] == 1 else f"{name}@{store}" for name, store in names]
