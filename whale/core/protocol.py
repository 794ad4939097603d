"""The messages between controllers and workloads, as they sit in the store.

A controller (local runner or operator) writes a :class:`PhaseRequest` to
``layout.request_key(run, phase)`` and launches the workload ``python -m whale.workloads <kind>
--store URI --run RUN --phase PHASE``. The workload appends metrics lines to
``layout.metrics_key`` and, when it is done, writes its result to ``layout.result_key`` — last and
atomically, so the result's presence means "phase done". Between steps/iterations the workload
checks ``layout.stop_key``: a stop request (the adaptive rule fired) ends the phase cleanly, with
a result, at the current step. Pure: models only.

Every model here is camelCase on the wire, like the spec.
"""

from __future__ import annotations

import enum
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter
from pydantic.alias_generators import to_camel

from whale.core.spec import Sampling, WhaleRunSpec


class _Wire(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="ignore", frozen=True)

    def to_wire(self) -> dict[str, Any]:
        return self.model_dump(mode="json", by_alias=True)


class PhaseKind(str, enum.Enum):
    WEIGHT = "weight"
    HARNESS = "harness"
    EVAL = "eval"
    #: data preparation: materialise the splits, write their sizes (before anything else can be scheduled)
    PREPARE = "prepare"

    @property
    def workload(self) -> str:
        """The workload entrypoint that runs this kind of phase."""
        return {"weight": "train", "harness": "search", "eval": "eval", "prepare": "prepare"}[self.value]


class WeightStopRule(_Wire):
    """Adaptive weight patience, already converted to steps (phase-local)."""

    window_steps: int
    burn_in_steps: int
    patience_steps: int


class HarnessStopRule(_Wire):
    """Adaptive harness patience in ARCHIVE iterations: iteration 1 is the incoming harness's re-evaluation
    (``whale.core.schedule`` converts the spec's proposer-iteration maximum: maxIterations 15 -> 16 here)."""

    min_iterations: int
    patience: int
    max_iterations: int


class WeightPhaseArgs(_Wire):
    """RSFT from ``fromStep`` (checkpoint ``fromCheckpoint``; None = the base model) up to ``targetStep``
    under harness ``harness`` (a store key of a harness file; None = the domain's h0)."""

    cycle: int
    harness: str | None
    from_checkpoint: str | None
    from_step: int
    target_step: int
    save_steps: list[int] = Field(default_factory=list, description="also checkpoint at these global steps")
    steps_per_epoch: int
    total_steps: int = Field(..., description="the run's weight budget T (the learning-rate schedule spans it)")
    stop_rule: WeightStopRule | None = None


class HarnessPhaseArgs(_Wire):
    """Meta-Harness search under fixed weights ``checkpoint`` (None = base model), starting from
    ``incomingHarness`` (None = h0), for ``iterations`` archive iterations (the incoming re-evaluation is
    iteration 1, so ``iterations - 1`` proposer iterations), or by ``stopRule`` (then ``iterations`` is the
    maximum)."""

    cycle: int
    incoming_harness: str | None
    checkpoint: str | None
    step: int
    iterations: int
    stop_rule: HarnessStopRule | None = None
    archive: str = Field(..., description="store prefix of this phase's candidate archive")


class EvalPhaseArgs(_Wire):
    cycle: int
    step: int
    after: Literal["start", "weight", "harness"]
    checkpoint: str | None
    harness: str | None
    iteration: int | None = Field(
        None, description="mh_only: the harness-search iteration whose accepted harness is evaluated"
    )


class PreparePhaseArgs(_Wire):
    """Data preparation needs nothing beyond the run's spec (``layout.spec_key``, written before it starts);
    it writes ``layout.split_sizes_key`` last (``whale.workloads.prepare``)."""


class _Request(_Wire):
    """What every request names: the run, the phase, the attempt, and the sampling its rollouts use —
    resolved by ``decide`` (``rsft.sampling``; evaluations at ``evaluation.temperature``). Everything else a
    workload needs of the run is in the run's ``spec.json`` (``layout.spec_key``), read once."""

    run: str
    phase: str
    attempt: int
    sampling: Sampling


