"""One reconcile of one WhaleRun: observe -> ``decide()`` -> act -> status.

Synchronous on purpose (the Kubernetes client and the store client are blocking); the kopf daemon
runs it in a worker thread, one run at a time per WhaleRun. Level-based: everything it needs is
read every time — the WhaleRun (status = counters) and the run's children from the informer (kept current by watch
events: :mod:`whale_operator.informer`), the store (phase results, metrics, checkpoints) — so a restart at any point
resumes exactly, and deterministic child names make every create idempotent.
"""

from __future__ import annotations

import enum
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from pydantic import ValidationError

from whale.control.observer import StoreObserver, absorbed_phases
from whale.core import layout
from whale.core.alternation import ChildState, StartPhase, decide, evaluates_mid_phase
from whale.core.convert import raw_section
from whale.core.layout import PhaseId
from whale.core.status import Reason, RunPhase, WhaleRunStatus
from whale.domain import ToolService
from whale.store import Store, StoreAuthError, StoreUnavailable
from whale_operator import builders, names, observe, outcomes, tenancy
from whale_operator import status as st
from whale_operator.children import ChildRejected, JobLauncher, store_holds_run, stored_experiment_changes
from whale_operator.cluster_spec import ClusterRunSpec
from whale_operator.config import OperatorConfig, SpecError, judge_key_problems, parse_spec
from whale_operator.credentials import CredentialsUnavailable, RunStores
from whale_operator.domains import DomainCatalog, WaitingForData
from whale_operator.informer import ApiReads
from whale_operator.kube import KubeClient
from whale_operator.metrics import OperatorMetrics
from whale_operator.outcomes import ReconcileResult

log = logging.getLogger(__name__)


#: the Event that tells a run asking for sandbox.isolation namespaces where it runs at pod (whale_operator.sandboxing)
SANDBOX_AT_POD = (
    "spec.execution.sandbox.isolation namespaces runs at pod here: this namespace is not one where the operator's admins allow "
    "privileged sandbox hosts (Helm value sandboxHosts.namespaces); the harness pod and the code tool are the walls"
)


class Reading(enum.Enum):
    """What woke a reconcile, so what of the run's store it reads again. Kubernetes tells the operator of every change
    to a run's children, the store of none: what a running phase writes is read by the progress polls, its result once
    its child has ended, and all of it at the resync."""

    #: everything afresh: the run's first reconcile, the resync (``WHALE_OPERATOR_RESYNC_S``), after a failure
    FULL = "full"
    #: a watch event (a child changed, the sidecar rang, the spec changed): what a child's end can have changed, the
    #: results and last metrics lines of the phases whose child has ended; not those of a phase whose child runs, nor
    #: a running weight phase's checkpoints (each an S3 request a reconcile)
    EVENT = "event"
    #: a progress poll, nothing in Kubernetes changed: what a running phase writes (its metrics lines; a weight phase's
    #: checkpoints where one is evaluated before the phase ends), and the results only of phases whose child has ended
    POLL = "poll"


def at_pod_here(body_spec: dict[str, Any] | None, spec: ClusterRunSpec) -> bool:
    """The run asked for ``namespaces`` (or left the default) and runs at ``pod``: the admin's policy decided."""
    asked = (raw_section(body_spec, "sandbox") or {}).get("isolation", "namespaces")
    return asked == "namespaces" and spec.execution.sandbox.isolation == "pod"


def utc_now() -> str:
    """RFC 3339, second precision (what Kubernetes timestamps look like)."""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


