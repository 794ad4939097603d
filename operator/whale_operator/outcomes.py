"""What one reconcile returns, and the reconciles that end before ``decide()``: the run waits (for its data,
its credentials, a field of the experiment set back) or the API server refused a child. Pure: previous status and
facts in, the new status and its Events out; the reconciler writes them.
"""

from __future__ import annotations

from dataclasses import dataclass

from whale.core.alternation import Transition
from whale.core.mutability import FieldChange
from whale.core.state import RunState
from whale.core.status import Reason, WhaleRunStatus
from whale_operator import status as st
from whale_operator.config import StoreBounds

#: at most this many changed fields are named in a status message
MAX_LISTED_CHANGES = 10


@dataclass(frozen=True)
class ReconcileResult:
    status: WhaleRunStatus
    events: list[st.Event]
    decision: Transition | None = None
    #: something the operator waits for raises no Kubernetes event (the inference server's
    #: acknowledgement in the store): reconcile again at the progress interval
    poll: bool = False
    #: the API server refused a child (the ChildCreateFailed condition): retry after a growing back-off
    rejected: bool = False
    #: the run's store did not answer within the operator's bounds (StoreUnavailable): retry after the back-off
    unavailable: bool = False


def waiting(
    prev: WhaleRunStatus, reason: Reason, message: str, generation: int | None
) -> tuple[WhaleRunStatus, list[st.Event]]:
    """The run waits for ``reason``; a Warning Event only when the problem is new or changed."""
    new = RunState.from_status(prev).waiting(reason, message, generation).to_status()
    return new, [] if prev.message == message else [st.Event(st.WARNING, reason.value, message)]


def waiting_for_credentials(
    prev: WhaleRunStatus, message: str, inference_managed: bool, generation: int | None, now: str
) -> ReconcileResult:
    """The run waits for its credentials Secret (polled: a Secret's arrival wakes no WhaleRun)."""
    new, events = waiting(prev, Reason.WAITING_FOR_CREDENTIALS, message, generation)
    new = st.with_conditions(new, prev.conditions, st.InferenceView(inference_managed), generation, now)
    return ReconcileResult(new, events, poll=True)


def store_refused(prev: WhaleRunStatus, secret: str | None, error: str, generation: int | None) -> ReconcileResult:
    """The run's store refused its credentials: the run waits (polled) naming the Secret, as for a missing one."""
    whose = f"Secret {secret}'s keys" if secret else "the operator's own keys"
    message = (
        f"spec.execution.storage.credentialsSecret: the store refused {whose} ({error}); put keys that may read and write "
        "the run's store in the Secret (a rotated Secret is used at once)"
    )
    new, events = waiting(prev, Reason.WAITING_FOR_CREDENTIALS, message, generation)
    return ReconcileResult(new, events, poll=True)


def store_unavailable(
    prev: WhaleRunStatus, endpoint: str, attempts: int, elapsed_s: float, bounds: StoreBounds, generation: int | None
) -> ReconcileResult:
    """The run's store did not answer within the operator's bounds: the run waits, retried after a back-off. The
    message is built from what the operator knows (the spec's endpoint, its own timeouts), never from what the
    endpoint said (a tenant names it)."""
    message = (
        f"spec.execution.storage.endpoint: the object store at {endpoint} did not answer ({attempts} attempt(s) over "
        f"{elapsed_s:.0f}s; each waits at most {bounds.connect_timeout_s:g}s to connect and "
        f"{bounds.read_timeout_s:g}s for an answer); check that the S3 server is up and reachable from the "
        "operator and that spec.execution.storage.endpoint names it (the run goes on by itself once it answers)"
    )
    new, events = waiting(prev, Reason.STORE_UNAVAILABLE, message, generation)
    return ReconcileResult(new, events, unavailable=True)


def experiment_changed(prev: WhaleRunStatus, changed: list[FieldChange], generation: int | None) -> ReconcileResult:
    """A field of the experiment changed mid-run (``whale.core.mutability``): refused, children left as they are
    (setting it back resumes)."""
    paths = [c.path for c in changed[:MAX_LISTED_CHANGES]]
    if len(changed) > MAX_LISTED_CHANGES:
        paths.append(f"and {len(changed) - MAX_LISTED_CHANGES} more")
    message = (
        f"{', '.join(paths)} changed mid-run: {'they are' if len(changed) > 1 else 'it is'} part of the experiment "
        "(what the run computes: its phases, checkpoints and data were made from it); set "
        f"{'them' if len(changed) > 1 else 'it'} back, or create a new WhaleRun"
    )
    new, events = waiting(prev, Reason.IMMUTABLE_FIELD_CHANGED, message, generation)
    return ReconcileResult(new, events)


def store_without_run(prev: WhaleRunStatus, uri: str, generation: int | None) -> ReconcileResult:
    """``spec.execution.storage`` (an execution field, free to change) now names a store without the run, whose children
    have run: refused, children left as they are, until it names the run's store (or a copy of it) again."""
    message = (
        f"spec.execution.storage: the store now named holds no spec of this run ({uri}), yet its children have run: point "
        "spec.execution.storage (and resumeFrom) at the run's store or a copy of it, or set it back"
    )
    new, events = waiting(prev, Reason.STORE_WITHOUT_RUN, message, generation)
    return ReconcileResult(new, events)


def child_rejected(
    prev: WhaleRunStatus, kind: str, name: str, http_status: int, message: str, generation: int | None, now: str
) -> ReconcileResult:
    """The API server refused a child: the ChildCreateFailed condition (and an Event when the refusal is new or
    different); nothing else changes, and the daemon retries after a growing back-off."""
    new = st.child_rejected_status(prev, kind, name, http_status, message, generation, now)
    before = {c.type: c.message for c in prev.conditions}
    after = {c.type: c.message for c in new.conditions}
    same = before.get(st.CHILD_CREATE_FAILED) == after[st.CHILD_CREATE_FAILED]
    text = f"{kind} {name}: HTTP {http_status}: {message}"
    events = [] if same else [st.Event(st.WARNING, st.CHILD_CREATE_FAILED, text)]
    return ReconcileResult(new, events, rejected=True)


def invalid_spec(prev: WhaleRunStatus, field: str, text: str, generation: int | None, now: str) -> ReconcileResult:
    """The spec (or the run's name) cannot run: InvalidSpec naming the field, once per generation."""
    if prev.reason == Reason.INVALID_SPEC and prev.observed_generation == generation:
        return ReconcileResult(prev, [])
    bad = st.invalid_spec_status(prev, field, text, generation, now)
    return ReconcileResult(bad, [st.Event(st.WARNING, Reason.INVALID_SPEC.value, f"{field}: {text}")])


def waiting_for_data(
    prev: WhaleRunStatus, message: str, inference_managed: bool, generation: int | None, now: str
) -> ReconcileResult:
    """The domain's split sizes are unknown here yet."""
    new = RunState.from_status(prev).waiting(Reason.WAITING_FOR_DATA, message, generation).to_status()
    new = st.with_conditions(new, prev.conditions, st.InferenceView(inference_managed), generation, now)
    return ReconcileResult(new, [])