class WeightRequest(_Request):
    kind: Literal[PhaseKind.WEIGHT] = PhaseKind.WEIGHT
    weight: WeightPhaseArgs

    @property
    def samples_from(self) -> str | None:
        """The checkpoint the phase's rollouts sample from (None: the base model)."""
        return self.weight.from_checkpoint


class HarnessRequest(_Request):
    kind: Literal[PhaseKind.HARNESS] = PhaseKind.HARNESS
    harness: HarnessPhaseArgs

    @property
    def samples_from(self) -> str | None:
        return self.harness.checkpoint


class EvalRequest(_Request):
    kind: Literal[PhaseKind.EVAL] = PhaseKind.EVAL
    eval: EvalPhaseArgs

    @property
    def samples_from(self) -> str | None:
        return self.eval.checkpoint


class PrepareRequest(_Request):
    kind: Literal[PhaseKind.PREPARE] = PhaseKind.PREPARE
    prepare: PreparePhaseArgs = Field(default_factory=PreparePhaseArgs)

    @property
    def samples_from(self) -> str | None:
        return None  # it samples nothing


#: a phase request, tagged by ``kind`` (the wire form of ``request.json``)
PhaseRequest = Annotated[WeightRequest | HarnessRequest | EvalRequest | PrepareRequest, Field(discriminator="kind")]
_REQUEST: TypeAdapter[WeightRequest | HarnessRequest | EvalRequest | PrepareRequest] = TypeAdapter(PhaseRequest)


def phase_request(
    spec: WhaleRunSpec | dict[str, Any],
    *,
    run: str,
    phase: str,
    attempt: int,
    args: WeightPhaseArgs | HarnessPhaseArgs | EvalPhaseArgs | PreparePhaseArgs,
) -> WeightRequest | HarnessRequest | EvalRequest | PrepareRequest:
    """The request for ``args``, with the sampling its rollouts use resolved from ``spec``: ``rsft.sampling``,
    at ``evaluation.temperature`` for an evaluation. The one place a request is built (``decide`` uses it)."""
    if not isinstance(spec, WhaleRunSpec):
        spec = WhaleRunSpec.model_validate(spec)
    sampling = spec.experiment.rsft.sampling
    if isinstance(args, WeightPhaseArgs):
        return WeightRequest(run=run, phase=phase, attempt=attempt, sampling=sampling, weight=args)
    if isinstance(args, HarnessPhaseArgs):
        return HarnessRequest(run=run, phase=phase, attempt=attempt, sampling=sampling, harness=args)
    if isinstance(args, PreparePhaseArgs):
        return PrepareRequest(run=run, phase=phase, attempt=attempt, sampling=sampling, prepare=args)
    at_eval = sampling.model_copy(update={"temperature": spec.experiment.evaluation.temperature})
    return EvalRequest(run=run, phase=phase, attempt=attempt, sampling=at_eval, eval=args)


def parse_request(raw: Any) -> WeightRequest | HarnessRequest | EvalRequest | PrepareRequest:
    """A request from its wire form; ``pydantic.ValidationError`` when it is none."""
    return _REQUEST.validate_python(raw)


# ----- what workloads write -----------------------------------------------------------------------


class WeightStepMetrics(_Wire):
    """One line of a weight phase's metrics.jsonl, appended after every RSFT step."""

    step: int
    epoch: float
    reward_mean: float
    acceptance_rate: float
    kept: int
    loss: float | None
    learning_rate: float
    rollouts: int
    tokens_trained: int = 0
    seconds_sampling: float = 0.0
    seconds_training: float = 0.0
    seconds_syncing: float = 0.0
    tokens_per_second: float = 0.0
    device: str | None = Field(
        None,
        description="the trainer's torch device type (cuda, cpu): a step on cpu held no GPU, whatever the spec "
        "asks of a cluster (GPU-hours, whale.report.series); None: not recorded",
    )


class CandidateScore(_Wire):
    id: str
    score: float | None = Field(None, description="success rate on D_harness; None when it never got scored")
    mean_turns: float | None = None
    error: str | None = None
    integrity_flags: list[str] = Field(default_factory=list, description="reward-integrity flags, `[rule] message`")


