"""A simulated world for the state machine (a test double of controller + workloads).

It applies ``decide``'s actions the way a controller would and makes every started phase write
what a real workload writes (metrics, checkpoints, result), with rewards/scores from functions
the test chooses. No I/O, no clock."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from whale.core import layout
from whale.core.adaptive import harness_stop_iteration, weight_stop_step
from whale.core.alternation import (
    Child,
    ChildState,
    Fail,
    Finish,
    Observations,
    StartPhase,
    StopPhase,
    Transition,
    decide,
)
from whale.core.layout import PhaseId
from whale.core.protocol import PhaseKind, PhaseMetrics, WeightStepMetrics, parse_metrics_line
from whale.core.spec import WhaleRunSpec
from whale.core.status import WhaleRunStatus

RUN = "sim"


def parsed(metrics: dict[str, list[dict[str, Any]]]) -> dict[str, tuple[PhaseMetrics, ...]]:
    """Metrics lines as the observer hands them to ``decide``: each parsed into its phase kind's model."""
    return {k: tuple(parse_metrics_line(PhaseId.parse(k).kind, m) for m in v) for k, v in metrics.items()}


def weight_line(step: int, reward: float, kept: int = 1, rollouts: int = 16) -> dict[str, Any]:
    """A weight phase's metrics line (the wire form), with the numbers the state machine reads."""
    return WeightStepMetrics(
        step=step,
        epoch=step / 10,
        reward_mean=reward,
        acceptance_rate=reward,
        kept=kept,
        loss=0.5,
        learning_rate=1e-7,
        rollouts=rollouts,
    ).to_wire()


