"""A WhaleRun's status: what a controller writes back (the phase, the progress, the evaluation points, the
Kubernetes conditions). Apart from the spec (whale.core.spec), which is what a user writes. Pure: no I/O.
"""

from __future__ import annotations

import enum
from typing import Literal

from pydantic import ConfigDict, Field
from pydantic.alias_generators import to_camel

from whale.core.spec import NonNegInt, WireModel


class RunPhase(str, enum.Enum):
    PENDING = "Pending"
    RUNNING = "Running"
    SUSPENDED = "Suspended"
    #: `whale run` stopped mid-run (Ctrl-C, SIGTERM, --timeout, `whale stop`, a store error): nothing runs; the
    #: next `whale run` resumes it (back to Running). Written by the local runner only; ``decide`` reads it as
    #: Running, so a status saved this way resumes exactly
    INTERRUPTED = "Interrupted"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"

    def is_terminal(self) -> bool:
        return self in (RunPhase.SUCCEEDED, RunPhase.FAILED)


class Stage(str, enum.Enum):
    WEIGHT = "weight"
    HARNESS = "harness"
    EVAL = "eval"
    DONE = "done"


class Reason(str, enum.Enum):
    """Why the run is in its phase (``status.reason``, and the reason of its Interrupted condition).

    One enum for every writer (``decide``, the local runner, the operator), so a typo cannot invent a
    reason nobody handles; on the wire the status keeps a plain string (a newer writer may add one)."""

    STARTED = "Started"
    RESUMED = "Resumed"
    SUSPENDED = "Suspended"
    COMPLETED = "Completed"
    PHASE_FAILED = "PhaseFailed"
    INVALID_SCHEDULE = "InvalidSchedule"
    #: the operator: the spec (or the run's name) cannot be run as written
    INVALID_SPEC = "InvalidSpec"
    #: the operator: the split sizes are unknown and nothing can compute them here
    WAITING_FOR_DATA = "WaitingForData"
    PREPARING_DATA = "PreparingData"
    PREPARE_FAILED = "PrepareFailed"
    #: the operator: the run's credentials Secret (spec.execution.storage.credentialsSecret) is missing or unusable
    WAITING_FOR_CREDENTIALS = "WaitingForCredentials"
    #: the operator: the run's object store did not answer within the operator's timeouts and retry deadline
    STORE_UNAVAILABLE = "StoreUnavailable"
    #: the operator: a field of the experiment changed mid-run (where the CRD's CEL rules did not stop it)
    IMMUTABLE_FIELD_CHANGED = "ImmutableFieldChanged"
    #: the operator: spec.execution.storage (or resumeFrom) changed mid-run to a store that does not hold the run
    STORE_WITHOUT_RUN = "StoreWithoutRun"
    #: the operator: Kueue evicted one attempt of a phase more than ``spec.execution.retry.maxEvictions`` times
    EVICTION_LIMIT = "EvictionLimitReached"
    #: the local runner stopped before the run ended (the condition's reason says why: the members below)
    INTERRUPTED = "Interrupted"
    RETRIED = "Retried"
    SIGNAL = "Signal"
    TIMEOUT = "Timeout"
    STOP_REQUESTED = "StopRequested"
    STORE_ERROR = "StoreError"
    RUNNER_ERROR = "RunnerError"


class ConditionType(str, enum.Enum):
    """The metav1 condition types of a WhaleRun, in the order they are listed."""

    INFERENCE_READY = "InferenceReady"
    PROGRESSING = "Progressing"
    SUSPENDED = "Suspended"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"
    #: False when the run went on with a harness flagged for reward integrity (it scored without the model)
    REWARD_INTEGRITY = "RewardIntegrity"
    #: the local runner only: the last runner stopped before the run ended
    INTERRUPTED = "Interrupted"
    #: True while a child runs and the store showed no progress for ``spec.execution.retry.stallAfterSeconds`` (an alert)
    STALLED = "Stalled"
    #: the operator: the API server refused to create or update one of the run's children (present only while
    #: it does: the reason is the HTTP status' name, the message names the child and the server's words)
    CHILD_CREATE_FAILED = "ChildCreateFailed"
    #: the operator, under a queue: True while a phase's child waits for Kueue to admit it (first, or again after
    #: an eviction: the reason says which, the message gives Kueue's words)
    QUEUED = "Queued"
    #: the operator, under a queue: True while a phase's child runs admitted by Kueue
    ADMITTED = "Admitted"


class BestEval(WireModel):
    """The best test mean@k seen so far and where it came from (the paper's headline figure)."""

    model_config = ConfigDict(allow_inf_nan=True)  # status reports what was observed

    mean_at_k: float
    k: int
    phase: str
    cycle: int
    step: int
    harness: str | None = None
    checkpoint: str | None = None
    rollouts_at: int = Field(0, description="training rollouts spent when this point was reached")
    iteration: int | None = Field(
        None, description="mh_only: the harness-search iteration whose accepted harness this point evaluates"
    )


class Condition_(WireModel):  # noqa: N801 - metav1.Condition, named apart from the run Condition enum
    model_config = ConfigDict(allow_inf_nan=True)

    type: str
    status: Literal["True", "False", "Unknown"]
    reason: str
    message: str = ""
    last_transition_time: str | None = None
    observed_generation: int | None = None


MetaCondition = Condition_


