"""The alternation state machine: ``decide(spec, status, observations) -> Decision``.

Pure: no I/O, no clock (the controller passes ``now``), no randomness. Both the local runner and
the Kubernetes operator call it with what they observe — the children of the current attempt of
each phase, and what the workloads wrote to the store — and apply the actions it returns. It is
level-based: calling it twice with the same inputs gives the same answer, and a controller that
restarts at any moment resumes from the status plus the store.

Semantics (REFERENCE.md, "the seed's alternation loop"):

* cycle k = 1, 2, ...: a weight phase trains *up to* target = min(step + E, T) (``whale``) or up to T
  and ends early by the patience rule (``adaptive_whale``); if it reaches T the run ends without a
  harness phase; otherwise a harness phase starts from the incoming harness (its re-evaluation is
  iteration 1) under the new checkpoint, and its accepted harness is the next cycle's harness.
  The harness phase of cycle ``maxCycles`` still runs; no weight phase follows it.
* ``rsft_only``: one weight phase of T steps at h0. ``mh_only``: one harness phase at theta0 of
  ``mhOnlyIterations`` proposer iterations after the incoming (h0) evaluation.
* Iterations: a harness phase's archive iterations count the incoming re-evaluation (I = 6 is the
  incoming + 5 proposer iterations); ``mhOnlyIterations`` and the adaptive ``maxIterations`` count
  proposer iterations, as the paper does, and ``whale.schedule`` adds the incoming one.
* Evaluations: (theta0, h0) at the start, every ``interval`` steps, at the end of every weight
  phase, and after every harness phase; ``mh_only`` (``evaluation.everyAcceptedHarness``) also at
  every iteration whose accepted (best-so-far) harness changes — read from the phase's metrics while
  it runs and from its result (``acceptedByIteration``) when it is done, so it is owed either way.
  The run succeeds when the schedule is done and every owed evaluation has a result. ``best`` keeps
  the best mean@k and where it came from; ``final`` the last evaluation point in schedule order.
* RSFT steps that kept no trajectory are counted (``emptySteps``, ``lastEmptyStep``): the running
  phase's from its metrics lines (``kept: 0``), a finished phase's from its result.
* A failed attempt is retried with a new attempt number until ``retry.maxAttempts`` failures;
  a preempted attempt is retried without counting as a failure.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Union

from whale import layout
from whale.adaptive import harness_stop_iteration, weight_stop_step
from whale.protocol import (
    EvalPhaseArgs,
    EvalResult,
    HarnessPhaseArgs,
    HarnessPhaseResult,
    PhaseKind,
    PhaseRequest,
    WeightPhaseArgs,
    WeightPhaseResult,
)
from whale.schedule import ResolvedSchedule, ScheduleError, resolve
from whale.spec import (
    BestEval,
    Condition,
    EvalPoint,
    IntegrityFlagStatus,
    RunPhase,
    Stage,
    WhaleRunSpec,
    WhaleRunStatus,
)

# ----- observations -------------------------------------------------------------------------------


class ChildState(str, enum.Enum):
    """What a controller sees of the child (Job / subprocess) of a phase's current attempt."""

    ABSENT = "Absent"
    RUNNING = "Running"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"
    PREEMPTED = "Preempted"


@dataclass(frozen=True)
class Child:
    state: ChildState
    message: str = ""


ABSENT = Child(ChildState.ABSENT)


@dataclass(frozen=True)
class Observations:
    """Everything ``decide`` may know about the world.

    ``children`` is keyed by phase and describes the attempt numbered ``status.attempts[phase]``.
    ``results`` / ``metrics`` are the wire dicts the workloads wrote (result.json, metrics.jsonl).
    """

    run: str
    children: Mapping[str, Child] = field(default_factory=dict)
    results: Mapping[str, dict[str, Any]] = field(default_factory=dict)
    metrics: Mapping[str, list[dict[str, Any]]] = field(default_factory=dict)
    checkpoints: frozenset[int] = frozenset()
    split_sizes: Mapping[str, int] = field(default_factory=dict)
    now: str = ""
    generation: int | None = None