class HarnessIterationMetrics(_Wire):
    """One line of a harness phase's metrics.jsonl, appended after every iteration."""

    iteration: int
    best_score: float = Field(..., description="the archive's best training score after this iteration")
    best_candidate: str = Field(..., description="the accepted (best-so-far) candidate after this iteration")
    best_harness: str | None = Field(
        None,
        description="store key of bestCandidate's harness file (in the phase's archive); None when no "
        "candidate is scored yet",
    )
    candidates: list[CandidateScore] = Field(default_factory=list)
    rollouts: int
    seconds: float = Field(
        0.0, description="wall time of the iteration: proposing and scoring its candidates (0: not recorded)"
    )
    device: str | None = Field(
        None,
        description="where the candidates' model calls ran when in this process (cpu, cuda); None: an inference "
        "server, whose GPUs are the spec's",
    )


class EvalProgress(_Wire):
    """One line of an eval phase's metrics.jsonl: at its start, then after every chunk of items."""

    items_done: int
    items_total: int


#: one line of a phase's metrics.jsonl, as its kind writes it
PhaseMetrics = WeightStepMetrics | HarnessIterationMetrics | EvalProgress

_METRICS_MODEL: dict[PhaseKind, type[WeightStepMetrics | HarnessIterationMetrics | EvalProgress]] = {
    PhaseKind.WEIGHT: WeightStepMetrics,
    PhaseKind.HARNESS: HarnessIterationMetrics,
    PhaseKind.EVAL: EvalProgress,
}


def parse_metrics_line(kind: PhaseKind, raw: Any) -> PhaseMetrics:
    """One metrics line of a phase of ``kind`` as its model (raises pydantic's ``ValidationError``; a
    ``ValueError`` for data preparation, which writes no metrics)."""
    model = _METRICS_MODEL.get(kind)
    if model is None:
        raise ValueError(f"a {kind.value} phase writes no metrics lines")
    return model.model_validate(raw)


class ProgressStage(str, enum.Enum):
    """What a running phase is doing now (:class:`PhaseProgress`)."""

    SAMPLING = "sampling"
    TRAINING = "training"
    SYNCING = "syncing"
    CHECKPOINTING = "checkpointing"
    PROPOSING = "proposing"
    SCORING = "scoring"
    EVALUATING = "evaluating"


class PhaseProgress(_Wire):
    """Where a running phase is now: one small object (``layout.progress_key``) the workload replaces at
        each stage and, within one, at most every few seconds. It is for people watching (`whale run`'s
        display): no controller decides on it; the metrics lines and the result stay the record.

        A weight step reports ``sampling`` (``done``/``total`` rollouts), then ``training`` with the reward
        and kept count of the rollouts it just sampled (known before its SFT update and its metrics line), then
        ``syncing`` and ``checkpointing``. A harness iteration reports ``proposing``, then ``scoring`` each
        candidate (``done``/``total`` candidates of the iteration). An evaluation reports ``evaluating`` with
    ``done``/``total`` episodes as they finish (its items' metrics lines follow after each chunk; ``unit`` items:
    an older workload's count of items at its start)."""

    stage: ProgressStage
    step: int | None = Field(None, description="weight: the global step being worked on (1-based)")
    iteration: int | None = Field(None, description="harness: the iteration being worked on")
    candidate: str | None = Field(None, description="harness: the candidate being scored")
    done: int | None = None
    total: int | None = None
    unit: str | None = Field(None, description="what done/total count: rollouts, candidates, items")
    reward_mean: float | None = Field(None, description="weight: mean reward of the step's sampled rollouts")
    acceptance_rate: float | None = Field(None, description="weight: kept fraction of the step's rollouts")
    kept: int | None = None
    rollouts: int | None = None


StopReason = Literal["target", "patience", "stop-request", "iterations"]
#: spec.execution.sandbox.isolation a phase's untrusted code ran under ("namespaces" fails closed, so it was achieved; "pod"
#: runs only on a cluster, in the harness pod)
SandboxIsolation = Literal["namespaces", "pod", "none"]
_ISOLATION_HELP = (
    "spec.execution.sandbox.isolation the phase's harness processes and code tools ran under; "
    "pod = in the run's harness pod, walled by the pod; none = NOT isolated (trusted local use only); "
    "None = not recorded"
)