class Reconciler:
    """Holds the clients and caches shared by every reconcile of this operator process."""

    def __init__(
        self,
        kube: KubeClient,
        metrics: OperatorMetrics,
        config: OperatorConfig | None = None,
        clock: Callable[[], str] = utc_now,
        reads: ApiReads | None = None,
    ):
        self.kube = kube
        self.metrics = metrics
        self.config = config or OperatorConfig()
        self.clock = clock
        self.stores = RunStores(
            kube, self.config.store_options, self.config.store_bounds.store_options(), self.config.secret_recheck_s
        )
        self._observers: dict[str, StoreObserver] = {}
        #: the WhaleRun and its children: asked of the API server, or held by the operator's informer
        self.reads = reads or ApiReads(kube)
        self.jobs = JobLauncher(
            kube, metrics, sandbox_runtime=self.config.sandbox_hosts.runtime_class, reads=self.reads
        )
        self.domains = DomainCatalog(self.config)
        self._lock = threading.Lock()
        #: per run UID: the spec as checked and scoped, with its tools, for the generation it was parsed at
        #: (a spec changes only with a new generation: parsed once per generation, not once per reconcile)
        self._specs: dict[str, tuple[int, ClusterRunSpec, tuple[ToolService, ...]]] = {}
        #: per run UID: the last status read, as it came and as parsed (most reconciles read what the last wrote)
        self._statuses: dict[str, tuple[dict[str, Any], WhaleRunStatus]] = {}
        #: per run UID: the generation whose spec was found to keep the identity of the spec the store holds
        self._identity_checked: dict[str, int | None] = {}
        #: per run UID: the generation its last reconcile read (a watch event of that generation is no news)
        self._generations: dict[str, int | None] = {}
        #: per run UID: its split sizes once known (written once, by the prepare Job or from the domain; never changed)
        self._sizes: dict[str, dict[str, int]] = {}
        #: per run UID: the phases absorbed into its status whose child was seen ended (never looked at again), each
        #: with that child's UID (its Job is passed over unread: a run keeps every finished Job)
        self._settled: dict[str, dict[str, str]] = {}

    def forget(self, uid: str, namespace: str, name: str) -> None:
        """The run is gone (or this replica stopped serving it): drop what is held for it."""
        self.reads.forget(namespace, name)
        self.jobs.forget(uid)
        self._sizes.pop(uid, None)
        self._settled.pop(uid, None)
        self._generations.pop(uid, None)
        self._specs.pop(uid, None)
        self._statuses.pop(uid, None)
        self._identity_checked.pop(uid, None)

    # --- store ---
    def store_for(self, spec: ClusterRunSpec, namespace: str) -> Store:
        """The run's store, opened with the run's own credentials (:mod:`whale_operator.credentials`)."""
        return self.stores.open(namespace, spec)

    def _observer(self, store: Store, run: str) -> StoreObserver:
        """The store observer of one run (it caches the run's complete checkpoints)."""
        key = f"{store.uri}|{run}"
        with self._lock:
            if key not in self._observers:
                self._observers[key] = StoreObserver(store, run)
            return self._observers[key]

    # --- the reconcile ---
    def reconcile(self, namespace: str, name: str, reading: Reading = Reading.FULL) -> ReconcileResult | None:
        """One reconcile; the status is written once, at the end, when it changed. ``reading``: what woke it, so what
        of the store it reads again (:class:`Reading`)."""
        obj = self.reads.run(namespace, name)
        if obj is None or obj["metadata"].get("deletionTimestamp"):
            return None
        meta = obj["metadata"]
        self._generations[meta["uid"]] = meta.get("generation")
        raw_status = obj.get("status") or {}
        prev = self._status(meta["uid"], raw_status, namespace, name)
        run = builders.RunRef(name, namespace, meta["uid"])
        try:
            outcome = self._step(run, obj.get("spec"), prev, meta.get("generation"), self.clock(), reading)
        except ChildRejected as exc:  # the API server said no: into status, not a log line every 5 s
            log.warning("the API server refused %s; retrying with back-off", exc)
            outcome = outcomes.child_rejected(
                prev, exc.kind, exc.name, exc.status, exc.message, meta.get("generation"), self.clock()
            )
        except StoreAuthError as exc:  # the store refused the run's own keys: the Secret must change
            secret = (raw_section(obj.get("spec"), "storage") or {}).get("credentialsSecret")
            if isinstance(secret, str):
                self.stores.forget_credentials(namespace, secret)  # read again: it may have been rotated since
            # the store's error code only: the rest of its answer is the endpoint's text, and the tenant names
            # the endpoint (a hostile one would write into status whatever it likes)
            log.warning("%s/%s: the store refused the run's keys: %s", namespace, name, exc)
            outcome = outcomes.store_refused(prev, secret, exc.code or "credentials refused", meta.get("generation"))
        except StoreUnavailable as exc:  # timeouts or 5xx until the deadline: shown, retried after a growing back-off
            log.warning("%s/%s: the store is unavailable: %s", namespace, name, exc)
            endpoint = (raw_section(obj.get("spec"), "storage") or {}).get("endpoint") or exc.endpoint
            outcome = outcomes.store_unavailable(
                prev, str(endpoint), exc.attempts, exc.elapsed_s, self.config.store_bounds, meta.get("generation")
            )
        if outcome.status is not prev:
            written = self._write_status(namespace, name, raw_status, outcome.status)
            if written is not None:  # what the next reconcile will most likely read back
                self._statuses[run.uid] = (written, outcome.status)
            self.metrics.set_run_phase(run.uid, outcome.status.phase)
        if outcome.rejected or outcome.unavailable:
            self.reads.relist(namespace, name)  # after a refusal, read afresh
        return outcome

    def read_generation(self, uid: str) -> int | None:
        """The generation of the run the last reconcile of it read (None: not reconciled yet)."""
        return self._generations.get(uid)

    def _status(self, uid: str, raw: dict[str, Any], namespace: str, name: str) -> WhaleRunStatus:
        """``raw`` parsed, or the status parsed last time when ``raw`` is the same."""
        held = self._statuses.get(uid)
        if held is not None and held[0] == raw:
            return held[1]
        try:
            status = WhaleRunStatus.model_validate(raw)
        except ValidationError:
            log.warning("status of %s/%s does not parse; starting from an empty status", namespace, name)
            return WhaleRunStatus()
        self._statuses[uid] = (raw, status)
        return status

    def _spec(
        self, run: builders.RunRef, body_spec: dict[str, Any] | None, generation: int | None
    ) -> tuple[ClusterRunSpec, tuple[ToolService, ...]]:
        """The run's spec checked and scoped to its own store, and its domain's tools: from the cache while the
        generation is the one they were made for. A spec refused (:class:`SpecError`) is checked again each time."""
        held = self._specs.get(run.uid)
        if held is not None and generation is not None and held[0] == generation:
            return held[1], held[2]
        names.check_run_name(run.name)
        spec = parse_spec(body_spec)
        for field_, message in self.config.store_policy.problems(
            spec.execution.storage.uri, spec.execution.storage.endpoint
        ):
            raise SpecError(field_, message)
        for field_, message in self.config.credentials_problems(spec):
            raise SpecError(field_, message)
        spec, scores_with_judge = self.domains.effective(spec)
        for field_, message in judge_key_problems(spec, scores_with_judge):
            raise SpecError(field_, message)
        # isolation namespaces only where the admin allows privileged sandbox hosts, else pod (whale_operator.sandboxing)
        spec, problems = self.config.sandbox_hosts.effective(spec, run.namespace)
        for field_, message in problems:
            raise SpecError(field_, message)
        spec = tenancy.scoped(spec, run.namespace, run.name, run.uid)  # from here on, the run's own store
        tools = self.domains.tools_for(spec)
        self.jobs.check_apis(spec)  # JobSet / PodGroup where the spec asks for them
        if generation is not None:
            self._specs[run.uid] = (generation, spec, tools)
        return spec, tools

    def _step(
        self,
        run: builders.RunRef,
        body_spec: dict[str, Any] | None,
        prev: WhaleRunStatus,
        generation: int | None,
        now: str,
        reading: Reading = Reading.FULL,
    ) -> ReconcileResult:
        """Everything but the status write: returns ``prev`` itself when nothing is to be written."""
        try:
            spec, tools = self._spec(run, body_spec, generation)
        except (SpecError, names.RunNameError) as exc:
            field_ = exc.field if isinstance(exc, SpecError) else "metadata.name"
            text = str(exc).split(": ", 1)[-1] if isinstance(exc, SpecError) else str(exc)
            return outcomes.invalid_spec(prev, field_, text, generation, now)
        if prev.reason == Reason.INVALID_SPEC:
            prev = WhaleRunStatus()  # the spec was fixed: start over
        if prev.store_uri != spec.execution.storage.uri:
            prev = prev.model_copy(update={"store_uri": spec.execution.storage.uri})

        inference_managed = builders.uses_vllm(spec)
        if prev.phase.is_terminal():
            self.jobs.scale_infra(run, 0)
            return ReconcileResult(prev, [])
        try:
            store = self.store_for(spec, run.namespace)
        except CredentialsUnavailable as exc:  # the Secret may yet appear: wait (polled), saying what to do
            return outcomes.waiting_for_credentials(prev, str(exc), inference_managed, generation, now)
        if prev.reason == Reason.WAITING_FOR_CREDENTIALS.value:  # the Secret is usable now: the wait is over
            prev = prev.model_copy(update={"reason": None, "message": None})
        # the run's Jobs (and JobSets with cluster.admission jobSet), read once: the identity check and decide() share them
        jobs: list[dict[str, Any]] | None = None
        if self._identity_checked.get(run.uid) != generation or generation is None:
            changed = stored_experiment_changes(store, run.name, spec)
            if changed:  # refused, children left as they are: setting the fields back resumes the run unchanged
                return outcomes.experiment_changed(prev, changed, generation)
            # a child of the run exists (they are kept once finished), so the store it used holds the run's spec; an
            # attempt counted but never started (a suspended run's) wrote nothing anywhere
            if prev.attempts:
                jobs = self.jobs.phase_children(run, spec)
            if prev.attempts and jobs and not store_holds_run(store, run.name):
                return outcomes.store_without_run(prev, store.uri_for(layout.spec_key(run.name)), generation)
            self._identity_checked[run.uid] = generation  # the store's spec is the operator's own write since
        if prev.reason in (Reason.IMMUTABLE_FIELD_CHANGED.value, Reason.STORE_WITHOUT_RUN.value):
            prev = prev.model_copy(update={"reason": None, "message": None})

        sizes = self._sizes.get(run.uid)
        if sizes is None:
            try:
                sizes = self.domains.split_sizes(store, run.name, spec)
            except WaitingForData as exc:
                return outcomes.waiting_for_data(prev, str(exc), inference_managed, generation, now)
            if sizes:
                self._sizes[run.uid] = sizes
        # no sizes yet: decide() schedules data preparation, a child like the phases
        if jobs is None:
            jobs = self.jobs.phase_children(run, spec)
        # a finished child whose result the status holds tells decide() nothing more: not looked at again (a run keeps
        # its finished Jobs, so this keeps a reconcile's work from growing with the run's length). Such a phase is
        # settled once seen so: its attempt never changes again (a retry starts only phases not done) and an ended
        # child does not run again, so it is not judged again either (was: each absorbed phase's child at each reconcile)
        done = absorbed_phases(prev)
        settled = self._settled.setdefault(run.uid, {})
        for phase in settled.keys() - done:
            del settled[phase]  # a status begun again absorbs nothing: every phase is looked at anew
        passed = set(settled.values())
        live = [j for j in jobs if j["metadata"].get("uid") not in passed] if passed else jobs
        current = {}
        for phase, job in observe.current_jobs(live, prev.attempts).items():
            uid = job["metadata"].get("uid")
            if phase in done and uid and observe.finished(job):
                settled[phase] = uid
                continue
            current[phase] = job
        seen = self.jobs.observe_children(run, spec, current, self.clock())
        children = seen.children
        # a child that ended is judged by its result, read then (a poll already under way when its event came reads it
        # too), never by one read before it ended; apart from a full reading (Reading) only those results are read
        running = {p for p, c in children.items() if c.state is ChildState.RUNNING}
        ended = children.keys() - running
        observer = self._observer(store, run.name)
        obs = observer.observe(
            prev,
            children,
            sizes or {},
            now,
            generation,
            results=reading is not Reading.POLL or bool(ended),
            ended=None if reading is Reading.FULL else ended,
            progress=reading is not Reading.EVENT,
            # a poll lists a running weight phase's checkpoints only where one is evaluated before the phase ends
            checkpoints=reading is not Reading.POLL or evaluates_mid_phase(spec, prev, sizes or {}),
        )
        decision = decide(spec, prev, obs)
        # one list serves the readiness view, the ensure and the scaling of the run's Deployments
        deps = self.jobs.deployments(run) if inference_managed or tools else {}
        gated, created = self.jobs.carry_out(run, spec, store, decision, running, deps, tools)

        new = decision.status
        # superseded attempts (a preempted Job left suspended by the queue) must not hold resources
        for job in observe.stale_jobs(jobs, new.attempts):
            self.jobs.delete_child(run, job)
        dep = deps.get(names.inference_name(run.name))
        view = st.InferenceView(
            managed=inference_managed,
            ready=observe.inference_ready(dep, live),
            # what runs now is a colocated weight phase (its own server; the Deployment scaled to 0)
            colocated_training=bool(running)
            and all(builders.colocated_weight(spec, PhaseId.parse(p).kind) for p in running),
        )
        # a run that ended or is suspended now stops its children: nothing of it is queued or admitted any more
        stopping = new.phase.is_terminal() or new.phase is RunPhase.SUSPENDED
        queue = st.QueueView(spec.cluster.queue_name, seen.queue.served) if stopping else seen.queue
        new = st.with_conditions(new, prev.conditions, view, generation, now, queue)
        self.metrics.rollouts.labels(namespace=run.namespace, run=run.name).set(new.rollouts_spent)
        stalled = st.stalled(new)
        self.metrics.stalled.labels(namespace=run.namespace, run=run.name).set(
            int(stalled is not None and stalled.status == "True")
        )
        # a start that found its child already there (or was deferred) is not news
        reported = tuple(a for a in decision.actions if not isinstance(a, StartPhase) or a.phase in created)
        events = st.events(prev, new, reported)
        limit = spec.execution.retry.max_evictions
        events += [st.evicted_event(e.phase, e.child, e.count, e.words, limit) for e in seen.evictions]
        if any(e.reason == "Started" for e in events) and at_pod_here(body_spec, spec):
            events.append(st.Event(st.NORMAL, "SandboxIsolation", SANDBOX_AT_POD))
        # a child waiting in the run's queue changes nothing the operator watches while Kueue's words about it do
        # (its Workload): polled, as is a child just made under the queue (its first reading is a poll away)
        waits = seen.queue.waiting or seen.queue.evicted or seen.queue.queue_missing
        queued = bool(spec.cluster.queue_name) and bool(created or waits)
        return ReconcileResult(new, events, decision, poll=gated or queued)

    def _write_status(
        self, namespace: str, name: str, raw_old: dict[str, Any], new: WhaleRunStatus
    ) -> dict[str, Any] | None:
        """Patch the change in; the status as the API server now holds it (None: nothing was written)."""
        patch = st.merge_patch(raw_old, st.status_wire(new))
        if not patch:
            return None
        return self.kube.patch_run_status(namespace, name, patch).get("status") or {}
