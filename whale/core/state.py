"""The run's state as ``decide()`` edits it: a frozen value advanced by ``with_*`` transitions.

:class:`RunState` holds the fields of :class:`~whale.core.spec.WhaleRunStatus` that the state machine
owns, typed (tuples for sequences), and :meth:`RunState.from_status` / :meth:`RunState.to_status`
are its only (de)serialisers. Every change is a named transition that returns a new value (the model:
kopf's ``progression.State``), so no code edits a status through string keys, and a transition that
does not exist cannot be written by mistake. Pure: no I/O, no clock (``now`` is passed in).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from whale.core.layout import PhaseId
from whale.core.protocol import PhaseKind
from whale.core.status import (
    BestEval,
    ConditionType,
    EvalPoint,
    IntegrityFlagStatus,
    MetaCondition,
    Reason,
    RunPhase,
    Stage,
    WhaleRunStatus,
)

#: the Stalled condition's reasons
STALLED_REASON = "NoProgress"
NOT_STALLED_REASON = "ProgressSeen"


def progress_seen_message(last_progress_time: str | None) -> str:
    """The message of a Stalled condition that is False: one text wherever it is written (``decide``, and a controller
    listing the condition before ``decide`` did), or the two would rewrite each other's."""
    return f"last progress at {last_progress_time}" if last_progress_time else ""


def _same(old: MetaCondition | None, new: MetaCondition) -> bool:
    """``old`` says what ``new`` says; the generation it was observed at is the operator's stamp
    (``whale_operator.status.with_conditions``), not a change: were it one, every reconcile made a new status."""
    return old is not None and old.model_copy(update={"observed_generation": None}) == new


def _inc(counts: Mapping[str, int], phase: str, by: int = 1, start: int = 0) -> dict[str, int]:
    return {**counts, phase: counts.get(phase, start) + by}


