"""A run at one moment, as `whale run` shows it: pure functions of recorded values, no clock, no I/O.

A :class:`Frame` is what the runner reported (its :class:`~whale.runner.local.RunnerView`: the status and
the running child's request, metrics lines and progress object) stamped with the wall time and the
monotonic time. From two consecutive frames :func:`events` derives the plain lines a log shows (one per
event, ISO time first); from one frame :func:`render` builds the rich display of a terminal. ETAs come
from :class:`Pace`: the rate of progress since a counter was first seen (this session), so a resumed run's
earlier work does not make it look fast.

What the display shows of a weight step is the step that just finished *sampling*: its reward and kept
fraction come from the progress object (written before the SFT update), not from the metrics line
(written after it), so the reward is never one step behind.
"""

from __future__ import annotations

import dataclasses
from datetime import datetime
from typing import Any

from rich.console import Group, RenderableType
from rich.progress_bar import ProgressBar
from rich.table import Table
from rich.text import Text

from whale.core.protocol import (
    EvalProgress,
    EvalRequest,
    HarnessIterationMetrics,
    HarnessRequest,
    PhaseKind,
    PhaseMetrics,
    PhaseProgress,
    PhaseRequest,
    ProgressStage,
    WeightRequest,
    WeightStepMetrics,
)
from whale.core.status import RunPhase, WhaleRunStatus


@dataclasses.dataclass(frozen=True)
class ChildFrame:
    """The running child: its request, when it was launched, what it has written."""

    request: PhaseRequest
    #: monotonic seconds at launch
    started_s: float
    #: its metrics lines, parsed (``whale.control.observer.read_metrics``)
    metrics: tuple[PhaseMetrics, ...] = ()

    def steps(self) -> list[WeightStepMetrics]:
        """A weight phase's step lines, in step order."""
        return sorted((m for m in self.metrics if isinstance(m, WeightStepMetrics)), key=lambda m: m.step)

    def iterations(self) -> list[HarnessIterationMetrics]:
        return [m for m in self.metrics if isinstance(m, HarnessIterationMetrics)]

    progress: PhaseProgress | None = None

    @property
    def phase(self) -> str:
        return self.request.phase

    @property
    def kind(self) -> PhaseKind:
        return self.request.kind


@dataclasses.dataclass(frozen=True)
class RunWork:
    """The run's whole work in rollouts, from its plan (`whale plan`): training (weight steps and harness
    scoring, an upper bound when adaptive patience may end phases early) and evaluations. The run ETA counts
    these, so evaluations and harness phases still to come are in it (an ETA over weight steps alone said ~0s
    with evaluations left)."""

    training_rollouts: int
    evaluations: int
    rollouts_per_evaluation: int
    bound: bool = False

    @classmethod
    def from_plan(cls, plan: dict[str, Any]) -> RunWork:
        evaluation = plan.get("evaluation") or {}
        return cls(
            training_rollouts=int(plan.get("rollouts") or 0),
            evaluations=int(evaluation.get("count") or 0),
            rollouts_per_evaluation=int(evaluation.get("rolloutsEach") or 0),
            bound=bool(plan.get("rolloutsUpperBound")),
        )

    @property
    def total(self) -> int:
        return self.training_rollouts + self.evaluations * self.rollouts_per_evaluation


@dataclasses.dataclass(frozen=True)
class Frame:
    """One moment of a run."""

    run: str
    #: wall time (UTC), for the plain lines
    at: datetime
    #: monotonic seconds now, and when this `whale run` started
    now_s: float
    started_s: float
    status: WhaleRunStatus
    child: ChildFrame | None = None
    #: the plan's work, for the run ETA; None: the ETA counts weight steps only
    work: RunWork | None = None

    @property
    def elapsed_s(self) -> float:
        return max(0.0, self.now_s - self.started_s)


# ----- numbers ----------------------------------------------------------------------------------------


