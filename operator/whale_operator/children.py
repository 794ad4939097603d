"""How the operator's children start and stop: a phase is a Job, beside the run's inference server and
tool services (Deployments). What runs when is decided elsewhere (``decide`` and
``whale.control.planner``); this module only carries it out through the Kubernetes API, idempotently
(every name is derived, so a create that finds its object is a no-op)."""

from __future__ import annotations

import dataclasses
import logging
import secrets
import time
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from pydantic import ValidationError

from whale.control.planner import KEEP_SERVING, RunEnd, plan, prune_checkpoints, write_request, write_stop
from whale.control.serving import serve
from whale.core import layout
from whale.core.alternation import Child, ChildState, StartPhase, Transition
from whale.core.mutability import FieldChange, experiment_changes
from whale.core.protocol import PhaseKind, PhaseRequest, WeightRequest
from whale.core.spec import WhaleRunSpec
from whale.domain import ToolService
from whale.store import Store
from whale_operator import builders, informer, kueue, names, observe
from whale_operator import status as st
from whale_operator.cluster_spec import ClusterRunSpec
from whale_operator.config import SpecError, store_uri
from whale_operator.informer import ApiReads
from whale_operator.kube import Conflict, KubeClient, Refused, collection_path
from whale_operator.metrics import OperatorMetrics

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Eviction:
    """An eviction the operator saw (and counted) in this reconcile: the Event's matter."""

    phase: str
    child: str
    #: the child's evictions so far, this one included
    count: int
    #: Kueue's words (the Workload's Evicted condition), else the child's own
    words: str


@dataclass(frozen=True)
class Observed:
    """What one reconcile saw of the run's current phase children."""

    children: dict[str, Child]
    queue: st.QueueView
    evictions: tuple[Eviction, ...]


class ChildRejected(RuntimeError):
    """The API server refused to create or update a child for good as it stands (RBAC, admission, an invalid
    object): shown in status (the ChildCreateFailed condition) and retried with a growing back-off."""

    def __init__(self, kind: str, name: str, status: int, message: str):
        self.kind, self.name, self.status, self.message = kind, name, status, message
        super().__init__(f"{kind} {name}: HTTP {status}: {message}")

    @classmethod
    def of(cls, kind: str, name: str, refusal: Refused) -> ChildRejected:
        """The API server's refusal of the child ``kind``/``name``, with the server's own words."""
        return cls(kind, name, refusal.status, refusal.message)


#: how long a fixed child found or made (a Service, a NetworkPolicy, the doorbell, the auth Secret) is taken to be there
#: without asking the API server again: every start asked for all of them (a create and a read each), the costliest
#: part of a reconcile. One deleted by hand is made again within this time (the Deployments, listed by every
#: reconcile, at once).
PRESENT_TTL_S = 300.0
#: phase requests held per run (:meth:`JobLauncher.write_request`): more than a run has in flight at once
REQUESTS_HELD = 8


