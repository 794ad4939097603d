"""The alternation state machine: ``decide(spec, status, observations) -> Transition``.

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
  proposer iterations, as the paper does, and ``whale.core.schedule`` adds the incoming one.
* Evaluations: (theta0, h0) at the start, every ``interval`` steps, at the end of every weight
  phase, and after every harness phase; ``mh_only`` (``evaluation.everyAcceptedHarness``) also at
  every iteration whose accepted (best-so-far) harness changes — read from the phase's metrics while
  it runs and from its result (``acceptedByIteration``) when it is done, so it is owed either way.
  The run succeeds when the schedule is done and every owed evaluation has a result. ``best`` keeps
  the best mean@k and where it came from; ``final`` the last evaluation point in schedule order.
* RSFT steps that kept no trajectory are counted (``emptySteps``, ``lastEmptyStep``): the running
  phase's from its metrics lines (``kept: 0``), a finished phase's from its result.
* A failed attempt is retried with a new attempt number until ``retry.maxAttempts`` failures;
  a preempted attempt is retried without counting as a failure. An attempt its queue evicted is kept (Kueue
  re-admits the same child): its evictions are counted (``status.evictions``), and one more than
  ``execution.retry.maxEvictions`` fails the run.
"""

from __future__ import annotations

import enum
import functools
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from whale.core import layout
from whale.core.adaptive import harness_stop_iteration, weight_stop_step
from whale.core.layout import EvalAfter, PhaseId
from whale.core.protocol import (
    EvalPhaseArgs,
    EvalResult,
    HarnessIterationMetrics,
    HarnessPhaseArgs,
    HarnessPhaseResult,
    PhaseKind,
    PhaseMetrics,
    PhaseRequest,
    PreparePhaseArgs,
    WeightPhaseArgs,
    WeightPhaseResult,
    WeightStepMetrics,
    phase_request,
)
from whale.core.schedule import ResolvedSchedule, ScheduleError, resolve
from whale.core.spec import Condition, WhaleRunSpec
from whale.core.state import RunState, best_eval, progress_seen_message
from whale.core.status import BestEval, EvalPoint, IntegrityFlagStatus, Reason, RunPhase, Stage, WhaleRunStatus

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
    #: what the child is, for a person (``Job <name>``, ``process <pid>``); the Stalled message names it
    name: str = ""
    #: times its queue (Kueue) evicted this child and kept it for re-admission (the operator's count on the child;
    #: 0 where nothing queues)
    evictions: int = 0


ABSENT = Child(ChildState.ABSENT)


@dataclass(frozen=True)
class Observations:
    """Everything ``decide`` may know about the world.

    ``children`` is keyed by phase and describes the attempt numbered ``status.attempts[phase]``.
    ``results`` are the wire dicts the workloads wrote (result.json); ``metrics`` their metrics.jsonl
    lines, parsed into their models where they were observed (``whale.control.observer``).
    """

    run: str
    children: Mapping[str, Child] = field(default_factory=dict)
    results: Mapping[str, dict[str, Any]] = field(default_factory=dict)
    metrics: Mapping[str, Sequence[PhaseMetrics]] = field(default_factory=dict)
    checkpoints: frozenset[int] = frozenset()
    split_sizes: Mapping[str, int] = field(default_factory=dict)
    now: str = ""
    generation: int | None = None

    def weight_steps(self, phase: str) -> list[WeightStepMetrics]:
        """The weight phase's step lines, in step order."""
        lines = [m for m in self.metrics.get(phase, ()) if isinstance(m, WeightStepMetrics)]
        return sorted(lines, key=lambda m: m.step)

    def harness_iterations(self, phase: str) -> list[HarnessIterationMetrics]:
        """The harness phase's iteration lines, in iteration order."""
        lines = [m for m in self.metrics.get(phase, ()) if isinstance(m, HarnessIterationMetrics)]
        return sorted(lines, key=lambda m: m.iteration)


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
    reason: Reason
    message: str