@dataclass(frozen=True)
class RunState:
    """What the run has done and where it is; see ``WhaleRunStatus`` for each field's meaning.

    Mappings (``attempts``, ``failures``) are never changed in place: each transition builds a new one."""

    phase: RunPhase = RunPhase.PENDING
    cycle: int = 0
    stage: Stage | None = None
    step: int = 0
    iteration: int = 0
    training_reward: float | None = None
    harness_score: float | None = None
    steps_per_epoch: int | None = None
    total_steps: int | None = None
    current_checkpoint: str | None = None
    current_harness: str | None = None
    checkpoint_step: int = 0
    active_phase: str | None = None
    completed_phases: tuple[str, ...] = ()
    attempts: Mapping[str, int] = field(default_factory=dict)
    failures: Mapping[str, int] = field(default_factory=dict)
    preemptions: int = 0
    evictions: Mapping[str, int] = field(default_factory=dict)
    stop_requested: tuple[str, ...] = ()
    rollouts_completed: int = 0
    rollouts_spent: int = 0
    empty_steps: int = 0
    empty_steps_completed: int = 0
    last_empty_step: int | None = None
    evals: tuple[EvalPoint, ...] = ()
    best: BestEval | None = None
    final: BestEval | None = None
    integrity_flags: tuple[IntegrityFlagStatus, ...] = ()
    last_eval_mean: float | None = None
    reason: str | None = None
    message: str | None = None
    start_time: str | None = None
    completion_time: str | None = None
    last_progress_time: str | None = None
    progress_mark: str | None = None
    observed_generation: int | None = None
    conditions: tuple[MetaCondition, ...] = ()
    store_uri: str | None = None

    # --- (de)serialisers ---
    @classmethod
    def from_status(cls, status: WhaleRunStatus) -> RunState:
        values = {name: getattr(status, name) for name in _FIELDS}
        for name in ("completed_phases", "stop_requested", "evals", "integrity_flags", "conditions"):
            values[name] = tuple(values[name])
        for name in ("attempts", "failures", "evictions"):
            values[name] = dict(values[name])
        return cls(**values)

    def to_status(self) -> WhaleRunStatus:
        return WhaleRunStatus.model_validate({name: getattr(self, name) for name in _FIELDS})

    # --- reading ---
    def attempt_of(self, phase: str) -> int:
        """The current attempt number of ``phase`` (1 before it was counted)."""
        return self.attempts.get(phase, 1)

    @property
    def owed(self) -> frozenset[str]:
        """The evaluation phases owed so far (finished or not)."""
        return frozenset(e.phase for e in self.evals)

    @property
    def pending_evals(self) -> tuple[EvalPoint, ...]:
        return tuple(e for e in self.evals if e.mean_at_k is None)

    # --- the run's phase ---
    def started(self, now: str) -> RunState:
        return replace(self, phase=RunPhase.RUNNING, start_time=now, reason=Reason.STARTED.value, message=None)

    def resumed(self) -> RunState:
        return replace(self, phase=RunPhase.RUNNING, reason=Reason.RESUMED.value, message=None)

    def suspended(self, message: str) -> RunState:
        return replace(self, phase=RunPhase.SUSPENDED, reason=Reason.SUSPENDED.value, message=message)

    def failed(self, reason: Reason, message: str, now: str) -> RunState:
        return replace(self, phase=RunPhase.FAILED, reason=reason.value, message=message, completion_time=now)

    def succeeded(self, message: str, final: BestEval | None, now: str) -> RunState:
        return replace(
            self,
            phase=RunPhase.SUCCEEDED,
            stage=Stage.DONE,
            reason=Reason.COMPLETED.value,
            message=message,
            completion_time=now,
            final=final,
        )

    def refused(self, reason: Reason, message: str, generation: int | None, now: str) -> RunState:
        """Failed before any phase could run (the operator: an invalid spec, data preparation that kept
        failing); the first failure's time stays."""
        return replace(
            self,
            phase=RunPhase.FAILED,
            reason=reason.value,
            message=message,
            observed_generation=generation,
            completion_time=self.completion_time or now,
        )

    def waiting(self, reason: Reason, message: str, generation: int | None) -> RunState:
        """Not started yet, and why (the operator: the data is being prepared, or cannot be)."""
        return replace(self, reason=reason.value, message=message, observed_generation=generation)

    def with_conditions(self, conditions: tuple[MetaCondition, ...]) -> RunState:
        return replace(self, conditions=conditions)

    def with_message(self, message: str | None) -> RunState:
        return replace(self, message=message)

    def with_stage(self, stage: Stage) -> RunState:
        return replace(self, stage=stage)

    def with_schedule(self, steps_per_epoch: int, total_steps: int) -> RunState:
        return replace(self, steps_per_epoch=steps_per_epoch, total_steps=total_steps)

    def with_generation(self, generation: int | None) -> RunState:
        return self if generation is None else replace(self, observed_generation=generation)

    # --- a controller that stops before the run ends (the local runner) ---
    def interrupted(self, why: Reason, message: str, now: str) -> RunState:
        """Nothing runs now: a Running run becomes Interrupted (``decide`` reads that as Running and resumes
        from it), with the Interrupted condition saying why. Terminal and suspended runs are unchanged."""
        if self.phase.is_terminal() or self.phase is RunPhase.SUSPENDED:
            return self
        cond = MetaCondition(
            type=ConditionType.INTERRUPTED.value,
            status="True",
            reason=why.value,
            message=message,
            last_transition_time=now,
        )
        phase = RunPhase.INTERRUPTED if self.phase is RunPhase.RUNNING else self.phase
        return replace(
            self,
            phase=phase,
            reason=Reason.INTERRUPTED.value,
            message=message,
            conditions=(*self._without(ConditionType.INTERRUPTED), cond),
        )

    def interruption(self) -> MetaCondition | None:
        """The Interrupted condition, while it is True."""
        return next((c for c in self.conditions if c.type == ConditionType.INTERRUPTED and c.status == "True"), None)

    def taken_over(self) -> RunState:
        """The run as a new controller takes it over: no longer interrupted."""
        if self.interruption() is None and self.reason != Reason.INTERRUPTED and self.phase is not RunPhase.INTERRUPTED:
            return self
        phase = RunPhase.RUNNING if self.phase is RunPhase.INTERRUPTED else self.phase
        return replace(
            self,
            phase=phase,
            reason=Reason.RESUMED.value,
            message=None,
            conditions=self._without(ConditionType.INTERRUPTED),
        )

    def retried(self) -> RunState:
        """A Failed run back to Running from its last good state: completed phases, evaluations and checkpoints
        stay; each phase that is not done has its failure counter reset and gets a new attempt number, so it
        starts again (and resumes from its own state in the store). Other phases are unchanged."""
        if self.phase is not RunPhase.FAILED:
            return self
        done = set(self.completed_phases) | {e.phase for e in self.evals if e.mean_at_k is not None}
        reset = sorted(p for p in self.failures if p not in done)
        attempts = dict(self.attempts)
        for phase in reset:
            attempts[phase] = attempts.get(phase, 1) + 1
        message = f"retrying ({', '.join(reset) or 'no failed phase'}) after: {self.message or self.reason}"
        return replace(
            self,
            # a run whose data preparation failed never started: it is prepared again first
            phase=RunPhase.PENDING if self.reason == Reason.PREPARE_FAILED else RunPhase.RUNNING,
            reason=Reason.RETRIED.value,
            message=message,
            completion_time=None,
            failures={p: n for p, n in self.failures.items() if p in done},
            attempts=attempts,
        )

    # --- progress and the Stalled condition ---
    def with_progress(self, mark: str, now: str) -> RunState:
        """``mark`` is what the store shows now (see ``WhaleRunStatus.progressMark``): a new one is progress."""
        if mark == self.progress_mark:
            return self
        return replace(self, progress_mark=mark, last_progress_time=now or self.last_progress_time)

    def stalled(self) -> MetaCondition | None:
        return next((c for c in self.conditions if c.type == ConditionType.STALLED), None)

    def with_stalled(self, stalled: bool, message: str, now: str) -> RunState:
        """The Stalled condition, True or False; its lastTransitionTime changes only when its status flips."""
        status = "True" if stalled else "False"
        old = self.stalled()
        since = old.last_transition_time if old is not None and old.status == status else now
        cond = MetaCondition(
            type=ConditionType.STALLED.value,
            status=status,
            reason=STALLED_REASON if stalled else NOT_STALLED_REASON,
            message=message,
            last_transition_time=since or None,
        )
        if _same(old, cond):
            return self
        return replace(self, conditions=(*self._without(ConditionType.STALLED), cond))

    # --- the RewardIntegrity condition ---
    def with_integrity_condition(self, now: str) -> RunState:
        """RewardIntegrity from ``integrity_flags`` (:func:`integrity_condition`), listed from the first flag on
        (the operator lists it always); its lastTransitionTime changes only when its status flips."""
        if not self.integrity_flags:
            return self
        status, reason, message = integrity_condition(self.integrity_flags)
        old = next((c for c in self.conditions if c.type == ConditionType.REWARD_INTEGRITY), None)
        since = old.last_transition_time if old is not None and old.status == status else now
        cond = MetaCondition(
            type=ConditionType.REWARD_INTEGRITY.value,
            status=status,
            reason=reason,
            message=message,
            last_transition_time=since or None,
        )
        if _same(old, cond):
            return self
        return replace(self, conditions=(*self._without(ConditionType.REWARD_INTEGRITY), cond))

    def _without(self, kind: ConditionType) -> tuple[MetaCondition, ...]:
        return tuple(c for c in self.conditions if c.type != kind)

    # --- attempts of a phase's child ---
    def with_first_attempt(self, phase: str) -> RunState:
        """``phase`` counted at attempt 1 (the status lists every phase it launched)."""
        return self if phase in self.attempts else replace(self, attempts={**self.attempts, phase: 1})

    def with_preemption(self, phase: str) -> RunState:
        """A preempted attempt: a new attempt that does not count as a failure."""
        new = replace(self, preemptions=self.preemptions + 1, attempts=_inc(self.attempts, phase, start=1))
        return new._new_attempt_evictions(phase)

    def with_failure(self, phase: str) -> RunState:
        """One more failed attempt of ``phase`` (the caller decides whether it is retried)."""
        return replace(self, failures=_inc(self.failures, phase))

    def with_retry(self, phase: str, message: str) -> RunState:
        new = replace(self, attempts=_inc(self.attempts, phase, start=1), message=message)
        return new._new_attempt_evictions(phase)

    def with_evictions(self, phase: str, count: int) -> RunState:
        """The current attempt of ``phase`` has been evicted ``count`` times by its queue (what its child carries:
        level-based, so seeing the same child again changes nothing; a count never goes down within an attempt)."""
        if count <= self.evictions.get(phase, 0):
            return self
        return replace(self, evictions={**self.evictions, phase: count})

    def _new_attempt_evictions(self, phase: str) -> RunState:
        """A new attempt is a new child, evicted no time yet."""
        if phase not in self.evictions:
            return self
        return replace(self, evictions={k: v for k, v in self.evictions.items() if k != phase})

    # --- the main (weight / harness) phases ---
    def entered(self, phase: PhaseId) -> RunState:
        stage = Stage.WEIGHT if phase.kind is PhaseKind.WEIGHT else Stage.HARNESS
        return replace(self, active_phase=phase.key, cycle=phase.cycle, stage=stage, iteration=0).with_first_attempt(
            phase.key
        )

    def weight_done(
        self, phase: PhaseId, final_step: int, checkpoint: str, rollouts: int, empty_steps: list[int]
    ) -> RunState:
        """A finished weight phase: the run moves to its checkpoint."""
        return (
            replace(
                self,
                step=final_step,
                checkpoint_step=final_step,
                current_checkpoint=checkpoint,
                rollouts_completed=self.rollouts_completed + rollouts,
                empty_steps_completed=self.empty_steps_completed + len(empty_steps),
            )
            .with_empty_steps(empty_steps)
            .main_done(phase)
        )

    def harness_done(
        self,
        phase: PhaseId,
        harness: str,
        iterations: int,
        score: float,
        rollouts: int,
        flags: tuple[IntegrityFlagStatus, ...],
    ) -> RunState:
        """A finished harness phase: the run moves to its accepted harness."""
        return replace(
            self,
            current_harness=harness,
            iteration=iterations,
            harness_score=score,
            integrity_flags=self.integrity_flags + flags,
            rollouts_completed=self.rollouts_completed + rollouts,
        ).main_done(phase)

    def main_done(self, phase: PhaseId) -> RunState:
        return replace(self, completed_phases=(*self.completed_phases, phase.key), active_phase=None)

    def with_weight_progress(self, step: int, reward: float) -> RunState:
        return replace(self, step=max(self.step, step), training_reward=reward)

    def with_harness_progress(self, iteration: int, score: float) -> RunState:
        return replace(self, iteration=iteration, harness_score=score)

    def with_empty_steps(self, steps: list[int]) -> RunState:
        """Keep the latest step that kept no trajectory."""
        if not steps:
            return self
        return replace(self, last_empty_step=max(self.last_empty_step or 0, *steps))

    def with_stop_requested(self, phase: str) -> RunState:
        return replace(self, stop_requested=(*self.stop_requested, phase))

    def with_spent(self, rollouts_running: int, empty_running: int) -> RunState:
        """The totals so far: finished phases plus what the running one has logged."""
        return replace(
            self,
            rollouts_spent=self.rollouts_completed + rollouts_running,
            empty_steps=self.empty_steps_completed + empty_running,
        )

    # --- evaluations ---
    def with_owed_eval(self, point: EvalPoint) -> RunState:
        return replace(self, evals=(*self.evals, point))

    def with_eval_result(
        self, phase: str, mean_at_k: float, k: int, flags: tuple[IntegrityFlagStatus, ...] = ()
    ) -> RunState:
        """Record an evaluation's result; ``best`` follows when it beats the best so far, unless the
        evaluation was flagged for reward integrity (``flags``, added to the status's)."""
        evals = tuple(e.finished(mean_at_k, k, bool(flags)) if e.phase == phase else e for e in self.evals)
        point = next(e for e in evals if e.phase == phase)
        best = self.best
        if not flags and (best is None or mean_at_k > best.mean_at_k):
            best = best_eval(point)
        return replace(
            self, evals=evals, last_eval_mean=mean_at_k, best=best, integrity_flags=self.integrity_flags + flags
        )