class JobLauncher:
    """The operator's children of every run, through one Kubernetes client."""

    def __init__(
        self,
        kube: KubeClient,
        metrics: OperatorMetrics,
        clock: Any = time.monotonic,
        *,
        sandbox_runtime: str | None = None,
        reads: ApiReads | None = None,
    ):
        self.kube = kube
        #: where the run's children are read from (the informer in the operator: :mod:`whale_operator.informer`)
        self.reads = reads or ApiReads(kube)
        #: the admin's sandboxed RuntimeClass for pods that run untrusted code (whale_operator.sandboxing)
        self.sandbox_runtime = sandbox_runtime
        self.metrics = metrics
        self.clock = clock
        #: Jobs timed (UID)
        self._timed: set[str] = set()
        self._served_apis: set[str] = set()
        #: fixed children (:func:`_present_key`) -> when they were last found or made
        self._present: dict[str, float] = {}
        #: whether the cluster serves Kueue's Workload API, and when that was asked
        self._kueue: tuple[bool, float] | None = None
        self._workloads_refused = False
        #: per run UID, what the operator (their one writer) last wrote or found in the run's store: the serving
        #: target (``serving.json``) and the spec its children read (``spec.json``, by the parsed spec's identity)
        self._serving: dict[str, str | None] = {}
        self._spec_written: dict[str, ClusterRunSpec] = {}
        #: per run UID, the phase requests last written (:meth:`write_request`), by key: the newest few
        self._requests: dict[str, dict[str, Any]] = {}
        #: per run UID, its infrastructure's manifests as last built (:meth:`infra`) and what they were built from
        self._infra: dict[str, tuple[tuple[Any, ...], list[dict[str, Any]]]] = {}

    def forget(self, uid: str) -> None:
        """The run is gone: drop what is held for it."""
        self._serving.pop(uid, None)
        self._requests.pop(uid, None)
        self._spec_written.pop(uid, None)
        self._infra.pop(uid, None)

    def write_request(self, run: builders.RunRef, store: Store, req: PhaseRequest) -> None:
        """:func:`~whale.control.planner.write_request` with this operator's memory of what it wrote (the requests'
        one writer): a phase start asks the store nothing, a start repeated while it waits (for its server, its
        queue) writes nothing. Only the newest few are held: a run's phases run a few at a time."""
        written = self._requests.setdefault(run.uid, {})
        write_request(store, run.name, req, written)
        while len(written) > REQUESTS_HELD:
            del written[next(iter(written))]

    def write_spec(self, run: builders.RunRef, store: Store, spec: ClusterRunSpec) -> None:
        """:func:`write_spec`, once per parsed spec (a new generation parses a new one)."""
        if self._spec_written.get(run.uid) is not spec:
            write_spec(store, run.name, spec)
            self._spec_written[run.uid] = spec

    def _recently_present(self, manifest: dict[str, Any]) -> bool:
        seen = self._present.get(_present_key(manifest))
        return seen is not None and self.clock() - seen < PRESENT_TTL_S

    def _found(self, manifest: dict[str, Any]) -> None:
        now = self.clock()
        if len(self._present) > 8192:  # runs come and go: forget what is stale anyway
            self._present = {k: t for k, t in self._present.items() if now - t < PRESENT_TTL_S}
        self._present[_present_key(manifest)] = now

    def deployments(self, run: builders.RunRef) -> dict[str, dict[str, Any]]:
        return {d["metadata"]["name"]: d for d in self.reads.children(informer.DEPLOYMENT, run.namespace, run.name)}

    def start(
        self,
        run: builders.RunRef,
        spec: ClusterRunSpec,
        store: Store,
        action: StartPhase,
        target: str | None,
        tools: tuple[ToolService, ...],
    ) -> bool | None:
        """Ensure the child's Job: True when this call created it, False when it already existed,
        None (nothing created) while the vLLM pod's weight-sync sidecar has not acknowledged the
        weights ``target`` the child samples from (``control/served.json``), so no child ever samples
        from stale weights; decide() asks again on the next reconcile."""
        req = action.request
        if builders.uses_jobset(spec):
            # the phase's own server starts from serving.json's target and is Ready before its workload starts
            return self._start_jobset(run, spec, store, req, tools)
        # a colocated weight phase samples from its own pod's server, which fetches the serving target itself
        if builders.uses_vllm(spec) and not builders.colocated_weight(spec, req.kind):
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
        self.write_spec(run, store, spec)
        self.write_request(run, store, req)  # before the Job: the workload reads it first thing
        svc = builders.rendezvous_service(run, spec, req)
        if svc is not None:
            self.ensure(svc)
        if spec.execution.inference.placement == "colocated" and isinstance(req, WeightRequest):
            # one pod, trainer and vLLM on the same GPUs (a DRA claim both containers reference)
            self.ensure(builders.colocated_gpu_claim_template(run, spec, req))
            return self.ensure(builders.colocated_train_job(run, spec, req, store_uri=store_uri(spec), tools=tools))
        return self._ensure_gang(run, spec, req, builders.job(run, spec, req, store_uri=store_uri(spec), tools=tools))

    def _start_jobset(
        self,
        run: builders.RunRef,
        spec: ClusterRunSpec,
        store: Store,
        req: PhaseRequest,
        tools: tuple[ToolService, ...],
    ) -> bool:
        """``cluster.admission: jobSet``: the phase's JobSet (its vLLM server and its workload, one Kueue
        Workload). No wait for ``served.json``: the server is the JobSet's own, it loads the serving target
        (written before this call) when it starts, and JobSet starts the workload only once it is Ready."""
        self.write_spec(run, store, spec)
        self.write_request(run, store, req)  # before the JobSet: the workload reads it first thing
        manifest = builders.phase_jobset(run, spec, req, store_uri=store_uri(spec), tools=tools)
        return self._ensure_gang(run, spec, req, manifest)

    def _ensure_gang(
        self, run: builders.RunRef, spec: ClusterRunSpec, req: PhaseRequest, manifest: dict[str, Any]
    ) -> bool:
        """Ensure the phase child, after its coscheduling PodGroup when ``cluster.gangScheduling`` gives it one."""
        group = builders.pod_group(run, spec, req, manifest["metadata"]["name"])
        if group is not None:
            self.ensure(group)
            manifest = builders.in_pod_group(manifest, group["metadata"]["name"])
        return self.ensure(manifest)

    def check_apis(self, spec: ClusterRunSpec) -> None:
        """Raise :class:`SpecError` on the field that asks for a kind this cluster does not serve (JobSet for
        ``cluster.admission`` jobSet, PodGroup for ``cluster.gangScheduling`` podGroup, DRA's ``resource.k8s.io/v1``
        for ``inference.placement`` colocated: Kubernetes < 1.34). A served API is
        remembered; a missing one is asked again next time (it may be installed meanwhile)."""
        for field_, api, what in builders.required_apis(spec):
            if api in self._served_apis:
                continue
            if not self.kube.has_api(api):
                raise SpecError(
                    field_, f"this cluster does not serve {api}: install {what}, or {builders.API_FIXES[field_]}"
                )
            self._served_apis.add(api)

    def phase_children(self, run: builders.RunRef, spec: ClusterRunSpec) -> list[dict[str, Any]]:
        """The run's Jobs and, with ``cluster.admission: jobSet``, its JobSets: what ``decide()`` observes."""
        out = self.reads.children(informer.JOB, run.namespace, run.name)
        if builders.uses_jobset(spec):
            out = out + self.reads.children(informer.JOBSET, run.namespace, run.name)
        return out

    def patch_child(self, run: builders.RunRef, child: dict[str, Any], patch: dict[str, Any]) -> dict[str, Any]:
        """Merge-patch a phase child (Job or JobSet); the child as the API server now holds it."""
        return self.patch(*observe.child_kind(child), run.namespace, child["metadata"]["name"], patch)

    def delete_child(self, run: builders.RunRef, child: dict[str, Any]) -> None:
        """Delete a phase child (Job or JobSet; the JobSet's Jobs and pods go with it)."""
        self.kube.delete(*observe.child_kind(child), run.namespace, child["metadata"]["name"])

    def patch(self, api_version: str, kind: str, namespace: str, name: str, patch: dict[str, Any]) -> dict[str, Any]:
        """A merge patch of a child (the child as patched); a refusal is a :class:`ChildRejected`."""
        try:
            return self.kube.merge_patch(api_version, kind, namespace, name, patch)
        except Refused as exc:
            raise ChildRejected.of(kind, name, exc) from None

    def observe_children(
        self, run: builders.RunRef, spec: ClusterRunSpec, current: dict[str, dict[str, Any]], now: str
    ) -> Observed:
        """What ``decide`` sees of each phase's current Job (a failed one with its pod's last words), and what the
        run's queue shows of them. A child seen running for the first time gets the started mark (what tells a later
        eviction from queueing: Kueue clears startTime when it evicts); a child seen evicted after that gets the
        eviction counted on it (:func:`kueue.eviction_patch`) and is kept, for Kueue to re-admit."""
        children: dict[str, Child] = {}
        evicted: list[Eviction] = []
        queue = st.QueueView(spec.cluster.queue_name, namespace=run.namespace)
        for phase, job in current.items():
            # the Job as patched (what was read is never changed in place); a child first seen after it ended is not
            # marked: the mark only tells a later eviction from queueing, and an ended child is never evicted
            if kueue.needs_started_mark(job) and not observe.finished(job):
                job = self.patch_child(run, job, kueue.started_patch(now))
            own_words = kueue.evicted(job)  # before the count's patch takes the started mark away
            seen_now = own_words is not None and not job["metadata"].get("deletionTimestamp")
            if seen_now:
                job = self.patch_child(run, job, kueue.eviction_patch(job))
            child = observe.job_child(job)
            if child.state is ChildState.FAILED:
                pods = self.kube.list("v1", "Pod", run.namespace, observe.pod_selector(job))
                child = observe.job_child(job, observe.failed_pod_message(pods, builders.WORKER_CONTAINER))
            name = f"{observe.child_kind(job)[1]} {job['metadata']['name']}"
            facts = self._workload(run, job) if spec.cluster.queue_name and kueue.suspended(job) else None
            if facts is not None and facts.evicted and child.evictions:
                child = dataclasses.replace(child, message=f"{observe.EVICTED_WAITING}: {facts.evicted}")
            child = dataclasses.replace(child, name=name)
            children[phase] = child
            if spec.cluster.queue_name and child.state is ChildState.RUNNING:
                queue = queue.with_child(name, job, child, facts)
            if seen_now:
                kind = job["metadata"].get("labels", {}).get(names.LABEL_KIND, "unknown")
                self.metrics.evictions.labels(kind=kind).inc()
                words = facts.evicted if facts is not None and facts.evicted else own_words or ""
                evicted.append(Eviction(phase, name, child.evictions, words))
            self.time_job(job, child)
        if spec.cluster.queue_name and not self._kueue_served():
            queue = dataclasses.replace(queue, served=False)
        return Observed(children, queue, tuple(evicted))

    def _workload(self, run: builders.RunRef, child: dict[str, Any]) -> kueue.WorkloadFacts | None:
        """Kueue's Workload of a suspended child (why it waits, why it was evicted); None where Kueue made none yet,
        or the operator may not read Workloads (an older chart's RBAC: the run goes on without Kueue's words)."""
        uid = child["metadata"].get("uid")
        if not uid or not self._kueue_served():
            return None
        try:
            found = self.kube.list(
                kueue.WORKLOAD_API_VERSION, "Workload", run.namespace, f"{kueue.JOB_UID_LABEL}={uid}"
            )
        except Refused as exc:
            if not self._workloads_refused:
                log.warning("reading Kueue Workloads was refused (%s): grant list on workloads.kueue.x-k8s.io", exc)
            self._workloads_refused = True
            return None
        wl = kueue.workload_of(found, child)
        return kueue.workload_facts(wl) if wl is not None else None

    def _kueue_served(self) -> bool:
        """The cluster serves Kueue's Workload API (asked again after :data:`PRESENT_TTL_S`: it may be installed)."""
        now = self.clock()
        if self._kueue is None or now - self._kueue[1] >= PRESENT_TTL_S:
            self._kueue = (self.kube.has_api(kueue.WORKLOAD_API_VERSION), now)
        return self._kueue[0]

    def carry_out(
        self,
        run: builders.RunRef,
        spec: ClusterRunSpec,
        store: Store,
        decision: Transition,
        running: set[str],
        deps: dict[str, dict[str, Any]],
        tools: tuple[ToolService, ...],
    ) -> tuple[bool, set[str]]:
        """Carry out the shared plan (:func:`whale.control.planner.plan`): one phase child at a time,
        owed evaluations first. Returns (gated, created): gated is True when the start waits for the
        inference server to acknowledge the weights it must serve; created names the phase whose child
        this call really created (the only start worth an Event)."""
        for action in decision.actions:
            self.metrics.actions.labels(action=type(action).__name__).inc()
        step = plan(decision, running)
        for stop in step.stops:
            write_stop(store, run.name, stop)
        if step.end is not None:
            self.stop_children(run, spec)
            self.scale_infra(run, 0, deps)
        if step.end is RunEnd.FINISHED:  # idempotent: a later reconcile finds nothing left to delete
            prune_checkpoints(store, run.name, decision.status, spec.experiment.rsft.keep_checkpoints)
        if step.start is not None and step.start.kind is PhaseKind.PREPARE:
            return False, {step.start.phase} if self.start_prepare(run, spec, store, step.start) else set()
        if step.start is not None:
            serving = not builders.colocated_weight(spec, step.start.kind)
            self.ensure_infra(run, spec, deps, tools, serving=serving)
        if step.serve is not KEEP_SERVING:
            self.serve_checkpoint(run, spec, store, step.serve)  # type: ignore[arg-type]
        if step.start is None:
            return False, set()
        made = self.start(run, spec, store, step.start, step.serve, tools)  # type: ignore[arg-type]
        return made is None, {step.start.phase} if made else set()

    def start_prepare(self, run: builders.RunRef, spec: ClusterRunSpec, store: Store, start: StartPhase) -> bool:
        """The prepare Job of ``start``'s attempt (no inference server, nothing served: it samples nothing),
        after the spec it reads first thing. True when this call created it."""
        self.write_spec(run, store, spec)
        return self.ensure(builders.prepare_job(run, spec, start.attempt, store_uri=store_uri(spec)))

    def ensure(self, manifest: dict[str, Any]) -> bool:
        """Create the child unless it exists; True when this call created it."""
        return self._ensure(builders.with_sandbox_runtime(manifest, self.sandbox_runtime)) is True

    def _ensure(self, manifest: dict[str, Any]) -> bool | None:
        """True: created; False: it was there; None: a namesake is still being deleted (the next reconcile)."""
        try:
            _, created = self.kube.ensure(manifest)
        except Refused as exc:
            raise ChildRejected.of(manifest["kind"], manifest["metadata"]["name"], exc) from None
        except Conflict:
            log.info(
                "%s %s is still being deleted; next reconcile creates it",
                manifest["kind"],
                manifest["metadata"]["name"],
            )
            return None
        if created:
            self.metrics.children_created.labels(kind=manifest["kind"]).inc()
        return created

    def ensure_fixed(self, manifest: dict[str, Any]) -> None:
        """:meth:`ensure` a child that never changes once made, asking the API server at most once per
        :data:`PRESENT_TTL_S`."""
        if not self._recently_present(manifest) and self._ensure(manifest) is not None:
            self._found(manifest)

    def ensure_auth_secret(self, run: builders.RunRef) -> bool:
        """The run's auth Secret exists: made once with fresh random values, never overwritten (a create that
        finds it keeps what is there, so the running server and its clients keep agreeing). True when created."""
        placeholder = builders.auth_secret(run, {})
        if self._recently_present(placeholder):
            return False
        manifest = builders.auth_secret(run, {key: secrets.token_urlsafe(32) for key in builders.AUTH_SECRET_KEYS})
        try:  # create, and a clash means it is there: the Secret's values are never read back
            self.kube.request("POST", collection_path("v1", "Secret", run.namespace), body=manifest)
        except Conflict:
            self._found(placeholder)
            return False
        except Refused as exc:
            raise ChildRejected.of("Secret", manifest["metadata"]["name"], exc) from None
        self._found(placeholder)
        self.metrics.children_created.labels(kind="Secret").inc()
        return True

    def infra(
        self,
        run: builders.RunRef,
        spec: ClusterRunSpec,
        replicas: int,
        tools: tuple[ToolService, ...],
    ) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        if builders.uses_vllm(spec) and not builders.uses_jobset(spec):  # jobSet: each phase has its own server
            out.append(builders.inference_deployment(run, spec, store_uri=store_uri(spec), replicas=replicas))
            out.append(builders.inference_service(run, spec))
            out += builders.served_doorbell(run, spec)  # the sidecar's acknowledgement wakes the waiting run
        if builders.uses_vllm(spec):
            out.append(builders.inference_network_policy(run))  # vLLM's port: the run's own pods only
        out.append(builders.workload_network_policy(run))  # the workloads (torchrun's rendezvous): the run's pods only
        out += builders.tool_children(run, spec, tools, store_uri=store_uri(spec), replicas=replicas)
        out += builders.harness_children(run, spec, replicas=replicas)
        out = [builders.with_sandbox_runtime(m, self.sandbox_runtime) for m in out]
        return [builders.with_template_hash(m) if m["kind"] == "Deployment" else m for m in out]

    def rerender(
        self, run: builders.RunRef, desired: dict[str, Any], existing: dict[str, Any], replicas: int = 1
    ) -> bool:
        """Replace the pod template of an existing Deployment when the spec changed it (its template hash
        differs), which rolls its pods; scale it to ``replicas`` on the way. True when it was re-rendered. A JSON
        patch ``replace``: what the new template leaves out goes (a merge patch would keep an old map key)."""
        name = desired["metadata"]["name"]
        want = desired["metadata"]["annotations"][names.ANNOTATION_TEMPLATE_HASH]
        meta = existing.get("metadata", {})
        if (meta.get("annotations") or {}).get(names.ANNOTATION_TEMPLATE_HASH) == want:
            return False
        key = names.ANNOTATION_TEMPLATE_HASH.replace("~", "~0").replace("/", "~1")
        ops: list[dict[str, Any]] = [
            {"op": "replace", "path": "/spec/template", "value": desired["spec"]["template"]},
            {"op": "add", "path": "/spec/replicas", "value": replicas},
            {"op": "add", "path": f"/metadata/annotations/{key}", "value": want}
            if meta.get("annotations")
            else {"op": "add", "path": "/metadata/annotations", "value": {names.ANNOTATION_TEMPLATE_HASH: want}},
        ]
        try:
            self.kube.json_patch("apps/v1", "Deployment", run.namespace, name, ops)
        except Refused as exc:
            raise ChildRejected.of("Deployment", name, exc) from None
        log.info("%s/%s: the spec changed Deployment %s's pods: re-rendered (rolling)", run.namespace, run.name, name)
        return True

    def ensure_infra(
        self,
        run: builders.RunRef,
        spec: ClusterRunSpec,
        existing: dict[str, dict[str, Any]],
        tools: tuple[ToolService, ...],
        *,
        serving: bool = True,
    ) -> None:
        """The inference server and tool services exist and are scaled up while phases run (the run's auth
        Secret first: the pods take their keys from it). ``serving`` False (a colocated weight phase, whose pod
        has a server of its own): the run's vLLM Deployment is scaled to 0 meanwhile, so its GPUs are not held
        idle; the next phase that samples from it scales it up again and waits for it to serve."""
        self.ensure_auth_secret(run)
        inference = names.inference_name(run.name)
        for manifest in self._built_infra(run, spec, tools):
            name = manifest["metadata"]["name"]
            replicas = 0 if name == inference and not serving else 1
            if manifest["kind"] == "Deployment" and name in existing:
                if self.rerender(run, manifest, existing[name], replicas):
                    continue
                if existing[name].get("spec", {}).get("replicas") != replicas:
                    self.patch("apps/v1", "Deployment", run.namespace, name, {"spec": {"replicas": replicas}})
                continue
            if manifest["kind"] == "Deployment":
                self.ensure({**manifest, "spec": {**manifest["spec"], "replicas": replicas}})
            else:
                self.ensure_fixed(manifest)

    def _built_infra(
        self, run: builders.RunRef, spec: ClusterRunSpec, tools: tuple[ToolService, ...]
    ) -> list[dict[str, Any]]:
        """:meth:`infra` at one replica, built again only when what it is built from changed (a spec is parsed once
        per generation, so the same object means the same spec): every start of a phase ensures the run's
        infrastructure, and building its manifests (two pod templates, hashed) was most of that once they exist (a new
        checkpoint changes none of them: the pods load it from the store). The manifests are shared: never changed in
        place."""
        key = (spec, tools, self.sandbox_runtime)
        held = self._infra.get(run.uid)
        if held is not None and held[0][0] is spec and held[0][1:] == key[1:]:
            return held[1]
        built = self.infra(run, spec, 1, tools)
        self._infra[run.uid] = (key, built)
        return built

    def scale_infra(self, run: builders.RunRef, replicas: int, deps: dict[str, dict[str, Any]] | None = None) -> None:
        for dep in (self.deployments(run) if deps is None else deps).values():
            if dep.get("spec", {}).get("replicas") != replicas:
                self.patch(
                    "apps/v1", "Deployment", run.namespace, dep["metadata"]["name"], {"spec": {"replicas": replicas}}
                )

    def stop_children(self, run: builders.RunRef, spec: ClusterRunSpec | None = None) -> None:
        """Delete the run's unfinished Jobs (and JobSets, given the spec that makes them) on suspend / end of
        run; finished ones stay for inspection."""
        children = (
            self.phase_children(run, spec)
            if spec is not None
            else self.reads.children(informer.JOB, run.namespace, run.name)
        )
        for child in children:
            if observe.job_child(child).state is ChildState.RUNNING and not child["metadata"].get("deletionTimestamp"):
                self.delete_child(run, child)

    def serve_checkpoint(
        self, run: builders.RunRef, spec: ClusterRunSpec, store: Store, checkpoint: str | None
    ) -> None:
        """The one place the operator names what inference serves: ``serving.json``, what the vLLM pod's
        ``fetch-weights`` and ``weight-sync`` load (a restarted pod included); the run's status names it too
        (``currentCheckpoint``). Operators before this one also wrote it on the vLLM Deployment
        (:data:`names.ANNOTATION_CHECKPOINT`), a patch a served checkpoint: a Deployment that still carries that note
        loses it here, so that none is left stale."""
        if run.uid in self._serving and self._serving[run.uid] == checkpoint:
            return  # what the operator wrote last (nobody else writes it)
        changed = serve(store, run.name, checkpoint)
        self._serving[run.uid] = checkpoint
        if not changed or not builders.uses_vllm(spec):
            return
        name = names.inference_name(run.name)
        dep = self.deployments(run).get(name)
        if dep is not None and names.ANNOTATION_CHECKPOINT in (dep["metadata"].get("annotations") or {}):
            self.patch(
                "apps/v1",
                "Deployment",
                run.namespace,
                name,
                {"metadata": {"annotations": {names.ANNOTATION_CHECKPOINT: None}}},
            )

    def time_job(self, job: dict[str, Any], child: Child) -> None:
        """Observe a finished Job's wall time once (phase_duration, by kind and outcome)."""
        uid = job["metadata"].get("uid", job["metadata"]["name"])
        kind = job["metadata"].get("labels", {}).get(names.LABEL_KIND, "unknown")
        if child.state not in (ChildState.SUCCEEDED, ChildState.FAILED):
            return
        if uid in self._timed:
            return
        self._timed.add(uid)
        status = job.get("status", {})
        start, end = status.get("startTime"), status.get("completionTime") or _condition_time(job)
        if start and end:
            seconds = (_parse_time(end) - _parse_time(start)).total_seconds()
            self.metrics.phase_duration.labels(kind=kind, outcome=child.state.value).observe(max(seconds, 0.0))