Action = StartPhase | StopPhase | ServeCheckpoint | SuspendRun | Finish | Fail


@dataclass(frozen=True)
class Transition:
    """What ``decide`` answers: the run's next status and the actions that take it there (named apart from
    the harness API's ``Decision``, a hook's answer)."""

    status: WhaleRunStatus
    actions: tuple[Action, ...] = ()

    def of_type(self, kind: type) -> list[Any]:
        return [a for a in self.actions if isinstance(a, kind)]


# ----- the machine --------------------------------------------------------------------------------


class _Machine:
    """One ``decide`` call: advances ``self.state`` (a frozen :class:`RunState`) by its transitions and
    collects the actions. Pure."""

    def __init__(self, spec: WhaleRunSpec, status: WhaleRunStatus, obs: Observations, sched: ResolvedSchedule):
        self.spec, self.obs, self.sched = spec, obs, sched
        self.before = status
        self.state = self.initial = RunState.from_status(status)
        self.actions: list[Action] = []
        self.run = obs.run
        #: the complete checkpoints in the store, in step order (what mid-phase evaluations come from)
        self.checkpoint_steps: list[int] = sorted(obs.checkpoints)

    # --- helpers ---
    def child(self, phase: str) -> Child:
        return self.obs.children.get(phase, ABSENT)

    def fail(self, reason: Reason, message: str) -> None:
        self.state = self.state.failed(reason, message, self.obs.now)
        self.actions.append(Fail(reason, message))

    def request(self, phase: PhaseId, args: WeightPhaseArgs | HarnessPhaseArgs | EvalPhaseArgs) -> PhaseRequest:
        """The request of ``phase``'s current attempt."""
        self.state = self.state.with_first_attempt(phase.key)
        return phase_request(
            self.spec, run=self.run, phase=phase.key, attempt=self.state.attempt_of(phase.key), args=args
        )

    # --- the main sequence ---
    def next_main(self) -> PhaseId | None:
        done = self.state.completed_phases
        cond = self.spec.condition
        if cond is Condition.MH_ONLY:
            return None if done else PhaseId.harness(1)
        if cond is Condition.RSFT_ONLY:
            return None if done else PhaseId.weight(1)
        if not done:
            return PhaseId.weight(1)
        last = PhaseId.parse(done[-1])
        if last.kind is PhaseKind.WEIGHT:
            if self.state.checkpoint_step >= self.sched.total_steps:
                return None
            return PhaseId.harness(last.cycle)
        if last.cycle >= self.sched.max_cycles:
            return None
        return PhaseId.weight(last.cycle + 1)

    def weight_range(self) -> tuple[int, int]:
        """(from step, target step) of the weight phase that starts at the current checkpoint."""
        return weight_range(self.spec, self.sched, self.state.checkpoint_step)

    def weight_args(self, phase: PhaseId) -> WeightPhaseArgs:
        step, target = self.weight_range()
        return WeightPhaseArgs(
            cycle=phase.cycle,
            harness=self.state.current_harness,
            from_checkpoint=self.state.current_checkpoint,
            from_step=step,
            target_step=target,
            save_steps=list(self.sched.eval_points_between(step, target)),
            steps_per_epoch=self.sched.steps_per_epoch,
            total_steps=self.sched.total_steps,
            stop_rule=self.sched.weight_rule,
        )

    def harness_args(self, phase: PhaseId) -> HarnessPhaseArgs:
        return HarnessPhaseArgs(
            cycle=phase.cycle,
            incoming_harness=self.state.current_harness,
            checkpoint=self.state.current_checkpoint,
            step=self.state.checkpoint_step,
            iterations=self.sched.harness_iterations,
            stop_rule=self.sched.harness_rule,
            archive=layout.archive_prefix(self.run, phase.cycle),
        )

    def main_request(self, phase: PhaseId) -> PhaseRequest:
        if phase.kind is PhaseKind.WEIGHT:
            return self.request(phase, self.weight_args(phase))
        return self.request(phase, self.harness_args(phase))

    def complete_main(self, phase: PhaseId, raw: dict[str, Any]) -> None:
        if phase.kind is PhaseKind.WEIGHT:
            res = WeightPhaseResult.model_validate(raw)
            from_step = self.state.checkpoint_step
            self.state = self.state.weight_done(phase, res.final_step, res.checkpoint, res.rollouts, res.empty_steps)
            for s in self.checkpoint_steps:
                if from_step < s < res.final_step and self.sched.is_eval_point(s):
                    self.owe_eval(
                        phase.cycle,
                        s,
                        "weight",
                        layout.checkpoint_prefix(self.run, s),
                        self.state.current_harness,
                        self.rollouts_at(from_step, s, res),
                    )
            self.owe_eval(
                phase.cycle,
                res.final_step,
                "weight",
                res.checkpoint,
                self.state.current_harness,
                self.state.rollouts_completed,
            )
            return
        hres = HarnessPhaseResult.model_validate(raw)
        before = self.state.rollouts_completed
        self.state = self.state.harness_done(
            phase,
            hres.accepted_harness,
            hres.iterations,
            hres.accepted_score,
            hres.rollouts,
            integrity_status(phase.key, hres),
        )
        covered = False
        if self.sched.evaluates_every_accepted_harness and hres.accepted_by_iteration:
            history: list[tuple[int, str, str | None, int]] = [
                (a.iteration, a.candidate, a.harness, a.rollouts) for a in hres.accepted_by_iteration
            ]
            self.owe_acceptance_evals(phase, history, before)
            last = hres.accepted_by_iteration[-1]
            # the accepted harness is already evaluated: as its iteration's point, or (never replaced)
            # as the start point, the same (theta0, h0)
            covered = last.candidate == hres.accepted_candidate and (
                (last.iteration >= 2 and self.in_archive(phase, last.harness))
                or (last.iteration == 1 and self.spec.experiment.evaluation.at_start)
            )
        if self.spec.experiment.evaluation.after_harness_phase and not covered:
            self.owe_eval(
                phase.cycle,
                self.state.checkpoint_step,
                "harness",
                self.state.current_checkpoint,
                hres.accepted_harness,
                self.state.rollouts_completed,
            )

    def owe_acceptance_evals(
        self, phase: PhaseId, history: list[tuple[int, str, str | None, int]], rollouts_before: int
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
                phase.cycle,
                self.state.checkpoint_step,
                "harness",
                self.state.current_checkpoint,
                harness,
                rollouts_before + rollouts,
                iteration=iteration,
            )

    def rollouts_at(self, from_step: int, step: int, res: WeightPhaseResult) -> int:
        before = self.state.rollouts_completed - res.rollouts
        return before + (step - from_step) * self.sched.rollouts_per_step

    def advance_main(self) -> None:
        """Absorb every finished main phase (the store is the truth) and enter the next one."""
        for _ in range(4 * self.sched.max_cycles + 4):  # bounded: a cycle has two main phases
            active = self.state.active_phase
            if active is None:
                phase = self.next_main()
                if phase is None:
                    return
                self.state = self.state.entered(phase)
            else:
                phase = PhaseId.parse(active)
            if phase.key in self.obs.results:
                self.complete_main(phase, self.obs.results[phase.key])
                continue
            return

    def drive_child(self, phase: PhaseId, make_request: Callable[[], PhaseRequest]) -> bool:
        """Start, retry or leave the child of ``phase``. False when the run failed."""
        key = phase.key
        child = self.child(key)
        self.state, too_many = counted_evictions(self.state, self.spec, key, child)
        if too_many is not None:
            self.fail(Reason.EVICTION_LIMIT, too_many)
            return False
        if child.state is ChildState.RUNNING:
            return True
        if child.state is ChildState.PREEMPTED:
            self.state = self.state.with_preemption(key)
        elif child.state in (ChildState.FAILED, ChildState.SUCCEEDED):
            # SUCCEEDED without a result (we only get here when result.json is missing) is a failure too.
            why = child.message or (
                "exited successfully without writing result.json" if child.state is ChildState.SUCCEEDED else "failed"
            )
            self.state = self.state.with_failure(key)
            failures = self.state.failures[key]
            if failures >= self.spec.execution.retry.max_attempts:
                self.fail(Reason.PHASE_FAILED, f"phase {key} failed {failures} time(s); last: {why}")
                return False
            self.state = self.state.with_retry(key, f"phase {key} attempt {failures} failed ({why}); retrying")
        self.actions.append(StartPhase(make_request()))
        return True

    def watch_active(self, phase: PhaseId) -> None:
        """Progress and adaptive patience of the running main phase."""
        fired: int | None = None
        if phase.kind is PhaseKind.WEIGHT:
            steps = self.obs.weight_steps(phase.key)
            if steps:
                self.state = self.state.with_weight_progress(steps[-1].step, steps[-1].reward_mean)
            self.state = self.state.with_empty_steps([m.step for m in steps if m.kept == 0])
            if self.sched.weight_rule is not None:
                fired = weight_stop_step([m.reward_mean for m in steps], self.sched.weight_rule)
        else:
            its = self.obs.harness_iterations(phase.key)
            if its:
                self.state = self.state.with_harness_progress(its[-1].iteration, its[-1].best_score)
            if self.sched.harness_rule is not None:
                fired = harness_stop_iteration([m.best_score for m in its], self.sched.harness_rule)
        if fired is not None and phase.key not in self.state.stop_requested:
            unit = "step" if phase.kind is PhaseKind.WEIGHT else "iteration"
            self.state = self.state.with_stop_requested(phase.key)
            self.actions.append(StopPhase(phase.key, f"adaptive patience fired after {unit} {fired} of the phase"))

    # --- evaluations ---
    def owe_eval(
        self,
        cycle: int,
        step: int,
        after: EvalAfter,
        checkpoint: str | None,
        harness: str | None,
        rollouts_at: int,
        iteration: int | None = None,
    ) -> None:
        key = PhaseId.eval(cycle, step, after, iteration).key
        if key in self.state.owed:
            return
        self.state = self.state.with_owed_eval(
            EvalPoint(
                phase=key,
                cycle=cycle,
                step=step,
                after=after,
                checkpoint=checkpoint,
                harness=harness,
                rollouts_at=rollouts_at,
                iteration=iteration,
            )
        )

    def in_archive(self, phase: PhaseId, harness: str | None) -> bool:
        """Only a file of the phase's own archive is evaluated as its accepted harness: whatever else a
        metrics line or a result names (another run's file, a path that climbs out) is never run."""
        prefix = layout.archive_candidates_prefix(self.run, phase.cycle)
        return (
            isinstance(harness, str)
            and harness.startswith(prefix)
            and harness.endswith("/harness.py")
            and ".." not in harness.split("/")
        )

    def observe_mid_phase_acceptance(self, phase: PhaseId) -> None:
        """mh_only: evaluate each newly accepted harness of the running search as soon as its iteration is
        logged (the metrics line names the candidate and its harness file in the archive)."""
        if phase.kind is not PhaseKind.HARNESS or not self.sched.evaluates_every_accepted_harness:
            return
        history = []
        spent = 0
        seen: set[int] = set()
        for line in self.obs.harness_iterations(phase.key):
            iteration = line.iteration
            if iteration in seen:
                continue
            seen.add(iteration)
            spent += line.rollouts
            history.append((iteration, line.best_candidate, line.best_harness, spent))
        if seen != set(range(1, len(seen) + 1)):
            return  # a gap: the rollouts up to an iteration are not known yet; the result will say
        self.owe_acceptance_evals(phase, history, self.state.rollouts_completed)

    def observe_mid_phase_checkpoints(self, phase: PhaseId) -> None:
        """Evaluate checkpoints of the running weight phase as soon as they are complete."""
        if phase.kind is not PhaseKind.WEIGHT:
            return
        from_step, target = self.weight_range()
        for s in self.checkpoint_steps:
            if from_step < s < target and self.sched.is_eval_point(s):
                rollouts = self.state.rollouts_completed + (s - from_step) * self.sched.rollouts_per_step
                self.owe_eval(
                    phase.cycle,
                    s,
                    "weight",
                    layout.checkpoint_prefix(self.run, s),
                    self.state.current_harness,
                    rollouts,
                )

    def drive_evals(self) -> bool:
        for point in self.state.pending_evals:
            key = point.phase
            if key in self.obs.results:
                res = EvalResult.model_validate(self.obs.results[key])
                flags = (
                    (
                        IntegrityFlagStatus(
                            phase=key, candidate=point.harness or "h0", evaluation=True, reasons=res.integrity_flags
                        ),
                    )
                    if res.integrity_flags
                    else ()
                )
                self.state = self.state.with_eval_result(key, res.mean_at_k, res.k, flags)
                continue
            args = EvalPhaseArgs(
                cycle=point.cycle,
                step=point.step,
                after=point.after,
                checkpoint=point.checkpoint,
                harness=point.harness,
                iteration=point.iteration,
            )
            phase = PhaseId.parse(key)
            if not self.drive_child(phase, functools.partial(self.request, phase, args)):
                return False
        return True

    # --- one call ---
    def decide(self) -> Transition:
        obs = self.obs
        if self.state.phase is RunPhase.INTERRUPTED:  # a controller runs it again: it resumes where it stopped
            self.state = self.state.resumed()
        if self.state.phase is RunPhase.PENDING:
            self.state = self.state.started(obs.now)
            if self.spec.experiment.evaluation.at_start:
                self.owe_eval(0, 0, "start", None, None, 0)
        self.state = self.state.with_schedule(self.sched.steps_per_epoch, self.sched.total_steps)
        self.state = self.state.with_generation(obs.generation)

        self.advance_main()
        active = PhaseId.parse(self.state.active_phase) if self.state.active_phase is not None else None
        if active is not None:
            self.observe_mid_phase_checkpoints(active)
            self.observe_mid_phase_acceptance(active)

        if self.spec.execution.suspend:
            if self.state.phase is not RunPhase.SUSPENDED:
                self.state = self.state.suspended("spec.execution.suspend is true")
            self.actions.append(SuspendRun("spec.execution.suspend is true"))
            return self.finish_call()
        if self.state.phase is RunPhase.SUSPENDED:
            self.state = self.state.resumed()

        if active is not None:
            if not self.drive_child(active, lambda: self.main_request(active)):
                return self.finish_call()
            if self.child(active.key).state is ChildState.RUNNING:
                self.watch_active(active)
        if not self.drive_evals():
            return self.finish_call()

        if active is None:
            if self.state.pending_evals:
                self.state = self.state.with_stage(Stage.EVAL)
            else:
                best = self.state.best
                final = final_eval(self.state.evals, self.spec.experiment.evaluation.samples_per_item)
                summary = f"best mean@{best.k} {best.mean_at_k:.4f} at {best.phase}" if best else "no evaluation"
                if final is not None:
                    summary += f"; final mean@{final.k} {final.mean_at_k:.4f} at {final.phase}"
                self.state = self.state.succeeded(f"schedule complete; {summary}", final, obs.now)
                self.actions.append(Finish(f"schedule complete; {summary}"))
        return self.finish_call()

    def finish_call(self) -> Transition:
        active = self.state.active_phase
        steps = self.obs.weight_steps(active) if active else []
        iterations = self.obs.harness_iterations(active) if active else []
        running = sum(m.rollouts for m in steps) + sum(m.rollouts for m in iterations)
        empty = sum(m.kept == 0 for m in steps)
        self.state = self.state.with_spent(running, empty)
        self.state = watch_progress(self.state, self.spec, self.obs, starting(self.actions))
        self.state = self.state.with_integrity_condition(self.obs.now)
        checkpoint = self.state.current_checkpoint
        if checkpoint != self.before.current_checkpoint and not self.state.phase.is_terminal():
            self.actions.insert(0, ServeCheckpoint(checkpoint))
        # nothing changed (most calls of a controller's loop): the status given, not a copy rebuilt from the state, so a
        # controller sees there is nothing to write without serialising and comparing the two (both grow with the run)
        unchanged = self.state is self.initial or self.state == self.initial
        return Transition(self.before if unchanged else self.state.to_status(), tuple(self.actions))


