"""Pure: conditions, events and the status patch of a WhaleRun.

``decide()`` owns phase, stage, counters and reason; this module derives the metav1 conditions
from them (``lastTransitionTime`` changes only when a condition's status flips) and the Kubernetes
Events that describe what changed between two statuses. No clock: ``now`` is passed in.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from whale.core.alternation import Action, Child, Fail, Finish, ServeCheckpoint, StartPhase, StopPhase, SuspendRun
from whale.core.protocol import PhaseKind
from whale.core.state import NOT_STALLED_REASON, RunState, progress_seen_message
from whale.core.state import integrity_condition as core_integrity_condition
from whale.core.status import ConditionType, MetaCondition, Reason, RunPhase, Stage, WhaleRunStatus
from whale_operator import kueue

#: condition types, in the order they are listed (Interrupted belongs to the local runner)
INFERENCE_READY = ConditionType.INFERENCE_READY.value
PROGRESSING = ConditionType.PROGRESSING.value
SUSPENDED = ConditionType.SUSPENDED.value
SUCCEEDED = ConditionType.SUCCEEDED.value
FAILED = ConditionType.FAILED.value
REWARD_INTEGRITY = ConditionType.REWARD_INTEGRITY.value
STALLED = ConditionType.STALLED.value
QUEUED = ConditionType.QUEUED.value
ADMITTED = ConditionType.ADMITTED.value
CONDITION_TYPES = (
    INFERENCE_READY,
    PROGRESSING,
    SUSPENDED,
    SUCCEEDED,
    FAILED,
    REWARD_INTEGRITY,
    STALLED,
    QUEUED,
    ADMITTED,
)

#: the Progressing condition's reason while a stage runs
_STAGE_REASON: dict[Stage | None, str] = {
    Stage.WEIGHT: "WeightPhase",
    Stage.HARNESS: "HarnessPhase",
    Stage.EVAL: "Evaluating",
}

#: the Queued/Admitted reason when Kueue says the run's LocalQueue does not exist
LOCAL_QUEUE_NOT_FOUND = "LocalQueueNotFound"

NORMAL = "Normal"
WARNING = "Warning"


@dataclass(frozen=True)
class Event:
    """A Kubernetes Event about the WhaleRun: CamelCase reason, Normal or Warning."""

    type: str
    reason: str
    message: str


@dataclass(frozen=True)
class InferenceView:
    """What the operator sees of the inference server."""

    managed: bool  # False: no vLLM Deployment (transformers in the worker, or an external endpoint)
    ready: bool = False
    #: a colocated weight phase runs: it has its own server, and the Deployment is scaled to 0 meanwhile
    colocated_training: bool = False


@dataclass(frozen=True)
class QueueView:
    """What the operator sees of the run's queue (``spec.cluster.queueName``): its current children as the queue
    holds them, each in words (``<kind> <name> ...``)."""

    #: the LocalQueue; None: the run names none (nothing is queued)
    queue: str | None = None
    #: the cluster serves Kueue's Workload API (False: nothing will admit the run's suspended children)
    served: bool = True
    waiting: tuple[str, ...] = ()
    evicted: tuple[str, ...] = ()
    admitted: tuple[str, ...] = ()
    #: the children whose Workload Kueue found no such LocalQueue for (:func:`kueue.missing_local_queue`)
    queue_missing: tuple[str, ...] = ()
    #: the run's namespace, where the LocalQueue must be
    namespace: str = ""

    def with_child(
        self, name: str, child_obj: dict[str, Any], child: Child, facts: kueue.WorkloadFacts | None
    ) -> QueueView:
        """This view with one more (unfinished) child: waiting, evicted and waiting again, or admitted."""
        if not kueue.suspended(child_obj):
            return dataclasses.replace(self, admitted=(*self.admitted, name))
        if facts is not None and facts.missing_queue:
            return dataclasses.replace(self, queue_missing=(*self.queue_missing, name))
        said = []
        if facts is not None and not facts.active:
            said.append(
                f"its Workload {facts.name} is deactivated (spec.active false): Kueue admits it again only "
                "once it is reactivated"
            )
        if facts is not None and facts.requeue_at:
            said.append(f"requeued by Kueue at {facts.requeue_at} (its back-off)")
        if facts is not None and facts.pending:
            said.append(f"Kueue: {facts.pending}")
        if child.evictions:
            why = facts.evicted if facts is not None and facts.evicted else "Kueue's Workload not read"
            line = f"{name} evicted {child.evictions} time(s) (last: {why}); kept for Kueue to re-admit"
            return dataclasses.replace(self, evicted=(*self.evicted, "; ".join([line, *said])))
        return dataclasses.replace(self, waiting=(*self.waiting, "; ".join([f"{name} waits for admission", *said])))


def queue_conditions(view: QueueView | None) -> list[tuple[str, str, str, str]]:
    """Queued and Admitted from what the operator saw of the run's queue."""
    if view is None or view.queue is None:
        text = "spec.cluster.queueName is not set: the run's children are not queued"
        return [_cond(QUEUED, False, "NoQueue", text), _cond(ADMITTED, False, "NoQueue", text)]
    if not view.served:
        text = (
            f"spec.cluster.queueName {view.queue}: this cluster serves no {kueue.WORKLOAD_API_VERSION} (Kueue is not "
            "installed), so nothing admits the run's suspended children; install Kueue, or remove queueName"
        )
        return [_cond(QUEUED, True, "KueueNotInstalled", text), _cond(ADMITTED, False, "KueueNotInstalled", text)]
    admitted = _cond(
        ADMITTED, True, "Admitted", _clip(f"admitted by LocalQueue {view.queue}: {', '.join(view.admitted)}")
    )
    if view.queue_missing:
        where = f" in namespace {view.namespace}" if view.namespace else ""
        text = _clip(
            f'spec.cluster.queueName {view.queue}: there is no LocalQueue {view.queue}{where} (Kueue: "LocalQueue '
            f"{view.queue} doesn't exist\"), so Kueue will not admit "
            f"{', '.join(view.queue_missing)}; create the LocalQueue (pointing at a ClusterQueue), or set queueName "
            f"to one that exists (kubectl get localqueues{' -n ' + view.namespace if view.namespace else ''})"
        )
        return [
            _cond(QUEUED, True, LOCAL_QUEUE_NOT_FOUND, text),
            admitted if view.admitted else _cond(ADMITTED, False, LOCAL_QUEUE_NOT_FOUND, text),
        ]
    if view.evicted:
        text = _clip("; ".join((*view.evicted, *view.waiting)))
        return [
            _cond(QUEUED, True, "Evicted", text),
            admitted if view.admitted else _cond(ADMITTED, False, "Evicted", text),
        ]
    if view.waiting:
        text = _clip(f"LocalQueue {view.queue}: " + "; ".join(view.waiting))
        return [
            _cond(QUEUED, True, "WaitingForAdmission", text),
            admitted if view.admitted else _cond(ADMITTED, False, "WaitingForAdmission", text),
        ]
    if view.admitted:
        return [_cond(QUEUED, False, "Admitted", admitted[3]), admitted]
    text = "no phase child exists now"
    return [_cond(QUEUED, False, "NoChild", text), _cond(ADMITTED, False, "NoChild", text)]


