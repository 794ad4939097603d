"""One reconcile of one WhaleRun: observe -> ``decide()`` -> act -> status.

Synchronous on purpose (the Kubernetes client and the store client are blocking); the kopf daemon
runs it in a worker thread, one run at a time per WhaleRun. Level-based: everything it needs is
re-read every time — the WhaleRun (status = counters), the run's Jobs, the store (phase results,
metrics, checkpoints) — so a restart at any point resumes exactly, and deterministic child names
make every create idempotent.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from pydantic import ValidationError

from whale import layout
from whale.alternation import (
    Child,
    ChildState,
    Decision,
    Fail,
    Finish,
    Observations,
    ServeCheckpoint,
    StartPhase,
    StopPhase,
    SuspendRun,
    decide,
)
from whale.domain import ToolService
from whale.metaharness import proposer
from whale.protocol import PhaseKind
from whale.spec import RunPhase, WhaleRunSpec, WhaleRunStatus
from whale.store import Store, open_store
from whale_operator import builders, names, observe
from whale_operator import status as st
from whale_operator.kube import Conflict, KubeClient
from whale_operator.metrics import OperatorMetrics

log = logging.getLogger(__name__)


class SpecError(ValueError):
    """The WhaleRun cannot be run as written; ``field`` names the offending field."""

    def __init__(self, field_: str, message: str):
        self.field = field_
        super().__init__(f"{field_}: {message}")


class WaitingForData(RuntimeError):
    """The split sizes of the run's domain are unknown yet (temporary)."""


#: status reasons of the data preparation step
PREPARING = "PreparingData"
PREPARE_FAILED = "PrepareFailed"


def utc_now() -> str:
    """RFC 3339, second precision (what Kubernetes timestamps look like)."""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def describe_validation_error(exc: ValidationError) -> tuple[str, str]:
    """(field path, message) of the first error, in the manifest's camelCase."""
    err = exc.errors()[0]
    loc = ".".join(str(p) for p in err.get("loc", ()) if p != "__root__")
    return (f"spec.{loc}" if loc else "spec"), err.get("msg", str(exc))


def parse_spec(body_spec: dict[str, Any] | None) -> WhaleRunSpec:
    try:
        spec = WhaleRunSpec.model_validate(body_spec or {})
    except ValidationError as exc:
        raise SpecError(*describe_validation_error(exc)) from None
    for problem in proposer.spec_problems(spec):  # no endpoint, model or key: refused before any Job or GPU
        raise SpecError(problem.field, problem.message)
    if not spec.storage.uri:
        raise SpecError("spec.storage.uri", "the operator needs an object store: set it to s3://bucket[/prefix]")
    if spec.storage.uri.startswith("s3://") and not spec.storage.endpoint:
        raise SpecError("spec.storage.endpoint", "an s3:// store needs the S3 endpoint (host:port of MinIO/S3)")
    if spec.data.corpus == "auto":  # a cluster's default corpus is the paper's (docs/data.md#search_qa)
        spec = spec.model_copy(update={"data": spec.data.model_copy(update={"corpus": "wiki18"})})
    return spec


@dataclass
class OperatorConfig:
    """Settings of one operator process (from the environment at start-up, never read deep inside)."""

    #: extra options for ``open_store`` (credentials of the operator itself)
    store_options: dict[str, Any] = field(default_factory=dict)
    #: resolve split sizes with the domain plugin in the operator when the store has none, instead of
    #: a prepare Job (needs the data in the operator's reach; ``WHALE_OPERATOR_DOMAIN_SPLIT_SIZES=1``)
    domain_split_sizes: bool = False

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None) -> OperatorConfig:
        env = dict(os.environ if env is None else env)
        opts: dict[str, Any] = {}
        if env.get("AWS_ACCESS_KEY_ID"):
            opts["access_key"] = env["AWS_ACCESS_KEY_ID"]
        if env.get("AWS_SECRET_ACCESS_KEY"):
            opts["secret_key"] = env["AWS_SECRET_ACCESS_KEY"]
        return cls(
            store_options=opts,
            domain_split_sizes=env.get("WHALE_OPERATOR_DOMAIN_SPLIT_SIZES", "").lower() in ("1", "true"),
        )