def weight_range(spec: WhaleRunSpec, sched: ResolvedSchedule, step: int) -> tuple[int, int]:
    """(from step, target step) of the weight phase that starts at checkpoint step ``step``: a cycle of ``whale``, the
    rest of the budget otherwise (``rsft_only``'s one phase; ``adaptive_whale``'s, which its patience may stop)."""
    total = sched.total_steps
    if spec.condition is Condition.WHALE and sched.cycle_steps:
        return step, min(step + sched.cycle_steps, total)
    return step, total


def evaluates_mid_phase(spec: WhaleRunSpec, status: WhaleRunStatus, split_sizes: Mapping[str, int]) -> bool:
    """Whether the run's weight phase in progress has evaluation points before its target step, whose checkpoints
    ``decide`` evaluates as they come complete (:meth:`_Machine.observe_mid_phase_checkpoints`): only then must a
    controller look for checkpoints while that phase runs (its last one it reads once the phase's child has ended).
    True when it cannot tell (no split sizes yet, a schedule that does not resolve): looking is never wrong."""
    if not split_sizes:
        return True
    try:
        sched = resolve(spec, dict(split_sizes))
    except ScheduleError:
        return True
    start, target = weight_range(spec, sched, status.checkpoint_step)
    return any(step < target for step in sched.eval_points_between(start, target))