def _clip(text: str) -> str:
    return text if len(text) <= 1000 else text[:997] + "..."


def _cond(type_: str, ok: bool, reason: str, message: str = "") -> tuple[str, str, str, str]:
    return type_, "True" if ok else "False", reason, message


def desired_conditions(status: WhaleRunStatus, inference: InferenceView) -> list[tuple[str, str, str, str]]:
    """(type, status, reason, message) for every condition type."""
    phase = status.phase
    running = phase is RunPhase.RUNNING
    if not inference.managed:
        inf = _cond(INFERENCE_READY, True, "NotManaged", "no vLLM Deployment for this inference backend")
    elif phase.is_terminal() or phase is RunPhase.SUSPENDED:
        inf = _cond(INFERENCE_READY, False, "ScaledDown", "the run does not need inference now")
    elif running and inference.colocated_training:
        inf = _cond(
            INFERENCE_READY,
            False,
            "ScaledDown",
            f"{status.active_phase} samples from the vLLM server in its own pod (placement colocated); the run's "
            "Deployment is scaled to 0 until a phase needs it",
        )
    elif inference.ready:
        inf = _cond(INFERENCE_READY, True, "Serving", f"serving {status.current_checkpoint or 'the base model'}")
    else:
        inf = _cond(INFERENCE_READY, False, "Starting", "vLLM is not ready yet")

    if running:
        stage = status.stage.value if status.stage else "starting"
        where = status.active_phase or stage
        prog = _cond(
            PROGRESSING,
            True,
            _STAGE_REASON.get(status.stage, "Starting"),
            f"cycle {status.cycle}, {where}",
        )
    elif phase is RunPhase.PENDING and status.reason and status.message:  # waiting, and why (data, credentials)
        prog = _cond(PROGRESSING, False, status.reason, status.message)
    elif phase is RunPhase.PENDING:
        prog = _cond(PROGRESSING, False, "Pending", "not started yet")
    else:
        prog = _cond(PROGRESSING, False, phase.value, status.message or "")
    return [
        inf,
        prog,
        _cond(
            SUSPENDED,
            phase is RunPhase.SUSPENDED,
            "Suspended" if phase is RunPhase.SUSPENDED else "NotSuspended",
            "spec.execution.suspend is true" if phase is RunPhase.SUSPENDED else "",
        ),
        _cond(
            SUCCEEDED,
            phase is RunPhase.SUCCEEDED,
            status.reason or "Completed" if phase is RunPhase.SUCCEEDED else "NotSucceeded",
            status.message or "" if phase is RunPhase.SUCCEEDED else "",
        ),
        _cond(
            FAILED,
            phase is RunPhase.FAILED,
            (status.reason or "Failed") if phase is RunPhase.FAILED else "NotFailed",
            (status.message or "") if phase is RunPhase.FAILED else "",
        ),
        integrity_condition(status),
        stalled_condition(status),
    ]