class EvalPoint(WireModel):
    """One evaluation the run owes: (checkpoint, harness) at a point of the schedule."""

    model_config = ConfigDict(allow_inf_nan=True)

    phase: str
    cycle: int
    step: int
    after: Literal["start", "weight", "harness"]
    checkpoint: str | None = None
    harness: str | None = None
    rollouts_at: int = 0
    iteration: int | None = Field(
        None, description="mh_only: the harness-search iteration whose accepted harness this evaluates"
    )
    mean_at_k: float | None = Field(None, description="set when the evaluation finished")
    k: int | None = Field(None, description="k of meanAtK, set with it")
    flagged: bool = Field(
        False, description="the evaluation was flagged for reward integrity (never the run's best; see integrityFlags)"
    )

    def finished(self, mean_at_k: float, k: int, flagged: bool = False) -> EvalPoint:
        """This point with its evaluation's result."""
        return self.model_copy(update={"mean_at_k": mean_at_k, "k": k, "flagged": flagged})


class IntegrityFlagStatus(WireModel):
    """A harness candidate, or an evaluation, whose reward did not come through the model (from its phase's
    result)."""

    phase: str
    candidate: str = Field(description="the candidate's id; for an evaluation, the harness it evaluated (h0: `h0`)")
    accepted: bool = Field(False, description="true: the run went on with this harness (integrity action flag)")
    evaluation: bool = Field(False, description="true: an evaluation was flagged (its mean is never the best)")
    reasons: list[str] = Field(default_factory=list, description="`[rule] message with the numbers`")


class WhaleRunStatus(WireModel):
    """What `kubectl get wr` shows, and everything ``decide()`` needs to resume a run.

    Written by one writer: the controller applying ``decide()``. Counters (attempts, failures,
    preemptions, rollouts) are owned here and never recomputed from children."""

    model_config = ConfigDict(
        alias_generator=to_camel, populate_by_name=True, extra="ignore", frozen=True, allow_inf_nan=True
    )

    phase: RunPhase = RunPhase.PENDING
    cycle: NonNegInt = 0
    stage: Stage | None = None
    step: NonNegInt = Field(0, description="global RSFT steps reached (latest logged step while training)")
    iteration: NonNegInt = Field(0, description="harness iterations done in the current harness phase")
    training_reward: float | None = Field(None, description="mean training reward of the latest RSFT step")
    harness_score: float | None = Field(None, description="best D_harness score in the current harness phase")
    steps_per_epoch: NonNegInt | None = None
    total_steps: NonNegInt | None = None
    current_checkpoint: str | None = Field(None, description="store key; None: the base model theta0")
    current_harness: str | None = Field(None, description="store key; None: the domain's h0")
    checkpoint_step: NonNegInt = Field(0, description="the step of currentCheckpoint")
    active_phase: str | None = Field(None, description="the main (weight/harness) phase running now")
    completed_phases: list[str] = Field(default_factory=list, description="main phases done, in order")
    attempts: dict[str, int] = Field(default_factory=dict, description="current attempt number per phase")
    failures: dict[str, int] = Field(default_factory=dict, description="failed attempts per phase")
    preemptions: NonNegInt = Field(0, description="attempts replaced after the cluster disrupted them (no failure)")
    evictions: dict[str, int] = Field(
        default_factory=dict,
        description="times Kueue evicted the current attempt of each phase (the same Job is kept and re-admitted; "
        "more than spec.execution.retry.maxEvictions fails the run)",
    )
    stop_requested: list[str] = Field(default_factory=list, description="phases asked to stop early")
    rollouts_completed: NonNegInt = Field(0, description="training rollouts of finished phases")
    rollouts_spent: NonNegInt = Field(0, description="training rollouts so far (finished + running phases)")
    empty_steps: NonNegInt = Field(
        0,
        description="RSFT steps so far that kept no trajectory (no reward above rsft.scoreThreshold: SFT skipped, "
        "the weights did not move), finished + running weight phases; a warning when it grows",
    )
    empty_steps_completed: NonNegInt = Field(0, description="emptySteps of the finished weight phases")
    last_empty_step: NonNegInt | None = Field(None, description="the latest global step that kept no trajectory")
    evals: list[EvalPoint] = Field(default_factory=list)
    best: BestEval | None = Field(None, description="the best test mean@k over every evaluation point")
    final: BestEval | None = Field(
        None,
        description="the test mean@k of the run's last evaluation point in schedule order - the agent it "
        "ends with; set when the run succeeds. Beside best: a condition evaluated more often is not favoured here",
    )
    integrity_flags: list[IntegrityFlagStatus] = Field(
        default_factory=list,
        description="harness candidates flagged for reward integrity (at most 20 per phase, "
        "the accepted one first; the phase's result.json lists them all) and flagged evaluations (evaluation: "
        "true; never the best)",
    )
    last_eval_mean: float | None = None
    reason: str | None = None
    message: str | None = None
    start_time: str | None = None
    completion_time: str | None = None
    last_progress_time: str | None = Field(
        None,
        description="when the store last showed progress (a metrics line, a result, a checkpoint) or a phase's "
        "child was started or ended; the Stalled condition counts from here",
    )
    progress_mark: str | None = Field(
        None,
        description="what the store showed at lastProgressTime (main phases and evaluations done, failed attempts, "
        "metrics lines of the running phases, complete checkpoints, the phases whose child runs or is being "
        "started); a different mark is progress",
    )
    observed_generation: int | None = None
    conditions: list[MetaCondition] = Field(default_factory=list)
    store_uri: str | None = Field(
        None,
        description="where this run's data lives: on a cluster <storage.uri>/<namespace>/<name>.<uid> (its own, "
        "or the one spec.execution.resumeFrom adopted); `whale status NAME --store <storeUri>` reads it",
    )
