"""How the operator's children start and stop: a phase is a Job, beside the run's inference server and
tool services (Deployments). What runs when is decided elsewhere (``decide`` and
``whale.control.planner``); this module only carries it out through the Kubernetes API, idempotently
(every name is derived, so a create that finds its object is a no-op)."""

from __future__ import annotations

import logging
import secrets
from datetime import datetime
from typing import Any

from whale.control.planner import write_request
from whale.control.serving import serve
from whale.core import layout
from whale.core.alternation import Child, ChildState, StartPhase
from whale.core.protocol import WeightRequest
from whale.core.spec import WhaleRunSpec
from whale.domain import ToolService
from whale.store import Store
from whale_operator import builders, names, observe
from whale_operator.config import store_uri
from whale_operator.kube import Conflict, KubeClient, collection_path
from whale_operator.metrics import OperatorMetrics

log = logging.getLogger(__name__)


class JobLauncher:
    """The operator's children of every run, through one Kubernetes client."""

    def __init__(self, kube: KubeClient, metrics: OperatorMetrics):
        self.kube = kube
        self.metrics = metrics
        self._timed: set[str] = set()

    def deployments(self, run: builders.RunRef) -> dict[str, dict[str, Any]]:
        return {
            d["metadata"]["name"]: d
            for d in self.kube.list("apps/v1", "Deployment", run.namespace, names.run_selector(run.name))
        }

    def start(
        self,
        run: builders.RunRef,
        spec: WhaleRunSpec,
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
        write_request(store, run.name, req)  # before the Job: the workload reads it first thing
        svc = builders.rendezvous_service(run, spec, req)
        if svc is not None:
            self.ensure(svc)
        if spec.inference.placement == "colocated" and isinstance(req, WeightRequest):
            # one pod, trainer and vLLM on the same GPUs (a DRA claim both containers reference)
            self.ensure(builders.colocated_gpu_claim_template(run, spec, req))
            return self.ensure(builders.colocated_train_job(run, spec, req, store_uri=store_uri(spec), tools=tools))
        return self.ensure(builders.job(run, spec, req, store_uri=store_uri(spec), tools=tools))

    def ensure(self, manifest: dict[str, Any]) -> bool:
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

    def ensure_secret(self, manifest: dict[str, Any]) -> bool:
        """Create a Secret unless it exists: a clash means it does (the operator may create Secrets, never read
        them, so there is no get after the clash as in :meth:`ensure`)."""
        meta = manifest["metadata"]
        try:
            self.kube.request("POST", collection_path("v1", "Secret", meta["namespace"]), body=manifest)
        except Conflict:
            return False
        self.metrics.children_created.labels(kind="Secret").inc()
        return True

    def infra(
        self,
        run: builders.RunRef,
        spec: WhaleRunSpec,
        checkpoint: str | None,
        replicas: int,
        tools: tuple[ToolService, ...],
    ) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        if builders.uses_vllm(spec):
            out.append(
                builders.inference_deployment(
                    run, spec, store_uri=store_uri(spec), checkpoint=checkpoint, replicas=replicas
                )
            )
            out.append(builders.inference_service(run, spec))
            out.append(builders.inference_network_policy(run))  # vLLM's port: the run's own pods only
        out += builders.tool_children(run, spec, tools, store_uri=store_uri(spec), replicas=replicas)
        out += builders.harness_children(run, spec, replicas=replicas)
        return out

    def ensure_infra(
        self,
        run: builders.RunRef,
        spec: WhaleRunSpec,
        checkpoint: str | None,
        existing: dict[str, dict[str, Any]],
        tools: tuple[ToolService, ...],
    ) -> None:
        """The inference server, tool services and harness host exist and are scaled up while phases run."""
        if builders.uses_harness_host(spec) and names.harness_name(run.name) not in existing:
            # before the pods that read it; generated once, an existing Secret is never overwritten (nor read)
            self.ensure_secret(builders.auth_secret(run, new_auth_values()))
        for manifest in self.infra(run, spec, checkpoint, 1, tools):
            name = manifest["metadata"]["name"]
            if manifest["kind"] == "Deployment" and name in existing:
                if existing[name].get("spec", {}).get("replicas") != 1:
                    self.kube.merge_patch("apps/v1", "Deployment", run.namespace, name, {"spec": {"replicas": 1}})
                continue
            if manifest["kind"] != "Deployment" and manifest["metadata"]["name"] in existing:
                continue
            self.ensure(manifest)

    def scale_infra(self, run: builders.RunRef, replicas: int, deps: dict[str, dict[str, Any]] | None = None) -> None:
        for dep in (self.deployments(run) if deps is None else deps).values():
            if dep.get("spec", {}).get("replicas") != replicas:
                self.kube.merge_patch(
                    "apps/v1", "Deployment", run.namespace, dep["metadata"]["name"], {"spec": {"replicas": replicas}}
                )

    def stop_children(self, run: builders.RunRef) -> None:
        """Delete the run's unfinished Jobs (suspend / end of run); finished ones stay for inspection."""
        for job in self.kube.list("batch/v1", "Job", run.namespace, names.run_selector(run.name)):
            if observe.job_child(job).state is ChildState.RUNNING and not job["metadata"].get("deletionTimestamp"):
                self.kube.delete("batch/v1", "Job", run.namespace, job["metadata"]["name"])

    def serve_checkpoint(self, run: builders.RunRef, spec: WhaleRunSpec, store: Store, checkpoint: str | None) -> None:
        """The one place the operator names what inference serves: ``serving.json`` and, for the vLLM
        Deployment, its annotation (a restart then loads the right weights)."""
        if not serve(store, run.name, checkpoint):
            return
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

    def time_job(self, job: dict[str, Any], child: Child) -> None:
        """Observe a finished Job's wall time once (phase_duration, by kind and outcome)."""
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


def new_auth_values() -> dict[str, str]:
    """Fresh values of the run's own Secret (``builders.auth_secret``)."""
    return {
        builders.AUTH_HARNESS_TOKEN: secrets.token_urlsafe(32),
        builders.AUTH_VLLM_API_KEY: secrets.token_urlsafe(32),
    }


def _parse_time(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def _condition_time(job: dict[str, Any]) -> str | None:
    for cond in job.get("status", {}).get("conditions") or []:
        if cond.get("type") in ("Complete", "Failed") and cond.get("status") == "True":
            return cond.get("lastTransitionTime")
    return None