def stalled(status: WhaleRunStatus) -> MetaCondition | None:
    """The Stalled condition as ``decide`` set it (:meth:`RunState.stalled`, read off the status itself)."""
    return next((c for c in status.conditions if c.type == ConditionType.STALLED), None)


def stalled_condition(status: WhaleRunStatus) -> tuple[str, str, str, str]:
    """Stalled as ``decide`` set it (it knows the store's progress and the threshold); False before it did, in the words
    ``decide`` will use (or its next call would rewrite the condition: a status write for nothing)."""
    cond = stalled(status)
    if cond is None:
        return _cond(STALLED, False, NOT_STALLED_REASON, progress_seen_message(status.last_progress_time))
    return STALLED, cond.status, cond.reason, cond.message


def integrity_condition(status: WhaleRunStatus) -> tuple[str, str, str, str]:
    """RewardIntegrity from ``status.integrityFlags`` (the rule is the core's, shared with ``whale run``)."""
    st, reason, message = core_integrity_condition(status.integrity_flags)
    return REWARD_INTEGRITY, st, reason, message


def with_conditions(
    status: WhaleRunStatus,
    previous: list[MetaCondition],
    inference: InferenceView,
    generation: int | None,
    now: str,
    queue: QueueView | None = None,
) -> WhaleRunStatus:
    """``status`` with its conditions recomputed; a condition keeps its lastTransitionTime unless its
    status flipped. ``queue`` None (a reconcile that saw no children): Queued and Admitted stay as they were.
    Only what changed is built: a condition equal to the one before is that object, and ``status`` itself comes
    back when every condition is the one it holds (most reconciles change none)."""
    before = {c.type: c for c in previous}
    out: list[MetaCondition] = []
    if queue is not None:
        queued = queue_conditions(queue)
    else:
        unseen = _cond(QUEUED, False, "NoChild", "no phase child seen yet")
        queued = [
            (c.type, c.status, c.reason, c.message) if (c := before.get(t)) is not None else (t, *unseen[1:])
            for t in (QUEUED, ADMITTED)
        ]
    for type_, st, reason, message in [*desired_conditions(status, inference), *queued]:
        old = before.get(type_)
        since = old.last_transition_time if old is not None and old.status == st and old.last_transition_time else now
        if (
            old is not None
            and old.status == st
            and old.reason == reason
            and old.message == message
            and old.last_transition_time == since
            and old.observed_generation == generation
        ):
            out.append(old)
            continue
        out.append(
            MetaCondition(
                type=type_,
                status=st,
                reason=reason,
                message=message,
                last_transition_time=since,
                observed_generation=generation,
            )
        )
    if len(out) == len(status.conditions) and all(a is b for a, b in zip(out, status.conditions, strict=True)):
        return status
    return status.model_copy(update={"conditions": out})