# ----- actions ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class StartPhase:
    """Create the child for ``request`` (idempotent: the name is derived from phase + attempt).
    The controller writes ``request.to_wire()`` to ``layout.request_key`` before launching."""

    request: PhaseRequest

    @property
    def phase(self) -> str:
        return self.request.phase

    @property
    def kind(self) -> PhaseKind:
        return self.request.kind

    @property
    def attempt(self) -> int:
        return self.request.attempt


@dataclass(frozen=True)
class StopPhase:
    """Ask a running workload to end cleanly (write ``layout.stop_key``)."""

    phase: str
    reason: str


@dataclass(frozen=True)
class ServeCheckpoint:
    """Inference should serve this checkpoint (None: the base model)."""

    checkpoint: str | None


@dataclass(frozen=True)
class SuspendRun:
    """Stop every child of the run; resuming relaunches the active phases from their state."""

    reason: str


@dataclass(frozen=True)
class Finish:
    reason: str


@dataclass(frozen=True)
class Fail:
    reason: str
    message: str


Action = Union[StartPhase, StopPhase, ServeCheckpoint, SuspendRun, Finish, Fail]


@dataclass(frozen=True)
class Decision:
    status: WhaleRunStatus
    actions: tuple[Action, ...] = ()

    def of_type(self, kind: type) -> list[Any]:
        return [a for a in self.actions if isinstance(a, kind)]


# ----- the machine --------------------------------------------------------------------------------


def phase_kind(phase: str) -> PhaseKind:
    if phase.startswith("eval-"):
        return PhaseKind.EVAL
    if phase.endswith("-weight"):
        return PhaseKind.WEIGHT
    if phase.endswith("-harness"):
        return PhaseKind.HARNESS
    raise ValueError(f"not a phase key: {phase!r}")


def phase_cycle(phase: str) -> int:
    head = phase.split("-")[1] if phase.startswith("eval-") else phase.split("-")[0]
    return int(head[1:])