def duration(seconds: float | None) -> str:
    """``45s``, ``3m12s``, ``2h05m``, ``3d04h``; ``-`` for None."""
    if seconds is None:
        return "-"
    s = max(0, round(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 86400}d{s % 86400 // 3600:02d}h"


def stamp(at: datetime) -> str:
    """ISO 8601 UTC to the second, as every plain line starts."""
    return at.strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclasses.dataclass(frozen=True)
class Pace:
    """Progress of one counter since it was first seen: ``first`` at ``first_s`` (monotonic)."""

    first: float
    first_s: float

    def eta_s(self, done: float, total: float | None, now_s: float) -> float | None:
        """Seconds left at the rate seen since the first sighting; None before any progress."""
        if total is None or done <= self.first or now_s <= self.first_s:
            return None
        rate = (done - self.first) / (now_s - self.first_s)
        return max(0.0, (total - done) / rate)


@dataclasses.dataclass(frozen=True)
class PhaseCounts:
    """How far the running phase is, in its own unit."""

    done: int
    total: int | None
    unit: str
    #: True when ``total`` is a bound the phase may end before (adaptive patience)
    bound: bool = False


def phase_counts(child: ChildFrame) -> PhaseCounts:
    """Steps of a weight phase, iterations of a harness phase, episodes (else items) of an evaluation."""
    req = child.request
    if isinstance(req, WeightRequest):
        a = req.weight
        last = max((m.step for m in child.steps()), default=a.from_step)
        return PhaseCounts(max(0, last - a.from_step), a.target_step - a.from_step, "steps", a.stop_rule is not None)
    if isinstance(req, HarnessRequest):
        done = max((m.iteration for m in child.iterations()), default=0)
        return PhaseCounts(done, req.harness.iterations, "iterations", req.harness.stop_rule is not None)
    done, total = eval_items(child)
    p = child.progress
    if p is not None and p.stage is ProgressStage.EVALUATING and p.done is not None and p.total:
        if p.unit == "episodes":  # reported as each finishes: the finer count, for the bar and the ETA
            # (written at most every few seconds: the items' lines, k episodes each, may be ahead of it)
            per_item = p.total // total if total else 0
            return PhaseCounts(max(p.done, done * per_item), p.total, "episodes")
        done, total = max(done, p.done), total or p.total  # an older workload's items at its start
    return PhaseCounts(done, total, "items")


def eval_items(child: ChildFrame) -> tuple[int, int | None]:
    """Items done/total of an evaluation, from its metrics lines (one per chunk of items)."""
    done, total = 0, None
    for m in child.metrics:
        if isinstance(m, EvalProgress):
            done, total = max(done, m.items_done), m.items_total or total
    return done, total


def last_step_metrics(child: ChildFrame | None) -> WeightStepMetrics | None:
    if child is None or child.kind is not PhaseKind.WEIGHT:
        return None
    steps = child.steps()
    return steps[-1] if steps else None


def sampled_step(child: ChildFrame | None) -> PhaseProgress | None:
    """The weight step whose rollouts are sampled but whose metrics line is not written yet (its reward is
    known before its SFT update): what the display shows as the latest reward."""
    if child is None or child.kind is not PhaseKind.WEIGHT or child.progress is None:
        return None
    p = child.progress
    last = last_step_metrics(child)
    if p.reward_mean is None or p.step is None or (last is not None and last.step >= p.step):
        return None
    return p


@dataclasses.dataclass(frozen=True)
class Reward:
    """The latest training numbers: from the step just sampled, else from the last metrics line."""

    step: int
    reward: float
    kept: int | None
    rollouts: int | None
    kept_fraction: float | None
    loss: float | None = None
    learning_rate: float | None = None
    #: True: the step is sampled, its SFT update is still running (no loss yet)
    sampled_only: bool = False
    #: True: from the run's status, a step of an earlier phase (the running one has not reported a step yet)
    earlier_phase: bool = False


def latest_reward(child: ChildFrame | None, status: WhaleRunStatus) -> Reward | None:
    p = sampled_step(child)
    if p is not None:
        return Reward(
            p.step or 0, float(p.reward_mean or 0.0), p.kept, p.rollouts, p.acceptance_rate, sampled_only=True
        )
    last = last_step_metrics(child)
    if last is not None:
        return step_reward(last)
    if status.training_reward is not None:
        return Reward(status.step, status.training_reward, None, None, None, earlier_phase=child is not None)
    return None


def step_reward(m: WeightStepMetrics) -> Reward:
    """A step's metrics line as the numbers the display shows."""
    return Reward(m.step, m.reward_mean, m.kept, m.rollouts, m.acceptance_rate, m.loss, m.learning_rate)


def run_counts(status: WhaleRunStatus) -> PhaseCounts | None:
    """The run's progress: weight steps of the budget (harness iterations for mh_only)."""
    if status.total_steps:
        return PhaseCounts(status.step, status.total_steps, "steps")
    return None


def work_counts(frame: Frame) -> PhaseCounts | None:
    """The run's rollouts done of its plan's (:class:`RunWork`): training rollouts spent, the finished
    evaluations' and the running evaluation's episodes."""
    work = frame.work
    if work is None or not work.total:
        return None
    finished = sum(e.mean_at_k is not None for e in frame.status.evals)
    running = 0
    child = frame.child
    if (
        child is not None
        and child.kind is PhaseKind.EVAL
        and child.phase not in {e.phase for e in frame.status.evals if e.mean_at_k is not None}
    ):
        counts = phase_counts(child)
        running = counts.done if counts.unit == "episodes" else 0
    done = frame.status.rollouts_spent + finished * work.rollouts_per_evaluation + running
    return PhaseCounts(min(done, work.total), work.total, "rollouts", work.bound)


def run_eta_s(frame: Frame, paces: dict[str, Pace]) -> tuple[float | None, bool]:
    """Seconds left in the run (and whether that is a bound): at the pace of all its rollouts, evaluations
    included, when the plan is known; else at the pace of its weight steps."""
    work = work_counts(frame)
    if work is not None:
        pace = paces.get("work")
        return (pace.eta_s(work.done, work.total, frame.now_s) if pace else None), work.bound
    run = run_counts(frame.status)
    pace = paces.get("run")
    return (pace.eta_s(run.done, run.total, frame.now_s) if run and pace else None), False


# ----- words ------------------------------------------------------------------------------------------


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.0f}%"


def _num(x: Any, fmt: str = ".3f") -> str:
    return "-" if x is None else format(float(x), fmt)


def reward_words(r: Reward) -> str:
    kept = f"kept {_pct(r.kept_fraction)}"
    if r.kept is not None and r.rollouts:
        kept += f" ({r.kept}/{r.rollouts})"
    words = [f"reward {r.reward:.3f}", kept]
    if not r.sampled_only:
        words += [f"loss {_num(r.loss, '.4f')}", f"lr {_num(r.learning_rate, '.1e')}"]
    return ", ".join(words)


def stage_words(child: ChildFrame) -> str:
    """What the child does right now, from its progress object: ``sampling 120/256 rollouts``."""
    p = child.progress
    if p is None:
        return "starting"
    words = p.stage.value
    if (
        p.stage in (ProgressStage.SAMPLING, ProgressStage.TRAINING, ProgressStage.SYNCING, ProgressStage.CHECKPOINTING)
        and p.step is not None
    ):
        words += f" step {p.step}"
    if p.candidate:
        words += f" {p.candidate}"
    if p.done is not None and p.total is not None and p.stage is not ProgressStage.EVALUATING:
        words += f" ({p.done}/{p.total} {p.unit or ''})".replace(" )", ")")
    if p.stage is ProgressStage.EVALUATING and p.unit == "episodes":
        items_done, items_total = eval_items(child)
        words += f" ({items_done}/{items_total} items)" if items_total else ""
    return words


def describe_request(req: PhaseRequest) -> str:
    """What a phase was asked to do, in a few words."""
    if isinstance(req, WeightRequest):
        w = req.weight
        return (
            f"steps {w.from_step} -> {w.target_step}"
            + (" (or fewer, by patience)" if w.stop_rule else "")
            + f", harness {short_key(w.harness)}"
        )
    if isinstance(req, HarnessRequest):
        h = req.harness
        bound = "at most " if h.stop_rule else ""
        return (
            f"{bound}{h.iterations} iterations from harness {short_key(h.incoming_harness)}, weights at step {h.step}"
        )
    if isinstance(req, EvalRequest):
        a = req.eval
        return f"weights at step {a.step} (after {a.after}), harness {short_key(a.harness)}"
    return req.kind.value


def short_key(key: str | None) -> str:
    """``runs/r/harnesses/c01-accepted.py`` -> ``c01-accepted``; None -> ``h0``."""
    if key is None:
        return "h0"
    return key.rstrip("/").rsplit("/", 1)[-1].removesuffix(".py")


# ----- plain lines ------------------------------------------------------------------------------------


def events(prev: Frame | None, cur: Frame, paces: dict[str, Pace] | None = None) -> list[str]:
    """The plain lines for what changed from ``prev`` to ``cur``, each starting with ``cur``'s ISO time.
    ``paces`` (by counter name: ``run``, ``<phase>#<attempt>``) gives the ETAs; none -> no ETA."""
    paces = paces or {}
    out: list[str] = []
    s, p = cur.status, prev.status if prev else None
    run_line = None
    if p is None or s.phase != p.phase:
        run_line = f"run {cur.run}: {s.phase.value}" + (
            f" ({s.message})" if s.message and s.phase is not RunPhase.RUNNING else ""
        )
    if run_line and not s.phase.is_terminal():
        out.append(run_line)
    out += _child_events(prev.child if prev else None, cur, paces)  # the child's last lines before its end
    for phase in s.completed_phases[len(p.completed_phases) if p else len(s.completed_phases) :]:
        out.append(f"{phase} done" + _completion_words(phase, s))
    before = {e.phase: e.mean_at_k for e in (p.evals if p else s.evals)}
    for e in s.evals:
        if e.mean_at_k is not None and before.get(e.phase) is None and (p is not None):
            best = s.best
            mark = " (new best)" if best is not None and best.phase == e.phase else ""
            out.append(f"{e.phase} done: mean@{best.k if best else 'k'} {e.mean_at_k:.4f}{mark}")
    if s.empty_steps > (p.empty_steps if p else 0):  # RSFT steps that trained nothing: budget spent for nothing
        out.append(f"warning: {empty_steps_words(s)}")
    for phase, n in s.failures.items():
        if n > (p.failures.get(phase, 0) if p else n):
            out.append(f"{phase} attempt {n} failed: {s.message or s.reason or 'see its log'}")
    if run_line and s.phase.is_terminal():
        out.append(run_line)
    return [f"{stamp(cur.at)} {line}" for line in out]


def empty_steps_words(s: WhaleRunStatus) -> str:
    return (
        f"{s.empty_steps} RSFT step(s) kept no trajectory (last: step {s.last_empty_step}); "
        "SFT was skipped there, the weights did not move"
    )


def _completion_words(phase: str, s: WhaleRunStatus) -> str:
    if phase.endswith("-harness") and s.current_harness:
        score = f", score {s.harness_score:.3f}" if s.harness_score is not None else ""
        return f": accepted {short_key(s.current_harness)}{score}"
    if phase.endswith("-weight"):
        return f": step {s.checkpoint_step}"
    return ""


def _child_events(old: ChildFrame | None, cur: Frame, paces: dict[str, Pace]) -> list[str]:
    child = cur.child
    if child is None:
        return []
    out: list[str] = []
    same = old is not None and (old.phase, old.request.attempt) == (child.phase, child.request.attempt)
    seen = len(old.metrics) if same and old is not None else 0
    if not same:
        # lines already there when a child is first seen are an earlier attempt's (or an earlier `whale run`'s):
        # said once here, never printed as if they had just finished
        seen = len(child.metrics)
        done_before = _done_before(child)
        out.append(
            f"{child.phase} started (attempt {child.request.attempt}): {describe_request(child.request)}"
            + (f"; {done_before}" if done_before else "")
        )
        old = None
    counts = phase_counts(child)
    of = f"/{counts.total}" if counts.total is not None else ""
    eta = _eta_words(cur, child, counts, paces)
    if child.kind is PhaseKind.WEIGHT:
        new = [m for m in child.metrics[seen:] if isinstance(m, WeightStepMetrics)]
        for m in sorted(new, key=lambda m: m.step):
            seconds = m.seconds_sampling + m.seconds_training + m.seconds_syncing
            r = step_reward(m)
            out.append(
                f"{child.phase} step {r.step} done ({m.step - _from_step(child)}{of}): "
                f"{reward_words(r)}, {duration(seconds)}/step{eta}"
            )
        sampled = sampled_step(child)
        earlier = sampled_step(old) if old is not None else None
        reward = latest_reward(child, cur.status) if sampled is not None else None
        if sampled is not None and reward is not None and (earlier is None or earlier.step != sampled.step):
            out.append(f"{child.phase} step {sampled.step} sampled: {reward_words(reward)}")
    elif child.kind is PhaseKind.HARNESS:
        for it in child.metrics[seen:]:
            if not isinstance(it, HarnessIterationMetrics):
                continue
            out.append(
                f"{child.phase} iteration {it.iteration}{of} done: best {_num(it.best_score)} "
                f"({it.best_candidate or '-'}), {it.rollouts} rollouts{eta}"
            )
        p, q = child.progress, old.progress if old else None
        if p is not None and p.stage in (ProgressStage.PROPOSING, ProgressStage.SCORING) and p != q:
            out.append(f"{child.phase} iteration {p.iteration}: {stage_words(child)}")
    else:
        before = phase_counts(old) if old is not None else None
        known = counts.total is not None or counts.done > 0
        if known and (before is None or (counts.done, counts.total) != (before.done, before.total)):
            items = ""
            if counts.unit == "episodes":
                items_done, items_total = eval_items(child)
                items = f" ({items_done}/{items_total} items)" if items_total else ""
            out.append(f"{child.phase}: {counts.done}{of} {counts.unit}{items}{eta}")
    return out


def _done_before(child: ChildFrame) -> str:
    """What the phase had done when this child was first seen: ``resumes after step 5`` (weight),
    ``2 iterations done before`` (harness); empty when nothing."""
    if child.kind is PhaseKind.WEIGHT and child.steps():
        return f"resumes after step {max(m.step for m in child.steps())}"
    if child.kind is PhaseKind.HARNESS and child.iterations():
        return f"{max(m.iteration for m in child.iterations())} iterations done before"
    return ""


def _from_step(child: ChildFrame) -> int:
    return child.request.weight.from_step if isinstance(child.request, WeightRequest) else 0


def _eta_words(cur: Frame, child: ChildFrame, counts: PhaseCounts, paces: dict[str, Pace]) -> str:
    words = []
    pace = paces.get(child_pace_key(child))
    phase_eta = pace.eta_s(counts.done, counts.total, cur.now_s) if pace else None
    if phase_eta is not None:
        words.append(f"phase ETA {'<= ' if counts.bound else ''}{duration(phase_eta)}")
    run_eta, bound = run_eta_s(cur, paces)
    if run_eta is not None:
        words.append(f"run ETA {'<= ' if bound else '~'}{duration(run_eta)}")
    return ("; " + ", ".join(words)) if words else ""


def child_pace_key(child: ChildFrame) -> str:
    return f"{child.phase}#{child.request.attempt}"


def update_paces(paces: dict[str, Pace], frame: Frame) -> dict[str, Pace]:
    """``paces`` with the counters of ``frame`` first seen now added (existing ones kept)."""
    out = dict(paces)
    run = run_counts(frame.status)
    if run is not None and "run" not in out:
        out["run"] = Pace(run.done, frame.now_s)
    work = work_counts(frame)
    if work is not None and "work" not in out:
        out["work"] = Pace(work.done, frame.now_s)
    if frame.child is not None:
        key = child_pace_key(frame.child)
        if key not in out:
            out[key] = Pace(phase_counts(frame.child).done, frame.now_s)
    return out


# ----- the terminal display ---------------------------------------------------------------------------


def _bar(done: float, total: float | None, width: int = 30) -> RenderableType:
    if not total:
        return Text(" " * width)
    return ProgressBar(total=float(total), completed=float(min(done, total)), width=width)


def render(frame: Frame, paces: dict[str, Pace] | None = None) -> RenderableType:
    """The live display of a terminal: the run (bar, elapsed, ETA, best, rollouts), the running phase
    (bar, what it does now with its own bar, elapsed, ETA) and the latest training numbers."""
    paces = paces or {}
    s = frame.status
    run = run_counts(s)
    run_eta, bound = run_eta_s(frame, paces)
    head = Text.assemble(
        (frame.run, "bold"),
        f"  {s.phase.value}, cycle {s.cycle}, elapsed {duration(frame.elapsed_s)}"
        + (f", ETA {'<= ' if bound else '~'}{duration(run_eta)}" if run_eta is not None else ""),
    )
    bars = Table.grid(padding=(0, 1))
    bars.add_column(no_wrap=True)
    bars.add_column(no_wrap=True)
    bars.add_column()
    if run is not None:
        bars.add_row(Text("run"), _bar(run.done, run.total), Text(f"{run.done}/{run.total} steps"))
    rows: list[RenderableType] = [head]
    child = frame.child
    if child is not None:
        counts = phase_counts(child)
        pace = paces.get(child_pace_key(child))
        eta = pace.eta_s(counts.done, counts.total, frame.now_s) if pace else None
        of = f"/{counts.total}" if counts.total is not None else ""
        timing = f"{duration(frame.now_s - child.started_s)}" + (
            f", ETA {'<= ' if counts.bound else ''}{duration(eta)}" if eta is not None else ""
        )
        bars.add_row(
            Text("phase"),
            _bar(counts.done, counts.total),
            Text(f"{child.phase} (attempt {child.request.attempt}): {counts.done}{of} {counts.unit}, {timing}"),
        )
        p = child.progress
        inner: RenderableType = _bar(0, None)
        if p is not None and p.done is not None and p.total and p.stage is not ProgressStage.EVALUATING:
            inner = _bar(p.done, p.total)
        elif counts.unit == "episodes":  # the phase bar counts episodes: this one the items finished
            items_done, items_total = eval_items(child)
            inner = _bar(items_done, items_total)
        bars.add_row(Text("now"), inner, Text(stage_words(child)))
    rows.append(bars)
    best = f"best {s.best.mean_at_k:.4f} (mean@{s.best.k}, {s.best.phase})" if s.best else "best -"
    rows.append(Text(f"{best}; rollouts {s.rollouts_spent:,}"))
    reward = latest_reward(child, s) if child is None or child.kind is PhaseKind.WEIGHT else None
    if reward is not None:
        when = (
            "sampled, training"
            if reward.sampled_only
            else "done, before this phase"
            if reward.earlier_phase
            else "done"
        )
        rows.append(Text(f"step {reward.step} ({when}): {reward_words(reward)}"))
    elif child is not None and child.kind is PhaseKind.HARNESS and s.harness_score is not None:
        rows.append(Text(f"iteration {s.iteration}: best harness score {s.harness_score:.3f}"))
    if s.empty_steps:
        rows.append(Text(f"warning: {empty_steps_words(s)}", style="yellow"))
    return Group(*rows)