def starting(actions: Iterable[Action]) -> frozenset[str]:
    """The phases whose child this call decided to start (:class:`StartPhase`)."""
    return frozenset(a.phase for a in actions if isinstance(a, StartPhase))


def watch_progress(state: RunState, spec: WhaleRunSpec, obs: Observations, started: Iterable[str] = ()) -> RunState:
    """``lastProgressTime`` follows the store; the Stalled condition is True while a child runs and
    nothing moved for ``spec.execution.retry.stallAfterSeconds`` (an alert only: nothing is stopped). ``started``:
    the phases this call starts (:func:`progress_mark`)."""
    now = obs.now
    state = state.with_progress(progress_mark(state, obs, started), now)
    running = sorted((p, c) for p, c in obs.children.items() if c.state is ChildState.RUNNING)
    limit = spec.execution.retry.stall_after_seconds
    quiet = seconds_between(state.last_progress_time, now)
    active = not state.phase.is_terminal() and state.phase is not RunPhase.SUSPENDED
    if limit is not None and running and active and quiet is not None and quiet >= limit:
        children = "; ".join(
            f"phase {p}" + (f", {c.name}" if c.name else "") + (f" ({c.message})" if c.message else "")
            for p, c in running
        )
        message = (
            f"no progress in the store for {limit / 60:g} minutes (since {state.last_progress_time}, "
            f"spec.execution.retry.stallAfterSeconds); {children}"
        )
        return state.with_stalled(True, message, now)
    if state.stalled() is not None:  # listed from its first stall on (the operator lists it always)
        return state.with_stalled(False, progress_seen_message(state.last_progress_time), now)
    return state