class _Machine:
    """One ``decide`` call. Holds a mutable draft of the status; pure all the same."""

    def __init__(self, spec: WhaleRunSpec, status: WhaleRunStatus, obs: Observations, sched: ResolvedSchedule):
        self.spec, self.obs, self.sched = spec, obs, sched
        self.before = status
        self.d: dict[str, Any] = status.model_dump()
        self.actions: list[Action] = []
        self.run = obs.run
        self.owed: set[str] = {e["phase"] for e in self.d["evals"]}
        #: the complete checkpoints in the store, in step order (what mid-phase evaluations come from)
        self.checkpoint_steps: list[int] = sorted(obs.checkpoints)

    # --- helpers ---
    def status(self) -> WhaleRunStatus:
        return WhaleRunStatus.model_validate(self.d)

    def attempt(self, phase: str) -> int:
        return self.d["attempts"].setdefault(phase, 1)

    def child(self, phase: str) -> Child:
        return self.obs.children.get(phase, ABSENT)

    def fail(self, reason: str, message: str) -> None:
        self.d.update(phase=RunPhase.FAILED, reason=reason, message=message, completion_time=self.obs.now)
        self.actions.append(Fail(reason, message))

    def request(self, phase: str, **args: Any) -> PhaseRequest:
        kind = phase_kind(phase)
        return PhaseRequest(
            run=self.run,
            phase=phase,
            kind=kind,
            attempt=self.attempt(phase),
            spec=self.spec.to_wire(),
            **{kind.value: args[kind.value]},
        )

    # --- the main sequence ---
    def next_main(self) -> str | None:
        done = self.d["completed_phases"]
        cond = self.spec.condition
        if cond is Condition.MH_ONLY:
            return None if done else layout.harness_phase_key(1)
        if cond is Condition.RSFT_ONLY:
            return None if done else layout.weight_phase_key(1)
        if not done:
            return layout.weight_phase_key(1)
        last = done[-1]
        cycle = phase_cycle(last)
        if phase_kind(last) is PhaseKind.WEIGHT:
            if self.d["checkpoint_step"] >= self.sched.total_steps:
                return None
            return layout.harness_phase_key(cycle)
        if cycle >= self.sched.max_cycles:
            return None
        return layout.weight_phase_key(cycle + 1)

    def weight_range(self) -> tuple[int, int]:
        """(from step, target step) of the weight phase that starts at the current checkpoint."""
        step, total = self.d["checkpoint_step"], self.sched.total_steps
        if self.spec.condition is Condition.WHALE and self.sched.cycle_steps:
            return step, min(step + self.sched.cycle_steps, total)
        return step, total

    def weight_args(self, phase: str) -> WeightPhaseArgs:
        step, target = self.weight_range()
        return WeightPhaseArgs(
            cycle=phase_cycle(phase),
            harness=self.d["current_harness"],
            from_checkpoint=self.d["current_checkpoint"],
            from_step=step,
            target_step=target,
            save_steps=list(self.sched.eval_points_between(step, target)),
            steps_per_epoch=self.sched.steps_per_epoch,
            stop_rule=self.sched.weight_rule,
        )

    def harness_args(self, phase: str) -> HarnessPhaseArgs:
        cycle = phase_cycle(phase)
        return HarnessPhaseArgs(
            cycle=cycle,
            incoming_harness=self.d["current_harness"],
            checkpoint=self.d["current_checkpoint"],
            step=self.d["checkpoint_step"],
            iterations=self.sched.harness_iterations,
            stop_rule=self.sched.harness_rule,
            archive=layout.archive_prefix(self.run, cycle),
        )

    def main_request(self, phase: str) -> PhaseRequest:
        if phase_kind(phase) is PhaseKind.WEIGHT:
            return self.request(phase, weight=self.weight_args(phase))
        return self.request(phase, harness=self.harness_args(phase))

    def enter(self, phase: str) -> None:
        kind = phase_kind(phase)
        self.d.update(
            active_phase=phase,
            cycle=phase_cycle(phase),
            stage=Stage.WEIGHT if kind is PhaseKind.WEIGHT else Stage.HARNESS,
            iteration=0,
        )
        self.attempt(phase)

    def complete_main(self, phase: str, raw: dict[str, Any]) -> None:
        d = self.d
        if phase_kind(phase) is PhaseKind.WEIGHT:
            res = WeightPhaseResult.model_validate(raw)
            from_step = d["checkpoint_step"]
            d.update(step=res.final_step, checkpoint_step=res.final_step, current_checkpoint=res.checkpoint)
            d["rollouts_completed"] += res.rollouts
            d["empty_steps_completed"] += len(res.empty_steps)
            note_empty_steps(d, res.empty_steps)
            for s in self.checkpoint_steps:
                if from_step < s < res.final_step and self.sched.is_eval_point(s):
                    self.owe_eval(
                        phase_cycle(phase),
                        s,
                        "weight",
                        layout.checkpoint_prefix(self.run, s),
                        d["current_harness"],
                        self.rollouts_at(from_step, s, res),
                    )
            self.owe_eval(
                phase_cycle(phase),
                res.final_step,
                "weight",
                res.checkpoint,
                d["current_harness"],
                d["rollouts_completed"],
            )
        else:
            hres = HarnessPhaseResult.model_validate(raw)
            d.update(
                current_harness=hres.accepted_harness, iteration=hres.iterations, harness_score=hres.accepted_score
            )
            d["integrity_flags"] += integrity_status(phase, hres)
            before = d["rollouts_completed"]
            d["rollouts_completed"] += hres.rollouts
            covered = False
            if self.sched.evaluates_every_accepted_harness and hres.accepted_by_iteration:
                history = [(a.iteration, a.candidate, a.harness, a.rollouts) for a in hres.accepted_by_iteration]
                self.owe_acceptance_evals(phase, history, before)
                last = hres.accepted_by_iteration[-1]
                # the accepted harness is already evaluated: as its iteration's point, or (never replaced)
                # as the start point, the same (theta0, h0)
                covered = last.candidate == hres.accepted_candidate and (
                    (last.iteration >= 2 and self.in_archive(phase, last.harness))
                    or (last.iteration == 1 and self.spec.evaluation.at_start)
                )
            if self.spec.evaluation.after_harness_phase and not covered:
                self.owe_eval(
                    phase_cycle(phase),
                    d["checkpoint_step"],
                    "harness",
                    d["current_checkpoint"],
                    hres.accepted_harness,
                    d["rollouts_completed"],
                )
        d["completed_phases"].append(phase)
        d["active_phase"] = None

    def owe_acceptance_evals(
        self, phase: str, history: list[tuple[int, str, str | None, int]], rollouts_before: int
    ) -> None:
        """mh_only: an evaluation for every iteration (after the incoming one) whose accepted harness is new.

        ``history``: (iteration, accepted candidate, its harness key, the phase's rollouts by then) for
        every iteration known so far (or only the changes), in order; ``rollouts_before``: the run's
        rollouts when the phase started."""
        previous: str | None = None
        for iteration, candidate, harness, rollouts in sorted(history, key=lambda h: h[0]):
            changed = candidate != previous
            previous = candidate
            if not changed or iteration < 2 or not self.in_archive(phase, harness):
                continue
            self.owe_eval(
                phase_cycle(phase),
                self.d["checkpoint_step"],
                "harness",
                self.d["current_checkpoint"],
                harness,
                rollouts_before + rollouts,
                iteration=iteration,
            )

    def rollouts_at(self, from_step: int, step: int, res: WeightPhaseResult) -> int:
        before = self.d["rollouts_completed"] - res.rollouts
        return before + (step - from_step) * self.sched.rollouts_per_step

    def advance_main(self) -> None:
        """Absorb every finished main phase (the store is the truth) and enter the next one."""
        for _ in range(4 * self.sched.max_cycles + 4):  # bounded: a cycle has two main phases
            phase = self.d["active_phase"]
            if phase is None:
                phase = self.next_main()
                if phase is None:
                    return
                self.enter(phase)
            if phase in self.obs.results:
                self.complete_main(phase, self.obs.results[phase])
                continue
            return

    def drive_child(self, phase: str, make_request: Any) -> bool:
        """Start, retry or leave the child of ``phase``. False when the run failed."""
        child = self.child(phase)
        if child.state is ChildState.RUNNING:
            return True
        if child.state is ChildState.PREEMPTED:
            self.d["preemptions"] += 1
            self.d["attempts"][phase] = self.attempt(phase) + 1
        elif child.state in (ChildState.FAILED, ChildState.SUCCEEDED):
            # SUCCEEDED without a result (we only get here when result.json is missing) is a failure too.
            why = child.message or (
                "exited successfully without writing result.json" if child.state is ChildState.SUCCEEDED else "failed"
            )
            failures = self.d["failures"].get(phase, 0) + 1
            self.d["failures"][phase] = failures
            if failures >= self.spec.retry.max_attempts:
                self.fail("PhaseFailed", f"phase {phase} failed {failures} time(s); last: {why}")
                return False
            self.d["attempts"][phase] = self.attempt(phase) + 1
            self.d["message"] = f"phase {phase} attempt {failures} failed ({why}); retrying"
        self.actions.append(StartPhase(make_request()))
        return True

    def watch_active(self, phase: str) -> None:
        """Progress and adaptive patience of the running main phase."""
        lines = self.obs.metrics.get(phase, [])
        kind = phase_kind(phase)
        fired: int | None = None
        if kind is PhaseKind.WEIGHT:
            steps = sorted(lines, key=lambda m: m["step"])
            if steps:
                self.d["step"] = max(self.d["step"], int(steps[-1]["step"]))
                self.d["training_reward"] = float(steps[-1]["rewardMean"])
            note_empty_steps(self.d, [int(m["step"]) for m in steps if int(m.get("kept", 1)) == 0])
            if self.sched.weight_rule is not None:
                fired = weight_stop_step([float(m["rewardMean"]) for m in steps], self.sched.weight_rule)
        else:
            its = sorted(lines, key=lambda m: m["iteration"])
            if its:
                self.d["iteration"] = int(its[-1]["iteration"])
                self.d["harness_score"] = float(its[-1]["bestScore"])
            if self.sched.harness_rule is not None:
                fired = harness_stop_iteration([float(m["bestScore"]) for m in its], self.sched.harness_rule)
        if fired is not None and phase not in self.d["stop_requested"]:
            unit = "step" if kind is PhaseKind.WEIGHT else "iteration"
            self.d["stop_requested"].append(phase)
            self.actions.append(StopPhase(phase, f"adaptive patience fired after {unit} {fired} of the phase"))

    # --- evaluations ---
    def owe_eval(
        self,
        cycle: int,
        step: int,
        after: str,
        checkpoint: str | None,
        harness: str | None,
        rollouts_at: int,
        iteration: int | None = None,
    ) -> None:
        key = layout.eval_phase_key(cycle, step, after, iteration)
        if key in self.owed:
            return
        self.owed.add(key)
        self.d["evals"].append(
            EvalPoint(
                phase=key,
                cycle=cycle,
                step=step,
                after=after,
                checkpoint=checkpoint,
                harness=harness,
                rollouts_at=rollouts_at,
                iteration=iteration,
            ).model_dump()
        )

    def in_archive(self, phase: str, harness: str | None) -> bool:
        """Only a file of the phase's own archive is evaluated as its accepted harness: whatever else a
        metrics line or a result names (another run's file, a path that climbs out) is never run."""
        prefix = layout.archive_candidates_prefix(self.run, phase_cycle(phase))
        return (
            isinstance(harness, str)
            and harness.startswith(prefix)
            and harness.endswith("/harness.py")
            and ".." not in harness.split("/")
        )

    def observe_mid_phase_acceptance(self, phase: str) -> None:
        """mh_only: evaluate each newly accepted harness of the running search as soon as its iteration is
        logged (the metrics line names the candidate and its harness file in the archive)."""
        if phase_kind(phase) is not PhaseKind.HARNESS or not self.sched.evaluates_every_accepted_harness:
            return
        history = []
        spent = 0
        seen: set[int] = set()
        for line in sorted(self.obs.metrics.get(phase, []), key=lambda m: int(m["iteration"])):
            iteration = int(line["iteration"])
            if iteration in seen:
                continue
            seen.add(iteration)
            spent += int(line.get("rollouts", 0))
            history.append((iteration, str(line.get("bestCandidate", "")), line.get("bestHarness"), spent))
        if seen != set(range(1, len(seen) + 1)):
            return  # a gap: the rollouts up to an iteration are not known yet; the result will say
        self.owe_acceptance_evals(phase, history, self.d["rollouts_completed"])

    def observe_mid_phase_checkpoints(self, phase: str) -> None:
        """Evaluate checkpoints of the running weight phase as soon as they are complete."""
        if phase_kind(phase) is not PhaseKind.WEIGHT:
            return
        from_step, target = self.weight_range()
        for s in self.checkpoint_steps:
            if from_step < s < target and self.sched.is_eval_point(s):
                rollouts = self.d["rollouts_completed"] + (s - from_step) * self.sched.rollouts_per_step
                self.owe_eval(
                    phase_cycle(phase),
                    s,
                    "weight",
                    layout.checkpoint_prefix(self.run, s),
                    self.d["current_harness"],
                    rollouts,
                )

    def drive_evals(self) -> bool:
        for ev in self.d["evals"]:
            if ev["mean_at_k"] is not None:
                continue
            key = ev["phase"]
            if key in self.obs.results:
                res = EvalResult.model_validate(self.obs.results[key])
                ev["mean_at_k"] = res.mean_at_k
                ev["k"] = res.k
                self.d["last_eval_mean"] = res.mean_at_k
                best = self.d["best"]
                if best is None or res.mean_at_k > best["mean_at_k"]:
                    self.d["best"] = best_eval(ev, res).model_dump()
                continue
            point = EvalPoint.model_validate(ev)
            args = EvalPhaseArgs(
                cycle=point.cycle,
                step=point.step,
                after=point.after,
                checkpoint=point.checkpoint,
                harness=point.harness,
                iteration=point.iteration,
            )
            if not self.drive_child(key, lambda k=key, a=args: self.request(k, eval=a)):
                return False
        return True

    # --- one call ---
    def decide(self) -> Decision:
        d, obs = self.d, self.obs
        if d["phase"] == RunPhase.INTERRUPTED:  # a controller runs it again: it resumes where it stopped
            d.update(phase=RunPhase.RUNNING, reason="Resumed", message=None)
        if d["phase"] == RunPhase.PENDING:
            d.update(phase=RunPhase.RUNNING, start_time=obs.now, reason="Started", message=None)
            if self.spec.evaluation.at_start:
                self.owe_eval(0, 0, "start", None, None, 0)
        d.update(steps_per_epoch=self.sched.steps_per_epoch, total_steps=self.sched.total_steps)
        if obs.generation is not None:
            d["observed_generation"] = obs.generation

        self.advance_main()
        active = d["active_phase"]
        if active is not None:
            self.observe_mid_phase_checkpoints(active)
            self.observe_mid_phase_acceptance(active)

        if self.spec.suspend:
            if d["phase"] != RunPhase.SUSPENDED:
                d.update(phase=RunPhase.SUSPENDED, reason="Suspended", message="spec.suspend is true")
            self.actions.append(SuspendRun("spec.suspend is true"))
            return self.finish_call()
        if d["phase"] == RunPhase.SUSPENDED:
            d.update(phase=RunPhase.RUNNING, reason="Resumed", message=None)

        if active is not None:
            if not self.drive_child(active, lambda: self.main_request(active)):
                return self.finish_call()
            if self.child(active).state is ChildState.RUNNING:
                self.watch_active(active)
        if not self.drive_evals():
            return self.finish_call()

        if active is None:
            pending = [e["phase"] for e in d["evals"] if e["mean_at_k"] is None]
            if pending:
                d["stage"] = Stage.EVAL
            else:
                best = d["best"]
                final = final_eval(d["evals"], self.spec.evaluation.samples_per_item)
                d["final"] = final.model_dump() if final is not None else None
                summary = (
                    f"best mean@{best['k']} {best['mean_at_k']:.4f} at {best['phase']}" if best else "no evaluation"
                )
                if final is not None:
                    summary += f"; final mean@{final.k} {final.mean_at_k:.4f} at {final.phase}"
                d.update(
                    phase=RunPhase.SUCCEEDED,
                    stage=Stage.DONE,
                    reason="Completed",
                    message=f"schedule complete; {summary}",
                    completion_time=obs.now,
                )
                self.actions.append(Finish(f"schedule complete; {summary}"))
        return self.finish_call()

    def finish_call(self) -> Decision:
        active = self.d["active_phase"]
        running = sum(int(m.get("rollouts", 0)) for m in self.obs.metrics.get(active, [])) if active else 0
        self.d["rollouts_spent"] = self.d["rollouts_completed"] + running
        weight = active is not None and phase_kind(active) is PhaseKind.WEIGHT
        empty = sum(int(m.get("kept", 1)) == 0 for m in self.obs.metrics.get(active, [])) if weight else 0
        self.d["empty_steps"] = self.d["empty_steps_completed"] + empty
        if (
            self.d["current_checkpoint"] != self.before.current_checkpoint
            and not RunPhase(self.d["phase"]).is_terminal()
        ):
            self.actions.insert(0, ServeCheckpoint(self.d["current_checkpoint"]))
        return Decision(self.status(), tuple(self.actions))