def _condition_with(status: WhaleRunStatus, type_: str, reason: str) -> MetaCondition | None:
    return next((c for c in status.conditions if c.type == type_ and c.reason == reason), None)


def events(before: WhaleRunStatus, after: WhaleRunStatus, actions: tuple[Action, ...]) -> list[Event]:
    """The Events describing one reconcile's transition."""
    out: list[Event] = []
    if before.phase is not after.phase:
        if after.phase is RunPhase.RUNNING and before.phase is RunPhase.PENDING:
            out.append(Event(NORMAL, "Started", "run started"))
        elif after.phase is RunPhase.RUNNING and before.phase is RunPhase.SUSPENDED:
            out.append(Event(NORMAL, "Resumed", "spec.execution.suspend is false; resuming from the store"))
        elif after.phase is RunPhase.SUSPENDED:
            out.append(Event(NORMAL, "Suspended", "spec.execution.suspend is true; children stopped"))
        elif after.phase is RunPhase.SUCCEEDED:
            out.append(Event(NORMAL, "Succeeded", after.message or "run complete"))
        elif after.phase is RunPhase.FAILED:
            out.append(Event(WARNING, "Failed", f"{after.reason}: {after.message}"))
    if len(after.integrity_flags) > len(before.integrity_flags):
        new = after.integrity_flags[len(before.integrity_flags) :]
        out.append(
            Event(
                WARNING,
                REWARD_INTEGRITY,
                "; ".join(
                    f"{f.phase}/{f.candidate} "
                    f"{'evaluation flagged' if f.evaluation else 'ACCEPTED' if f.accepted else 'not accepted'}: "
                    f"{f.reasons[0] if f.reasons else 'flagged'}"
                    for f in new
                )[:1000],
            )
        )
    missing = _condition_with(after, QUEUED, LOCAL_QUEUE_NOT_FOUND)
    if missing is not None and _condition_with(before, QUEUED, LOCAL_QUEUE_NOT_FOUND) is None:
        out.append(Event(WARNING, LOCAL_QUEUE_NOT_FOUND, missing.message or ""))
    if after.preemptions > before.preemptions:
        out.append(Event(WARNING, "Preempted", f"a child was preempted ({after.preemptions} so far); retrying"))
    if after.best is not None and (before.best is None or after.best.mean_at_k > before.best.mean_at_k):
        out.append(
            Event(NORMAL, "NewBest", f"best mean@{after.best.k} {after.best.mean_at_k:.4f} at {after.best.phase}")
        )
    for action in actions:
        if isinstance(action, StartPhase) and action.kind is PhaseKind.PREPARE:
            if action.attempt > 1:  # why the last attempt failed: decide's retry message
                out.append(Event(WARNING, "PrepareRetried", f"attempt {action.attempt}: {after.message or ''}"))
            else:
                out.append(Event(NORMAL, "Preparing", "materialising the data splits"))
        elif isinstance(action, StartPhase):
            if action.attempt > 1:
                out.append(Event(WARNING, "PhaseRetried", f"{action.phase}: starting attempt {action.attempt}"))
            else:
                out.append(Event(NORMAL, "PhaseStarted", f"{action.phase} ({action.kind.value})"))
        elif isinstance(action, StopPhase):
            out.append(Event(NORMAL, "StopRequested", f"{action.phase}: {action.reason}"))
        elif isinstance(action, ServeCheckpoint):
            out.append(Event(NORMAL, "ServingCheckpoint", action.checkpoint or "base model"))
        elif isinstance(action, (Finish, Fail, SuspendRun)):
            pass  # covered by the phase transition above
    return out