def progress_mark(state: RunState, obs: Observations, started: Iterable[str] = ()) -> str:
    """What the store (and the children) show now, compactly: main phases and evaluations done, failed and
    preempted attempts, metrics lines of the phases whose child runs, complete checkpoints, the phases whose child
    runs or is being started (``started``: this call's :class:`StartPhase` actions; a decision to start a child counts,
    so the stall is measured from it). Any change is progress; the same mark twice is none (``decide`` stays
    level-based). Each part is what the next call will see again when nothing happens in between: a phase whose child
    has ended counts by its result, not its lines (the call that absorbs it still reads them, the next no longer
    does), and a child this call starts counts from this call, not from the next one that sees it run. Counting either
    at one call and not at the next made every transition look like progress twice (and cost the operator a status
    write for nothing)."""
    evals = sum(e.mean_at_k is not None for e in state.evals)
    running_phases = {p for p, c in obs.children.items() if c.state is ChildState.RUNNING}
    lines = sum(len(obs.metrics.get(p, ())) for p in running_phases)
    running = ",".join(sorted(running_phases.union(started)))
    return (
        f"phases={len(state.completed_phases)} evals={evals} "
        f"failures={sum(state.failures.values())} preemptions={state.preemptions} "
        f"lines={lines} checkpoints={len(obs.checkpoints)} running={running}"
    )


