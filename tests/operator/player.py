"""A test double of the cluster's side of a WhaleRun: the Job controller and the three workloads.

No GPU, vLLM or kubelet can run here, so the tests play them: read the PhaseRequest the operator
wrote to the store, write the metrics/checkpoints/result a real workload would (``whale.core.protocol``
shapes, ``whale.core.layout`` keys), and mark the Job finished through the API — so the operator sees
exactly what it would see on a cluster.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any

from tests.fixtures.kube import APIError, KubeAPI, wait_for
from whale.core import layout
from whale.core.convert import raw_section
from whale.core.protocol import (
    EvalResult,
    HarnessIterationMetrics,
    HarnessPhaseResult,
    PhaseKind,
    PhaseRequest,
    WeightPhaseResult,
    WeightStepMetrics,
    parse_request,
)
from whale.core.spec import API_GROUP, API_VERSION
from whale.inference.doorbell import ANNOTATION as DOORBELL_ANNOTATION
from whale.store import Store, open_store
from whale_operator import names
from whale_operator.tenancy import run_store_uri

WR = f"{API_GROUP}/{API_VERSION}"


def run_store(base: Store, namespace: str, name: str, uid: str, resume_from: str | None = None) -> Store:
    """The store the operator gives the run (``whale_operator.tenancy``): the workloads' view of it."""
    return open_store(run_store_uri(base.uri, namespace, name, uid, resume_from))


def create_run(api: KubeAPI, base: Store, namespace: str, name: str, spec: dict[str, Any]) -> tuple[Store, str]:
    """Create a WhaleRun; returns (the run's store, which its UID names, and the UID)."""
    body = {"apiVersion": WR, "kind": "WhaleRun", "metadata": {"name": name}, "spec": spec}
    uid = api.create(WR, "whaleruns", namespace, body)["metadata"]["uid"]
    return run_store(base, namespace, name, uid, raw_section(spec, "resumeFrom")), uid


def job_finished(job: dict[str, Any]) -> bool:
    return any(
        c.get("status") == "True" and c.get("type") in ("Complete", "Failed", "Suspended")
        for c in job.get("status", {}).get("conditions") or []
    )