def evicted_event(phase: str, child: str, count: int, words: str, limit: int) -> Event:
    """The Warning Event of an eviction the operator just counted."""
    why = f" ({words})" if words else ""
    return Event(
        WARNING,
        "Evicted",
        _clip(
            f"{phase}: its queue evicted {child}{why}; kept for Kueue to re-admit (eviction {count}; "
            f"spec.execution.retry.maxEvictions {limit})"
        ),
    )


def merge_patch(old: Any, new: Any) -> Any:
    """The RFC 7386 merge patch turning ``old`` into ``new`` (null deletes a key)."""
    if not isinstance(old, dict) or not isinstance(new, dict):
        return new
    patch: dict[str, Any] = {}
    for key in old.keys() - new.keys():
        patch[key] = None
    for key, value in new.items():
        if key not in old:
            patch[key] = value
        elif old[key] != value:
            patch[key] = merge_patch(old[key], value)
    return patch


def status_wire(status: WhaleRunStatus) -> dict[str, Any]:
    return status.model_dump(mode="json", by_alias=True, exclude_none=True)


def invalid_spec_status(
    previous: WhaleRunStatus, field: str, message: str, generation: int | None, now: str
) -> WhaleRunStatus:
    """A spec that fails validation: Failed, with a condition that names the field — never a crash loop."""
    bad = RunState.from_status(previous).refused(Reason.INVALID_SPEC, f"{field}: {message}", generation, now)
    return with_conditions(bad.to_status(), previous.conditions, InferenceView(managed=False), generation, now)


#: reasons of the ChildCreateFailed condition, by HTTP status (others: ``HTTP<status>``)
_REFUSAL_REASONS = {400: "BadRequest", 401: "Unauthorized", 403: "Forbidden", 413: "TooLarge", 422: "Invalid"}
CHILD_CREATE_FAILED = ConditionType.CHILD_CREATE_FAILED.value


def child_rejected_status(
    previous: WhaleRunStatus, kind: str, name: str, http_status: int, message: str, generation: int | None, now: str
) -> WhaleRunStatus:
    """``previous`` with the ChildCreateFailed condition saying which child the API server refused, with what
    status and words; everything else as it was (nothing was decided: the next reconcile decides again). The
    condition goes when a reconcile gets through (:func:`with_conditions` writes only the standard types)."""
    text = f"{kind} {name}: HTTP {http_status}: {message}"[:1000]
    old = next((c for c in previous.conditions if c.type == CHILD_CREATE_FAILED), None)
    cond = MetaCondition(
        type=CHILD_CREATE_FAILED,
        status="True",
        reason=_REFUSAL_REASONS.get(http_status, f"HTTP{http_status}"),
        message=text,
        last_transition_time=old.last_transition_time if old is not None and old.last_transition_time else now,
        observed_generation=generation,
    )
    others = tuple(c for c in previous.conditions if c.type != CHILD_CREATE_FAILED)
    state = RunState.from_status(previous).with_conditions((*others, cond)).with_generation(generation)
    return state.to_status()