def integrity_condition(flags: tuple[IntegrityFlagStatus, ...] | list[IntegrityFlagStatus]) -> tuple[str, str, str]:
    """(status, reason, message) of the RewardIntegrity condition: False once an evaluation was flagged (its
    mean is never the best) or the run went on with a flagged harness; True otherwise (flagged candidates that
    were not accepted only show in the message). One rule for ``whale run`` and the operator."""
    evaluations = [f for f in flags if f.evaluation]
    if evaluations:
        names = ", ".join(f"{f.phase} ({f.candidate})" for f in evaluations[:10])
        why = "; ".join(evaluations[-1].reasons[:1])
        return "False", "FlaggedEvaluation", f"evaluation(s) flagged, never the best: {names}; {why}"
    accepted = [f for f in flags if f.accepted]
    if accepted:
        names = ", ".join(f"{f.candidate} ({f.phase})" for f in accepted)
        why = "; ".join(accepted[-1].reasons[:1])
        return "False", "FlaggedHarnessAccepted", f"accepted although it scored without the model: {names}; {why}"
    if flags:
        return (
            "True",
            "FlaggedNotAccepted",
            f"{len(flags)} harness candidate(s) scored without the model; none was accepted: "
            + ", ".join(f.candidate for f in flags[:10]),
        )
    return "True", "NoFlags", ""