def seconds_between(earlier: str | None, later: str) -> float | None:
    """Seconds from one RFC 3339 time to another (None when either is missing or unreadable)."""
    if not earlier or not later:
        return None
    try:
        start = datetime.fromisoformat(earlier.replace("Z", "+00:00"))
        end = datetime.fromisoformat(later.replace("Z", "+00:00"))
        return (end - start).total_seconds()
    except ValueError:
        return None


#: where each kind of point lies among the points of one step (the harness phase follows the weight phase)
_AFTER_ORDER = {"start": 0, "weight": 1, "harness": 2}


def schedule_order(point: EvalPoint) -> tuple[int, int, int, int]:
    """Sort key of evaluation points in the order the run reaches them: by the training rollouts spent,
    then step, then weight before harness, then search iteration."""
    return (point.rollouts_at, point.step, _AFTER_ORDER[point.after], point.iteration or 0)


def final_eval(evals: Sequence[EvalPoint], default_k: int) -> BestEval | None:
    """The last finished evaluation point in schedule order (the agent the run ends with).

    Reported beside ``best``: the best over evaluation points favours a condition evaluated more often;
    every condition has exactly one final point. ``default_k``: for points recorded without their k."""
    done = [e for e in evals if e.mean_at_k is not None]
    if not done:
        return None
    return best_eval(max(done, key=schedule_order), default_k)