@dataclass(frozen=True)
class Outcome:
    status: WhaleRunStatus
    events: list[st.Event]
    decision: Decision | None = None
    #: something the operator waits for raises no Kubernetes event (the inference server's
    #: acknowledgement in the store): reconcile again at the progress interval
    poll: bool = False


class Reconciler:
    """Holds the clients and caches shared by every reconcile of this operator process."""

    def __init__(
        self,
        kube: KubeClient,
        metrics: OperatorMetrics,
        config: OperatorConfig | None = None,
        clock: Callable[[], str] = utc_now,
    ):
        self.kube = kube
        self.metrics = metrics
        self.config = config or OperatorConfig()
        self.clock = clock
        self._stores: dict[tuple[str, str | None, bool], Store] = {}
        self._complete: dict[str, set[int]] = {}
        self._timed: set[str] = set()
        self._tools: dict[str, Any] = {}  # domain name -> its loaded plugin
        self._lock = threading.Lock()

    # --- store ---
    def store_for(self, spec: WhaleRunSpec) -> Store:
        s = spec.storage
        assert s.uri is not None  # parse_spec guarantees it
        key = (s.uri, s.endpoint, s.secure)
        with self._lock:
            if key not in self._stores:
                opts: dict[str, Any] = {}
                if s.uri.startswith("s3://"):
                    opts = {"endpoint": s.endpoint, "secure": s.secure, **self.config.store_options}
                    if s.region:
                        opts["region"] = s.region
                self._stores[key] = open_store(s.uri, **opts)
            return self._stores[key]

    def tools_for(self, spec: WhaleRunSpec) -> tuple[ToolService, ...]:
        """The tool services the run's domain declares for its data settings
        (``Domain.tool_services_for``); the plugin is loaded once per domain."""
        with self._lock:
            if spec.domain not in self._tools:
                from whale import domains

                try:
                    self._tools[spec.domain] = domains.load(spec.domain)
                except Exception as exc:  # noqa: BLE001 - an unknown/broken plugin is a spec problem
                    raise SpecError(
                        "spec.domain",
                        f"cannot load domain {spec.domain!r} in the operator ({exc}); "
                        "use an installed domain (`whale domains` lists them)",
                    ) from None
            domain = self._tools[spec.domain]
        try:
            return tuple(domain.tool_services_for(spec.data))
        except Exception as exc:  # noqa: BLE001 - the plugin refused the data settings
            raise SpecError("spec.data", f"domain {spec.domain!r}: {exc}") from None

    def split_sizes(self, store: Store, run: str, spec: WhaleRunSpec) -> dict[str, int] | None:
        """The run's split sizes from the store; None when a prepare Job must write them."""
        key = layout.split_sizes_key(run)
        sizes = store.read_json_or_none(key)
        if sizes:
            return {k: int(v) for k, v in sizes.items()}
        if not self.config.domain_split_sizes or spec.data.source == "full":
            return None  # the prepare Job writes them (full data: after fetching it into the store)
        from whale import domains

        try:
            sizes = dict(domains.load(spec.domain).split_sizes(spec.data))
        except Exception as exc:  # noqa: BLE001 - any plugin failure means "not known here"
            raise WaitingForData(
                f"split sizes of domain {spec.domain!r} are unknown here ({exc}); write {store.uri_for(key)} "
                f'with {{"weight": N, "harness": N, "test": N}} (`whale plan` prints them)'
            ) from None
        store.write_json(key, sizes)
        return sizes

    def checkpoints(self, store: Store, run: str) -> frozenset[int]:
        """Steps with a COMPLETE checkpoint; complete checkpoints never change, so they are cached."""
        known = self._complete.setdefault(f"{store.uri}|{run}", set())
        for entry in store.list(layout.checkpoints_prefix(run) + "/", recursive=False):
            step = layout.parse_checkpoint_step(entry.rstrip("/").rsplit("/", 1)[-1])
            if step is not None and step not in known and store.exists(layout.checkpoint_complete_key(run, step)):
                known.add(step)
        return frozenset(known)

    def results(self, store: Store, run: str, status: WhaleRunStatus) -> dict[str, dict[str, Any]]:
        """result.json of every phase not yet absorbed into the status."""
        absorbed = set(status.completed_phases) | {e.phase for e in status.evals if e.mean_at_k is not None}
        prefix = f"{layout.run_prefix(run)}/phases/"
        out: dict[str, dict[str, Any]] = {}
        for entry in store.list(prefix, recursive=False):
            phase = entry.rstrip("/").rsplit("/", 1)[-1]
            if phase in absorbed:
                continue
            raw = store.read_json_or_none(layout.result_key(run, phase))
            if raw is not None:
                out[phase] = raw
        return out

    # --- the reconcile ---
    def reconcile(self, namespace: str, name: str) -> Outcome | None:
        obj = self.kube.get_run(namespace, name)
        if obj is None or obj["metadata"].get("deletionTimestamp"):
            return None
        now = self.clock()
        meta = obj["metadata"]
        generation = meta.get("generation")
        raw_status = obj.get("status") or {}
        try:
            prev = WhaleRunStatus.model_validate(raw_status)
        except ValidationError:
            log.warning("status of %s/%s does not parse; starting from an empty status", namespace, name)
            prev = WhaleRunStatus()
        uid = meta["uid"]
        run = builders.RunRef(name, namespace, uid)

        try:
            names.check_run_name(name)
            spec = parse_spec(obj.get("spec"))
            tools = self.tools_for(spec)
        except (SpecError, names.RunNameError) as exc:
            field_ = exc.field if isinstance(exc, SpecError) else "metadata.name"
            text = str(exc).split(": ", 1)[-1] if isinstance(exc, SpecError) else str(exc)
            if prev.reason == "InvalidSpec" and prev.observed_generation == generation:
                return Outcome(prev, [])
            bad = st.invalid_spec_status(prev, field_, text, generation, now)
            self._write_status(namespace, name, raw_status, bad)
            self.metrics.set_run_phase(uid, bad.phase)
            return Outcome(bad, [st.Event(st.WARNING, "InvalidSpec", f"{field_}: {text}")])
        if prev.reason == "InvalidSpec":
            prev = WhaleRunStatus()  # the spec was fixed: start over

        store = self.store_for(spec)
        inference_managed = builders.uses_vllm(spec)
        if prev.phase.is_terminal():
            self._scale_infra(run, 0)
            return Outcome(prev, [])

        try:
            sizes = self.split_sizes(store, name, spec)
        except WaitingForData as exc:
            waiting = prev.model_copy(
                update={"reason": "WaitingForData", "message": str(exc), "observed_generation": generation}
            )
            waiting = st.with_conditions(waiting, prev.conditions, st.InferenceView(inference_managed), generation, now)
            self._write_status(namespace, name, raw_status, waiting)
            return Outcome(waiting, [])
        if sizes is None:
            return self._prepare(run, spec, store, prev, raw_status, generation, now)

        jobs = self.kube.list("batch/v1", "Job", namespace, names.run_selector(name))
        current = observe.current_jobs(jobs, prev.attempts)
        children: dict[str, Child] = {}
        for phase, job in current.items():
            child = observe.job_child(job)
            if child.state is ChildState.FAILED:
                pods = self.kube.list("v1", "Pod", namespace, f"batch.kubernetes.io/job-name={job['metadata']['name']}")
                child = observe.job_child(job, observe.failed_pod_message(pods, builders.WORKER_CONTAINER))
            children[phase] = child
            self._time_phase(job, child)
        metrics: dict[str, list[dict[str, Any]]] = {}
        if prev.active_phase:
            metrics[prev.active_phase] = store.read_jsonl(layout.metrics_key(name, prev.active_phase))
        obs = Observations(
            run=name,
            children=children,
            results=self.results(store, name, prev),
            metrics=metrics,
            checkpoints=self.checkpoints(store, name),
            split_sizes=sizes,
            now=now,
            generation=generation,
        )
        decision = decide(spec, prev, obs)
        running = {p for p, c in children.items() if c.state is ChildState.RUNNING}
        # one list serves the readiness view, the ensure and the scaling of the run's Deployments
        deps = self._deployments(run) if inference_managed or tools else {}
        gated, created = self._apply(run, spec, store, decision, running, deps, tools)

        new = decision.status
        # superseded attempts (a preempted Job left suspended by the queue) must not hold resources
        for job in observe.stale_jobs(jobs, new.attempts):
            self.kube.delete("batch/v1", "Job", namespace, job["metadata"]["name"])
        dep = deps.get(names.inference_name(name))
        view = st.InferenceView(managed=inference_managed, ready=observe.deployment_ready(dep))
        new = st.with_conditions(new, prev.conditions, view, generation, now)
        self._write_status(namespace, name, raw_status, new)
        self.metrics.set_run_phase(uid, new.phase)
        self.metrics.rollouts.labels(namespace=namespace, run=name).set(new.rollouts_spent)
        # a start that found its child already there (or was deferred) is not news
        reported = tuple(a for a in decision.actions if not isinstance(a, StartPhase) or a.phase in created)
        return Outcome(new, st.events(prev, new, reported), decision, poll=gated)

    # --- data preparation ---
    def _prepare(
        self,
        run: builders.RunRef,
        spec: WhaleRunSpec,
        store: Store,
        prev: WhaleRunStatus,
        raw_status: dict[str, Any],
        generation: int | None,
        now: str,
    ) -> Outcome:
        """No split sizes yet: run the prepare Job (``<run>-prepare-<attempt>``), retried up to
        ``spec.retry.maxAttempts``; its attempts are counted from the Jobs themselves. A Job that
        succeeded without writing the sizes counts as failed."""
        selector = f"{names.run_selector(run.name)},{names.LABEL_KIND}={names.PREPARE}"
        jobs: dict[int, dict[str, Any]] = {}
        for job in self.kube.list("batch/v1", "Job", run.namespace, selector):
            attempt = (job["metadata"].get("labels") or {}).get(names.LABEL_ATTEMPT, "")
            if attempt.isdigit():
                jobs[int(attempt)] = job
        failed, last_error, running = 0, "", None
        for attempt in sorted(jobs):
            child = observe.job_child(jobs[attempt])
            if child.state is ChildState.FAILED:
                pods = self.kube.list(
                    "v1", "Pod", run.namespace, f"batch.kubernetes.io/job-name={jobs[attempt]['metadata']['name']}"
                )
                child = observe.job_child(jobs[attempt], observe.failed_pod_message(pods, builders.WORKER_CONTAINER))
            if child.state is ChildState.FAILED or child.state is ChildState.SUCCEEDED:
                failed += 1
                last_error = (
                    child.message
                    if child.state is ChildState.FAILED
                    else (f"it succeeded without writing {store.uri_for(layout.split_sizes_key(run.name))}")
                )
            elif child.state is ChildState.RUNNING:
                running = attempt
        events: list[st.Event] = []
        attempt = max(jobs, default=0)
        if failed >= spec.retry.max_attempts:
            job_name = names.prepare_job_name(run.name, attempt)
            new = prev.model_copy(
                update={
                    "phase": RunPhase.FAILED,
                    "reason": PREPARE_FAILED,
                    "observed_generation": generation,
                    "message": f"data preparation failed {failed} times (spec.retry.maxAttempts); Job {job_name}: "
                    f"{last_error}",
                    "completion_time": prev.completion_time or now,
                }
            )
            events = st.events(prev, new, ())
        elif spec.suspend and running is None:
            new = prev.model_copy(
                update={
                    "reason": PREPARING,
                    "observed_generation": generation,
                    "message": "spec.suspend is true: data preparation waits",
                }
            )
        else:
            if running is None:
                wire = spec.to_wire()
                if store.read_json_or_none(layout.spec_key(run.name)) != wire:
                    store.write_json(layout.spec_key(run.name), wire)  # before the Job: it reads it first thing
                assert spec.storage.uri is not None
                attempt += 1
                if self._ensure(builders.prepare_job(run, spec, attempt, store_uri=spec.storage.uri)):
                    events.append(
                        st.Event(st.WARNING, "PrepareRetried", f"attempt {attempt}: {last_error}")
                        if failed
                        else st.Event(st.NORMAL, "Preparing", "materialising the data splits")
                    )
            else:
                attempt = running
            new = prev.model_copy(
                update={
                    "reason": PREPARING,
                    "observed_generation": generation,
                    "message": f"Job {names.prepare_job_name(run.name, attempt)} is materialising the splits of domain "
                    f"{spec.domain!r} and writing their sizes (attempt {attempt})",
                }
            )
        new = st.with_conditions(new, prev.conditions, st.InferenceView(builders.uses_vllm(spec)), generation, now)
        self._write_status(run.namespace, run.name, raw_status, new)
        self.metrics.set_run_phase(run.uid, new.phase)
        return Outcome(new, events)

    # --- acting ---
    def _deployments(self, run: builders.RunRef) -> dict[str, dict[str, Any]]:
        return {
            d["metadata"]["name"]: d
            for d in self.kube.list("apps/v1", "Deployment", run.namespace, names.run_selector(run.name))
        }

    def _apply(
        self,
        run: builders.RunRef,
        spec: WhaleRunSpec,
        store: Store,
        decision: Decision,
        running: set[str],
        deps: dict[str, dict[str, Any]],
        tools: tuple[ToolService, ...],
    ) -> tuple[bool, set[str]]:
        """Apply actions. Like the local runner, one phase child runs at a time (they share the
        inference server), owed evaluations first. Returns (gated, created): gated is True when a
        start waits for the inference server to acknowledge the weights it must serve; created names
        the phases whose child this call really created (the only starts worth an Event)."""
        status = decision.status
        starts = sorted(decision.of_type(StartPhase), key=lambda a: a.kind is not PhaseKind.EVAL)
        for action in decision.actions:
            self.metrics.actions.labels(action=type(action).__name__).inc()
            if isinstance(action, StopPhase):
                store.write_text(layout.stop_key(run.name, action.phase), action.reason + "\n")
            elif isinstance(action, ServeCheckpoint):
                self._serve(run, spec, store, action.checkpoint)
            elif isinstance(action, (SuspendRun, Finish, Fail)):
                self._stop_children(run)
                self._scale_infra(run, 0, deps)
        if status.phase is not RunPhase.RUNNING:
            return False, set()
        # one phase child at a time: start the first one only when nothing else runs
        startable = [a for a in starts if not running - {a.phase}][:1]
        if startable:
            self._ensure_infra(run, spec, status.current_checkpoint, deps, tools)
        outcomes = {a.phase: self._start(run, spec, store, a, tools) for a in startable}
        return None in outcomes.values(), {phase for phase, made in outcomes.items() if made}

    def _start(
        self, run: builders.RunRef, spec: WhaleRunSpec, store: Store, action: StartPhase, tools: tuple[ToolService, ...]
    ) -> bool | None:
        """Ensure the child's Job: True when this call created it, False when it already existed,
        None (nothing created) while the vLLM pod's weight-sync sidecar has not acknowledged the
        weights the child samples from (``control/served.json``), so no child ever samples from
        stale weights; decide() asks again on the next reconcile."""
        req = action.request
        # the shared inference server serves the weights this child samples from (an evaluation of an
        # earlier checkpoint included); one child runs at a time, so the target is unambiguous
        target = (
            req.eval.checkpoint
            if req.eval
            else req.weight.from_checkpoint
            if req.weight
            else req.harness.checkpoint
            if req.harness
            else None
        )
        serving = store.read_json_or_none(layout.serving_key(run.name))
        if serving is None or serving.get("checkpoint") != target:
            self._serve(run, spec, store, target)
        if builders.uses_vllm(spec):
            served = store.read_json_or_none(layout.served_key(run.name))
            if not isinstance(served, dict) or served.get("checkpoint") != target:
                log.info(
                    "%s/%s: %s waits for the inference server to serve %s",
                    run.namespace,
                    run.name,
                    req.phase,
                    target or "the base model",
                )
                return None
        spec_wire = spec.to_wire()
        if store.read_json_or_none(layout.spec_key(run.name)) != spec_wire:
            store.write_json(layout.spec_key(run.name), spec_wire)
        key = layout.request_key(run.name, req.phase)
        wire = req.to_wire()
        if store.read_json_or_none(key) != wire:
            store.write_json(key, wire)  # before the Job: the workload reads it first thing
        assert spec.storage.uri is not None
        svc = builders.rendezvous_service(run, spec, req)
        if svc is not None:
            self._ensure(svc)
        return self._ensure(builders.job(run, spec, req, store_uri=spec.storage.uri, tools=tools))

    def _ensure(self, manifest: dict[str, Any]) -> bool:
        try:
            _, created = self.kube.ensure(manifest)
        except Conflict:
            log.info(
                "%s %s is still being deleted; next reconcile creates it",
                manifest["kind"],
                manifest["metadata"]["name"],
            )
            return False
        if created:
            self.metrics.children_created.labels(kind=manifest["kind"]).inc()
        return created

    def _infra(
        self,
        run: builders.RunRef,
        spec: WhaleRunSpec,
        checkpoint: str | None,
        replicas: int,
        tools: tuple[ToolService, ...],
    ) -> list[dict[str, Any]]:
        assert spec.storage.uri is not None
        out: list[dict[str, Any]] = []
        if builders.uses_vllm(spec):
            out.append(
                builders.inference_deployment(
                    run, spec, store_uri=spec.storage.uri, checkpoint=checkpoint, replicas=replicas
                )
            )
            out.append(builders.inference_service(run, spec))
        out += builders.tool_children(run, spec, tools, store_uri=spec.storage.uri, replicas=replicas)
        return out

    def _ensure_infra(
        self,
        run: builders.RunRef,
        spec: WhaleRunSpec,
        checkpoint: str | None,
        existing: dict[str, dict[str, Any]],
        tools: tuple[ToolService, ...],
    ) -> None:
        """The inference server and tool services exist and are scaled up while phases run."""
        for manifest in self._infra(run, spec, checkpoint, 1, tools):
            name = manifest["metadata"]["name"]
            if manifest["kind"] == "Deployment" and name in existing:
                if existing[name].get("spec", {}).get("replicas") != 1:
                    self.kube.merge_patch("apps/v1", "Deployment", run.namespace, name, {"spec": {"replicas": 1}})
                continue
            if manifest["kind"] != "Deployment" and manifest["metadata"]["name"] in existing:
                continue
            self._ensure(manifest)

    def _scale_infra(self, run: builders.RunRef, replicas: int, deps: dict[str, dict[str, Any]] | None = None) -> None:
        for dep in (self._deployments(run) if deps is None else deps).values():
            if dep.get("spec", {}).get("replicas") != replicas:
                self.kube.merge_patch(
                    "apps/v1", "Deployment", run.namespace, dep["metadata"]["name"], {"spec": {"replicas": replicas}}
                )

    def _stop_children(self, run: builders.RunRef) -> None:
        """Delete the run's unfinished Jobs (suspend / end of run); finished ones stay for inspection."""
        for job in self.kube.list("batch/v1", "Job", run.namespace, names.run_selector(run.name)):
            if observe.job_child(job).state is ChildState.RUNNING and not job["metadata"].get("deletionTimestamp"):
                self.kube.delete("batch/v1", "Job", run.namespace, job["metadata"]["name"])

    def _serve(self, run: builders.RunRef, spec: WhaleRunSpec, store: Store, checkpoint: str | None) -> None:
        store.write_json(layout.serving_key(run.name), {"checkpoint": checkpoint})
        if builders.uses_vllm(spec):
            name = names.inference_name(run.name)
            if self.kube.get("apps/v1", "Deployment", run.namespace, name) is not None:
                self.kube.merge_patch(
                    "apps/v1",
                    "Deployment",
                    run.namespace,
                    name,
                    {"metadata": {"annotations": {names.ANNOTATION_CHECKPOINT: checkpoint or "base"}}},
                )

    def _write_status(self, namespace: str, name: str, raw_old: dict[str, Any], new: WhaleRunStatus) -> None:
        patch = st.merge_patch(raw_old, st.status_wire(new))
        if patch:
            self.kube.patch_run_status(namespace, name, patch)

    def _time_phase(self, job: dict[str, Any], child: Child) -> None:
        if child.state not in (ChildState.SUCCEEDED, ChildState.FAILED):
            return
        uid = job["metadata"].get("uid", job["metadata"]["name"])
        if uid in self._timed:
            return
        self._timed.add(uid)
        status = job.get("status", {})
        start, end = status.get("startTime"), status.get("completionTime") or _condition_time(job)
        if start and end:
            seconds = (_parse_time(end) - _parse_time(start)).total_seconds()
            kind = job["metadata"].get("labels", {}).get(names.LABEL_KIND, "unknown")
            self.metrics.phase_duration.labels(kind=kind, outcome=child.state.value).observe(max(seconds, 0.0))


def _parse_time(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def _condition_time(job: dict[str, Any]) -> str | None:
    for cond in job.get("status", {}).get("conditions") or []:
        if cond.get("type") in ("Complete", "Failed") and cond.get("status") == "True":
            return cond.get("lastTransitionTime")
    return None