def best_eval(point: EvalPoint, default_k: int | None = None) -> BestEval:
    """A finished evaluation point as a ``best`` / ``final`` entry (``default_k`` for a point recorded
    without its k)."""
    if point.mean_at_k is None:
        raise ValueError(f"evaluation {point.phase} has no result yet")
    k = point.k or default_k
    if k is None:
        raise ValueError(f"evaluation {point.phase} has no k")
    return BestEval(
        mean_at_k=point.mean_at_k,
        k=k,
        phase=point.phase,
        cycle=point.cycle,
        step=point.step,
        harness=point.harness,
        checkpoint=point.checkpoint,
        rollouts_at=point.rollouts_at,
        iteration=point.iteration,
    )


#: RunState's field names, looked up once (``dataclasses.fields`` walks the class at every call)
_FIELDS: tuple[str, ...] = tuple(f.name for f in fields(RunState))


def replace(state: RunState, **changes: Any) -> RunState:
    """``dataclasses.replace`` for :class:`RunState` (no ``__post_init__``, no slots): the same value, without
    ``dataclasses.replace`` re-reading every field through ``fields()`` and ``__init__`` (a transition runs several
    times a reconcile)."""
    unknown = changes.keys() - state.__dict__.keys()
    if unknown:
        raise TypeError(f"RunState has no field(s) {sorted(unknown)}")
    new = object.__new__(RunState)
    new.__dict__.update(state.__dict__)
    new.__dict__.update(changes)
    return new