#: flagged candidates one harness phase may put in the status (its result.json keeps them all)
MAX_STATUS_FLAGS_PER_PHASE = 20


def integrity_status(phase: str, result: HarnessPhaseResult) -> tuple[IntegrityFlagStatus, ...]:
    """A harness phase's reward-integrity flags as status entries: the accepted one first, at most
    ``MAX_STATUS_FLAGS_PER_PHASE`` (a status must stay small)."""
    flags = sorted(result.integrity_flags, key=lambda f: not f.accepted)[:MAX_STATUS_FLAGS_PER_PHASE]
    return tuple(
        IntegrityFlagStatus(phase=phase, candidate=f.candidate, accepted=f.accepted, reasons=f.reasons) for f in flags
    )


def counted_evictions(state: RunState, spec: WhaleRunSpec, key: str, child: Child) -> tuple[RunState, str | None]:
    """``state`` with the evictions of ``key``'s current child; the failure message when there were more than
    ``execution.retry.maxEvictions``."""
    state = state.with_evictions(key, child.evictions)
    limit = spec.execution.retry.max_evictions
    if child.evictions <= limit:
        return state, None
    which = f"{child.name} " if child.name else ""
    last = f"; last: {child.message}" if child.message else ""
    return state, (
        f"phase {key}: its queue evicted {which}{child.evictions} times, more than spec.execution.retry.maxEvictions "
        f"({limit}){last}; raise the limit, or give the queue's ClusterQueue the quota the run needs"
    )