#: where each kind of point lies among the points of one step (the harness phase follows the weight phase)
_AFTER_ORDER = {"start": 0, "weight": 1, "harness": 2}


def schedule_order(point: Mapping[str, Any]) -> tuple[int, int, int, int]:
    """Sort key of evaluation points (status entries, snake_case) in the order the run reaches them:
    by the training rollouts spent, then step, then weight before harness, then search iteration."""
    return (
        int(point["rollouts_at"]),
        int(point["step"]),
        _AFTER_ORDER[point["after"]],
        int(point.get("iteration") or 0),
    )


def best_eval(point: Mapping[str, Any], res: EvalResult) -> BestEval:
    return BestEval(
        mean_at_k=res.mean_at_k,
        k=res.k,
        phase=point["phase"],
        cycle=point["cycle"],
        step=point["step"],
        harness=point["harness"],
        checkpoint=point["checkpoint"],
        rollouts_at=point["rollouts_at"],
        iteration=point.get("iteration"),
    )


def final_eval(evals: list[dict[str, Any]], default_k: int) -> BestEval | None:
    """The last finished evaluation point in schedule order (the agent the run ends with).

    Reported beside ``best``: the best over evaluation points favours a condition evaluated more often;
    every condition has exactly one final point. ``default_k``: for points recorded without their k."""
    done = [e for e in evals if e["mean_at_k"] is not None]
    if not done:
        return None
    last = max(done, key=schedule_order)
    k = last.get("k") or default_k
    return best_eval(last, EvalResult(mean_at_k=last["mean_at_k"], k=k, items=0))