@dataclass
class WorkloadPlayer:
    api: KubeAPI
    store: Store
    namespace: str
    run: str
    #: eval score as a function of (cycle, step, after)
    eval_score: Any = None
    handled: set[str] = field(default_factory=set)
    #: acknowledge serving targets like the weight-sync sidecar (False: the test plays it itself)
    play_sidecar: bool = True
    #: the sidecar rings the operator's doorbell after acknowledging (False: the store alone, an old sidecar)
    ring_doorbell: bool = True
    #: finish data-preparation Jobs like the prepare workload, writing these split sizes (False: the test does)
    play_prepare: bool = True
    splits: dict[str, int] | None = None

    # --- views ---
    def wr(self) -> dict[str, Any]:
        obj = self.api.get(WR, "whaleruns", self.namespace, self.run)
        assert obj is not None, f"WhaleRun {self.run} is gone"
        return obj

    def status(self) -> dict[str, Any]:
        return self.wr().get("status") or {}

    def jobs(self) -> list[dict[str, Any]]:
        """The run's Jobs (with ``play_prepare``, not the data-preparation Jobs this player finishes itself)."""
        jobs = self.api.list("batch/v1", "jobs", self.namespace, f"{names.LABEL_RUN}={self.run}")
        if not self.play_prepare:
            return jobs
        return [j for j in jobs if (j["metadata"].get("labels") or {}).get(names.LABEL_KIND) != names.PREPARE]

    def job_names(self) -> list[str]:
        return sorted(j["metadata"]["name"] for j in self.jobs())

    def ack_serving(self) -> bool:
        """Play the vLLM pod's weight-sync sidecar: acknowledge the serving target (served.json), then ring the
        operator's doorbell with the real :class:`Doorbell` (its ConfigMap, where the run has one). True when there
        was a target to acknowledge (now or before)."""
        target = self.store.read_json_or_none(layout.serving_key(self.run))
        if target is None:
            return False
        if self.store.read_json_or_none(layout.served_key(self.run)) != target:
            self.store.write_json(layout.served_key(self.run), target)
            if self.ring_doorbell:
                self.ring(target)
        return True

    def ring(self, ack: dict[str, Any]) -> None:
        """Ring the doorbell as :class:`~whale.inference.doorbell.Doorbell` does (its test rings the real one): the
        same patch of ``<run>-served``, through this player's client (a client per ring is slow with 200 runs)."""
        body = {"metadata": {"annotations": {DOORBELL_ANNOTATION: json.dumps(ack, sort_keys=True)}}}
        try:
            self.api.patch("v1", "configmaps", self.namespace, names.served_doorbell_name(self.run), body)
        except APIError as exc:
            if exc.code != 404:  # a run without the doorbell (JobSet admission, no vLLM): nothing to ring
                raise

    def play_prepare_jobs(self) -> None:
        """Play data preparation: a prepare Job the operator started (it reconciled the new run before the
        test wrote the split sizes) writes them and completes, as the real workload would."""
        selector = f"{names.LABEL_RUN}={self.run},{names.LABEL_KIND}={names.PREPARE}"
        for job in self.api.list("batch/v1", "jobs", self.namespace, selector):
            if not job_finished(job):
                if self.splits is not None:
                    self.store.write_json(layout.split_sizes_key(self.run), self.splits)
                self.complete(job)

    def pending_job(self) -> dict[str, Any] | None:
        if self.play_sidecar:
            self.ack_serving()
        if self.play_prepare:
            self.play_prepare_jobs()
        for job in self.jobs():
            if self.awaits(job):
                return job
        return None

    def awaits(self, job: dict[str, Any]) -> bool:
        """``job`` is one of this run's the player has not handled, and it has not ended: the next one to play."""
        return job["metadata"]["name"] not in self.handled and not job_finished(job)

    def wait_job(self, timeout_s: float = 20.0) -> dict[str, Any]:
        return wait_for(self.pending_job, timeout_s, what=f"a new Job of {self.run}")

    def request(self, job: dict[str, Any]) -> PhaseRequest:
        phase = job["metadata"]["labels"][names.LABEL_PHASE]
        return parse_request(self.store.read_json(layout.request_key(self.run, phase)))

    # --- workload outputs ---
    def rollouts_per_step(self) -> int:
        """From the run's spec.json, as a real train workload reads it."""
        rsft = raw_section(self.store.read_json(layout.spec_key(self.run)), "rsft") or {}
        return rsft["promptsPerStep"] * rsft.get("rolloutsPerPrompt", 8)

    def weight_metrics(self, req: PhaseRequest, step: int, reward: float = 0.5) -> None:
        assert req.weight is not None
        rps = self.rollouts_per_step()
        self.store.append_jsonl(
            layout.metrics_key(self.run, req.phase),
            WeightStepMetrics(
                step=step,
                epoch=step / req.weight.steps_per_epoch,
                reward_mean=reward,
                acceptance_rate=0.5,
                kept=rps // 2,
                loss=0.1,
                learning_rate=1e-7,
                rollouts=rps,
            ).to_wire(),
        )

    def checkpoint(self, step: int) -> str:
        prefix = layout.checkpoint_prefix(self.run, step)
        self.store.write_json(f"{prefix}/config.json", {"step": step})
        self.store.write_bytes(layout.checkpoint_complete_key(self.run, step), b"")
        return prefix

    def finish_weight(
        self,
        req: PhaseRequest,
        final_step: int | None = None,
        *,
        write_metrics: bool = True,
        stopped_by: str = "target",
    ) -> None:
        args = req.weight
        assert args is not None
        final = args.target_step if final_step is None else final_step
        rps = self.rollouts_per_step()
        if write_metrics:
            for step in range(args.from_step + 1, final + 1):
                self.weight_metrics(req, step)
        for step in args.save_steps:
            if step <= final:
                self.checkpoint(step)
        ckpt = self.checkpoint(final)
        self.store.write_json(
            layout.result_key(self.run, req.phase),
            WeightPhaseResult(
                final_step=final, checkpoint=ckpt, rollouts=(final - args.from_step) * rps, stopped_by=stopped_by
            ).to_wire(),
        )

    def harness_metrics(self, req: PhaseRequest, iteration: int, best: float = 0.4) -> None:
        self.store.append_jsonl(
            layout.metrics_key(self.run, req.phase),
            HarnessIterationMetrics(
                iteration=iteration, best_score=best, best_candidate=f"it{iteration}-a", rollouts=24
            ).to_wire(),
        )

    def finish_harness(
        self,
        req: PhaseRequest,
        iterations: int | None = None,
        *,
        write_metrics: bool = True,
        stopped_by: str = "iterations",
    ) -> None:
        args = req.harness
        assert args is not None
        n = args.iterations if iterations is None else iterations
        if write_metrics:
            for it in range(1, n + 1):
                self.harness_metrics(req, it)
        key = layout.harness_key(self.run, f"c{args.cycle:02d}-accepted")
        self.store.write_text(key, "SYSTEM_PROMPT = 'accepted'\n")
        self.store.write_json(
            layout.result_key(self.run, req.phase),
            HarnessPhaseResult(
                accepted_harness=key,
                accepted_candidate=f"it{n}-a",
                accepted_score=0.5,
                iterations=n,
                rollouts=24 * n,
                stopped_by=stopped_by,
            ).to_wire(),
        )

    def finish_eval(self, req: PhaseRequest) -> None:
        args = req.eval
        assert args is not None
        score = self.eval_score(args.cycle, args.step, args.after) if self.eval_score else 0.1 + 0.01 * args.step
        self.store.write_json(
            layout.result_key(self.run, req.phase),
            EvalResult(mean_at_k=score, k=8, items=16, checkpoint=args.checkpoint, harness=args.harness).to_wire(),
        )

    # --- the Job controller ---
    def finish(self, job: dict[str, Any]) -> PhaseRequest:
        """Do what the Job's workload does, then mark the Job complete."""
        req = self.request(job)
        if req.kind is PhaseKind.WEIGHT:
            self.finish_weight(req)
        elif req.kind is PhaseKind.HARNESS:
            self.finish_harness(req)
        else:
            self.finish_eval(req)
        self.complete(job)
        return req

    def complete(self, job: dict[str, Any]) -> None:
        self.handled.add(job["metadata"]["name"])
        self.api.complete_job(self.namespace, job["metadata"]["name"])

    def fail(self, job: dict[str, Any], message: str = "exit code 1") -> None:
        self.handled.add(job["metadata"]["name"])
        self.api.fail_job(self.namespace, job["metadata"]["name"], message)

    def play_to_end(self, timeout_s: float = 60.0, on_job: Any = None) -> dict[str, Any]:
        """Finish every Job the operator creates until the run is terminal; returns the final status."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            st = self.status()
            if st.get("phase") in ("Succeeded", "Failed"):
                return st
            job = self.pending_job()
            if job is None:
                time.sleep(0.05)
                continue
            if on_job is not None:
                on_job(job)
            self.finish(job)
        raise AssertionError(f"run {self.run} did not finish in {timeout_s} s; status: {self.status()}")