# ----- data preparation ---------------------------------------------------------------------------


def _prepare(spec: WhaleRunSpec, status: WhaleRunStatus, obs: Observations) -> Transition:
    """No split sizes yet: the run's one phase is data preparation (``PhaseId.prepare()``), a child like any
    other, retried up to ``retry.maxAttempts``; the run stays Pending (reason ``PreparingData``) until the
    sizes are in the store. A child that exits 0 without writing them is a failed attempt."""
    phase = PhaseId.prepare()
    key = phase.key
    state = RunState.from_status(status).with_generation(obs.generation).with_first_attempt(key)
    child = obs.children.get(key, ABSENT)
    state, too_many = counted_evictions(state, spec, key, child)
    if too_many is not None:
        state = state.refused(Reason.EVICTION_LIMIT, too_many, obs.generation, obs.now)
        return Transition(watch_progress(state, spec, obs).to_status(), (Fail(Reason.EVICTION_LIMIT, too_many),))
    actions: list[Action] = []
    domain = f"the splits of domain {spec.domain!r}"
    after_failure = ""
    if child.state in (ChildState.FAILED, ChildState.SUCCEEDED):
        why = child.message or "failed"
        if child.state is ChildState.SUCCEEDED:
            why = f"it succeeded without writing {layout.split_sizes_key(obs.run)}"
        state = state.with_failure(key)
        failures = state.failures[key]
        which = f"{child.name}: " if child.name else ""
        if failures >= spec.execution.retry.max_attempts:
            message = f"data preparation failed {failures} times (spec.execution.retry.maxAttempts); {which}{why}"
            state = state.refused(Reason.PREPARE_FAILED, message, obs.generation, obs.now)
            return Transition(watch_progress(state, spec, obs).to_status(), (Fail(Reason.PREPARE_FAILED, message),))
        state = state.with_retry(key, "")
        after_failure = f"; attempt {failures} failed: {which}{why}"
    elif child.state is ChildState.PREEMPTED:
        state = state.with_preemption(key)
    attempt = state.attempt_of(key)
    if child.state is ChildState.RUNNING:
        who = child.name or "the prepare child"
        message = f"{who} is materialising {domain} and writing their sizes (attempt {attempt})"
    elif spec.execution.suspend:
        message = "spec.execution.suspend is true: data preparation waits"
        actions.append(SuspendRun(message))  # a controller's loop may end here (the local runner's does)
    else:
        message = f"materialising {domain} and writing their sizes (attempt {attempt}{after_failure})"
        request = phase_request(spec, run=obs.run, phase=key, attempt=attempt, args=PreparePhaseArgs())
        actions.append(StartPhase(request))
    state = state.waiting(Reason.PREPARING_DATA, message, obs.generation)
    return Transition(watch_progress(state, spec, obs, starting(actions)).to_status(), tuple(actions))


def decide(spec: WhaleRunSpec, status: WhaleRunStatus, obs: Observations) -> Transition:
    """Advance the run one level-triggered step. See the module docstring for the semantics."""
    if status.phase.is_terminal():
        return Transition(status, ())
    if not obs.split_sizes:
        return _prepare(spec, status, obs)
    try:
        sched = resolve(spec, dict(obs.split_sizes))
    except ScheduleError as exc:
        failed = RunState.from_status(status).failed(Reason.INVALID_SCHEDULE, str(exc), obs.now)
        return Transition(failed.to_status(), (Fail(Reason.INVALID_SCHEDULE, str(exc)),))
    return _Machine(spec, status, obs, sched).decide()