class WeightPhaseResult(_Wire):
    final_step: int
    checkpoint: str = Field(..., description="store prefix of the checkpoint at finalStep")
    rollouts: int
    stopped_by: StopReason = "target"
    empty_steps: list[int] = Field(
        default_factory=list,
        description="global steps of this phase that kept no trajectory (no SFT: the weights "
        "did not move); the run's status counts them (emptySteps, lastEmptyStep)",
    )
    sandbox_isolation: SandboxIsolation | None = Field(None, description=_ISOLATION_HELP)


class IntegrityFlag(_Wire):
    """A candidate whose reward did not come through the model (``whale.metaharness.integrity``)."""

    candidate: str
    reasons: list[str] = Field(..., description="one `[rule] message with the numbers` each")
    score: float | None = None
    completion_tokens_per_episode: float | None = None
    episodes_without_model: int | None = None
    accepted: bool = Field(
        False,
        description="accepted all the same (integrity action `flag`, or the incoming harness as the phase's fallback)",
    )


class AcceptedHarness(_Wire):
    """An iteration after which the phase's accepted (best-so-far) harness was a new one."""

    iteration: int
    candidate: str
    harness: str = Field(..., description="store key of the candidate's harness file (in the phase's archive)")
    score: float
    rollouts: int = Field(..., description="rollouts the phase had spent by the end of this iteration")


class HarnessPhaseResult(_Wire):
    accepted_harness: str = Field(..., description="store key of the accepted harness file")
    accepted_candidate: str
    accepted_score: float
    iterations: int = Field(..., description="archive iterations run, the incoming re-evaluation included")
    rollouts: int
    accepted_by_iteration: list[AcceptedHarness] = Field(
        default_factory=list,
        description="every iteration whose accepted harness was new, in order (iteration 1: "
        "the incoming harness); the last is acceptedCandidate. mh_only evaluates each of them",
    )
    stopped_by: StopReason = "iterations"
    integrity_flags: list[IntegrityFlag] = Field(
        default_factory=list, description="every candidate of the phase flagged for reward integrity"
    )
    sandbox_isolation: SandboxIsolation | None = Field(None, description=_ISOLATION_HELP)


class EvalModelUsage(_Wire):
    """How the evaluated harness used the model, over every episode of the evaluation (per item in
    the eval's per_item.jsonl). A harness that answers without the model shows here."""

    episodes: int = 0
    episodes_without_model: int = Field(0, description="episodes that made no model call")
    rewarded_without_model: int = Field(0, description="rewarded episodes that made no model call")
    items_answered_without_model: int = Field(
        0, description="items with at least one rewarded episode that made no model call"
    )
    mean_completion_tokens: float = Field(0.0, description="model completion tokens per episode")
    mean_turns: float = Field(0.0, description="model calls per episode")
    answer_not_model: int = Field(
        0, description="episodes whose graded answer no model reply held (scored 0: whale.harness.provenance)"
    )
    rewarded_injected: int = Field(
        0, description="rewarded episodes whose harness messages held the gold answer before the model wrote it"
    )


class EvalResult(_Wire):
    mean_at_k: float
    k: int
    items: int
    per_subset: dict[str, float] = Field(default_factory=dict)
    checkpoint: str | None = None
    harness: str | None = None
    notes: list[str] = Field(default_factory=list, description="e.g. benchmarks missing from the data")
    model_usage: EvalModelUsage | None = Field(None, description="model usage over the evaluation's episodes")
    sandbox_isolation: SandboxIsolation | None = Field(None, description=_ISOLATION_HELP)
    integrity_flags: list[str] = Field(
        default_factory=list,
        description="reward-integrity flags of this evaluation, `[rule] message` (whale.metaharness.integrity); "
        "a flagged evaluation is never the run's best",
    )


RESULT_MODELS: dict[PhaseKind, type[_Wire]] = {
    PhaseKind.WEIGHT: WeightPhaseResult,
    PhaseKind.HARNESS: HarnessPhaseResult,
    PhaseKind.EVAL: EvalResult,
}