def note_empty_steps(d: dict[str, Any], steps: list[int]) -> None:
    """Keep the latest step that kept no trajectory in the status draft ``d``."""
    if steps:
        d["last_empty_step"] = max(d["last_empty_step"] or 0, max(steps))


#: flagged candidates one harness phase may put in the status (its result.json keeps them all)
MAX_STATUS_FLAGS_PER_PHASE = 20


def integrity_status(phase: str, result: HarnessPhaseResult) -> list[dict[str, Any]]:
    """A harness phase's reward-integrity flags as status entries: the accepted one first, at most
    ``MAX_STATUS_FLAGS_PER_PHASE`` (a status must stay small)."""
    flags = sorted(result.integrity_flags, key=lambda f: not f.accepted)[:MAX_STATUS_FLAGS_PER_PHASE]
    return [
        IntegrityFlagStatus(phase=phase, candidate=f.candidate, accepted=f.accepted, reasons=f.reasons).model_dump()
        for f in flags
    ]


def decide(spec: WhaleRunSpec, status: WhaleRunStatus, obs: Observations) -> Decision:
    """Advance the run one level-triggered step. See the module docstring for the semantics."""
    if status.phase.is_terminal():
        return Decision(status, ())
    try:
        sched = resolve(spec, dict(obs.split_sizes))
    except ScheduleError as exc:
        d = status.model_dump()
        d.update(phase=RunPhase.FAILED, reason="InvalidSchedule", message=str(exc), completion_time=obs.now)
        return Decision(WhaleRunStatus.model_validate(d), (Fail("InvalidSchedule", str(exc)),))
    return _Machine(spec, status, obs, sched).decide()