@dataclass
class World:
    split_sizes: dict[str, int]
    reward: Callable[[int], float] = lambda step: 0.5  # training reward of a global step
    best_score: Callable[[int, int], float] = lambda cycle, it: 0.1 * it  # archive best after iteration
    eval_mean: Callable[[int, str], float] = lambda step, after: step / 100
    #: mh_only's evaluations of the harness accepted at an iteration (None: ``eval_mean``)
    iteration_mean: Callable[[int], float] | None = None
    fail_times: dict[str, int] = field(default_factory=dict)  # phase -> attempts that fail first
    preempt_times: dict[str, int] = field(default_factory=dict)
    stop_at_step: dict[str, int] = field(default_factory=dict)  # phase -> global step where it halts (still running)
    stop_at_iteration: dict[str, int] = field(default_factory=dict)  # phase -> iteration where it halts (running)
    children: dict[str, Child] = field(default_factory=dict)
    results: dict[str, dict[str, Any]] = field(default_factory=dict)
    metrics: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    checkpoints: set[int] = field(default_factory=set)
    requests: dict[str, Any] = field(default_factory=dict)
    started: list[tuple[str, int]] = field(default_factory=list)
    stops: list[str] = field(default_factory=list)
    running: set[str] = field(default_factory=set)

    def observe(self, status: WhaleRunStatus) -> Observations:
        return Observations(
            run=RUN,
            children=dict(self.children),
            results=dict(self.results),
            metrics=parsed(self.metrics),
            checkpoints=frozenset(self.checkpoints),
            split_sizes=self.split_sizes,
            now="2026-01-01T00:00:00Z",
        )

    def apply(self, decision: Transition) -> None:
        for action in decision.actions:
            if isinstance(action, StartPhase):
                req = action.request
                self.requests[req.phase] = req
                self.started.append((req.phase, req.attempt))
                self.children[req.phase] = Child(ChildState.RUNNING)
                self.running.add(req.phase)
            elif isinstance(action, StopPhase):
                self.stops.append(action.phase)

    def progress(self) -> None:
        """Every running child makes progress: it finishes (or fails / is preempted)."""
        for phase in sorted(self.running):
            if self.fail_times.get(phase, 0) > 0:
                self.fail_times[phase] -= 1
                self.children[phase] = Child(ChildState.FAILED, "exit code 1: boom")
                self.running.discard(phase)
                continue
            if self.preempt_times.get(phase, 0) > 0:
                self.preempt_times[phase] -= 1
                self.children[phase] = Child(ChildState.PREEMPTED, "node drained")
                self.running.discard(phase)
                continue
            req = self.requests[phase]
            if req.kind is PhaseKind.WEIGHT:
                if not self._run_weight(phase, req):
                    continue
            elif req.kind is PhaseKind.HARNESS:
                if not self._run_harness(phase, req):
                    continue
            else:
                a = req.eval
                mean = (
                    self.iteration_mean(a.iteration)
                    if a.iteration is not None and self.iteration_mean
                    else self.eval_mean(a.step, a.after)
                )
                self.results[phase] = {"meanAtK": mean, "k": 8, "items": 10}
            self.children[phase] = Child(ChildState.SUCCEEDED)
            self.running.discard(phase)

    def _run_weight(self, phase: str, req: Any) -> bool:
        a = req.weight
        lines = self.metrics.setdefault(phase, [])
        step = lines[-1]["step"] if lines else a.from_step
        halt = self.stop_at_step.get(phase)
        stopped_by = "target"
        while step < a.target_step:
            if phase in self.stops:
                stopped_by = "stop-request"
                break
            if a.stop_rule and weight_stop_step([m["rewardMean"] for m in lines], a.stop_rule) is not None:
                stopped_by = "patience"
                break
            if halt is not None and step >= halt:
                return False  # still running: the controller gets to look at the metrics
            step += 1
            lines.append(weight_line(step, self.reward(step)))
            if step in a.save_steps:
                self.checkpoints.add(step)
        self.checkpoints.add(step)
        self.results[phase] = {
            "finalStep": step,
            "checkpoint": layout.checkpoint_prefix(RUN, step),
            "rollouts": 16 * (step - a.from_step),
            "stoppedBy": stopped_by,
        }
        return True

    def _run_harness(self, phase: str, req: Any) -> bool:
        """Like the search workload: iteration 1 is the incoming harness; the accepted (best-so-far)
        candidate changes only when the archive's best score rises; every metrics line names it and its
        harness file. False: halted at ``stop_at_iteration`` (still running)."""
        a = req.harness
        lines = self.metrics.setdefault(phase, [])
        it = lines[-1]["iteration"] if lines else 0
        halt = self.stop_at_iteration.get(phase)
        while it < a.iterations:
            if a.stop_rule and harness_stop_iteration([m["bestScore"] for m in lines], a.stop_rule) is not None:
                break
            if halt is not None and it >= halt:
                return False
            it += 1
            score = self.best_score(a.cycle, it)
            best = "i01-incoming" if it == 1 else lines[-1]["bestCandidate"]
            if it > 1 and score > lines[-1]["bestScore"]:
                best = f"i{it:02d}-c1"
            lines.append(
                {
                    "iteration": it,
                    "bestScore": score,
                    "bestCandidate": best,
                    "bestHarness": f"{layout.archive_prefix(RUN, a.cycle)}/candidates/{best}/harness.py",
                    "rollouts": 4,
                }
            )
        history = [
            {
                "iteration": m["iteration"],
                "candidate": m["bestCandidate"],
                "harness": m["bestHarness"],
                "score": m["bestScore"],
                "rollouts": 4 * m["iteration"],
            }
            for n, m in enumerate(lines)
            if n == 0 or m["bestCandidate"] != lines[n - 1]["bestCandidate"]
        ]
        self.results[phase] = {
            "acceptedHarness": layout.harness_key(RUN, f"c{a.cycle:02d}-accepted"),
            "acceptedCandidate": lines[-1]["bestCandidate"],
            "acceptedScore": lines[-1]["bestScore"],
            "iterations": it,
            "rollouts": 4 * it,
            "acceptedByIteration": history,
        }
        return True


def drive(
    spec: WhaleRunSpec,
    world: World,
    status: WhaleRunStatus | None = None,
    max_calls: int = 500,
    trace: list[WhaleRunStatus] | None = None,
) -> WhaleRunStatus:
    """Run decide/apply/progress to a terminal status, like a controller would."""
    status = status or WhaleRunStatus()
    for _ in range(max_calls):
        decision = decide(spec, status, world.observe(status))
        status = decision.status
        if trace is not None:
            trace.append(status)
        world.apply(decision)
        if any(isinstance(a, (Finish, Fail)) for a in decision.actions) or status.phase.is_terminal():
            return status
        world.progress()
    raise AssertionError("the run did not terminate")


def main_phases(world: World) -> list[str]:
    return [p for p, _ in world.started if not p.startswith("eval-")]