def _present_key(manifest: dict[str, Any]) -> str:
    """A child of one WhaleRun object: its owner's UID in the key, so a run deleted and made again under the same
    name (whose children went with the old one) finds none of them known."""
    meta = manifest["metadata"]
    owner = (meta.get("ownerReferences") or [{}])[0].get("uid", "")
    return f"{owner}/{meta['namespace']}/{manifest['kind']}/{meta['name']}"


def _parse_time(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def _condition_time(job: dict[str, Any]) -> str | None:
    for cond in job.get("status", {}).get("conditions") or []:
        if cond.get("type") in ("Complete", "Failed") and cond.get("status") == "True":
            return cond.get("lastTransitionTime")
    return None


def write_spec(store: Store, run: str, spec: ClusterRunSpec) -> None:
    """The spec a child reads first thing (``layout.spec_key``), written only when it changed."""
    wire = spec.to_wire()
    if store.read_json_or_none(layout.spec_key(run)) != wire:
        store.write_json(layout.spec_key(run), wire)


def store_holds_run(store: Store, run: str) -> bool:
    """Whether the store holds the run: the spec every child launch writes first (:func:`write_spec`)."""
    return store.exists(layout.spec_key(run))


def stored_experiment_changes(store: Store, run: str, spec: WhaleRunSpec) -> list[FieldChange]:
    """The experiment's fields ``spec`` changed since the run's children last ran with it (what
    :func:`write_spec` wrote; the rule of ``whale.core.mutability``, as `whale run` applies it on resume); none
    when the store holds no spec yet, or one of another version."""
    wire = store.read_json_or_none(layout.spec_key(run))
    if not isinstance(wire, dict):
        return []
    try:
        ran = WhaleRunSpec.model_validate(wire)
    except ValidationError:
        return []  # written by another version: nothing to compare with
    return experiment_changes(ran, spec)
