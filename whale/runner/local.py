"""The local runner: the embedded default behind `whale run`.

The same ``decide()`` loop the operator runs, with each phase a local subprocess running the
workload entrypoint, and the store (a local folder or S3) as the source of truth. The status is
persisted to the store after every transition, so Ctrl-C (or a crash) followed by `whale run`
again resumes where it stopped: finished phases are read back from their results, and a phase
that was running is relaunched and resumes from its own state in the store.

One child runs at a time (a laptop or CI machine has no spare cores); the actions that ``decide``
asks for while a child runs are asked for again after it ends (``decide`` is level-based).
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

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
from whale.protocol import PhaseKind
from whale.spec import WhaleRunSpec, WhaleRunStatus
from whale.store import Store

log = logging.getLogger(__name__)

POLL_INTERVAL_S = 0.5
TERMINATE_GRACE_S = 10.0
DEFAULT_WORKLOAD_COMMAND = (sys.executable, "-m", "whale.workloads")


class RunConflictError(RuntimeError):
    """The store already holds a run of this name started from a different spec."""


def utc_now() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass
class _Proc:
    phase: str
    attempt: int
    popen: subprocess.Popen[bytes]
    log_path: Path
    started: float
    deadline: float | None
    stop_reason: str | None = None

    def state(self) -> Child:
        code = self.popen.poll()
        if code is None:
            if self.deadline is not None and time.monotonic() > self.deadline:
                self.terminate("deadline exceeded (spec.retry.activeDeadlineSeconds)")
                return Child(ChildState.FAILED, self.stop_reason or "deadline exceeded")
            return Child(ChildState.RUNNING)
        if code == 0:
            return Child(ChildState.SUCCEEDED)
        if self.stop_reason:
            return Child(ChildState.FAILED, self.stop_reason)
        why = f"exit code {code}" if code > 0 else f"killed by signal {-code}"
        tail = last_line(self.log_path)
        return Child(ChildState.FAILED, f"{why}: {tail}" if tail else why)

    def terminate(self, reason: str) -> None:
        self.stop_reason = reason
        if self.popen.poll() is not None:
            return
        try:
            os.killpg(self.popen.pid, signal.SIGTERM)
            self.popen.wait(timeout=TERMINATE_GRACE_S)
        except subprocess.TimeoutExpired:
            os.killpg(self.popen.pid, signal.SIGKILL)
            self.popen.wait(timeout=TERMINATE_GRACE_S)
        except ProcessLookupError:
            pass


def last_line(path: Path, limit: int = 400) -> str:
    try:
        with open(path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            size = fh.tell()
            fh.seek(max(0, size - 8192))
            lines = [ln.strip() for ln in fh.read().decode("utf-8", "replace").splitlines() if ln.strip()]
    except OSError:
        return ""
    return lines[-1][:limit] if lines else ""


@dataclass
class LocalRunner:
    """Drives one run to a terminal (or suspended) status on this machine."""

    name: str
    spec: WhaleRunSpec
    store: Store
    split_sizes: dict[str, int]
    workdir: Path
    workload_command: tuple[str, ...] = DEFAULT_WORKLOAD_COMMAND
    env: dict[str, str] = field(default_factory=dict)
    poll_interval_s: float = POLL_INTERVAL_S
    on_status: Callable[[WhaleRunStatus, WhaleRunStatus | None, Decision], None] | None = None
    procs: dict[str, _Proc] = field(default_factory=dict)

    # --- persistence ---
    def load_status(self) -> WhaleRunStatus:
        raw = self.store.read_json_or_none(layout.status_key(self.name))
        return WhaleRunStatus.model_validate(raw) if raw else WhaleRunStatus()

    def save_status(self, status: WhaleRunStatus) -> None:
        self.store.write_json(layout.status_key(self.name), status.to_wire())

    def claim(self) -> None:
        """Record the spec; refuse to resume a run of the same name with a different spec."""
        key = layout.spec_key(self.name)
        wire = self.spec.to_wire()
        existing = self.store.read_json_or_none(key)
        if existing is not None and existing != wire:
            raise RunConflictError(
                f"the store already has a run named {self.name!r} with a different spec "
                f"({self.store.uri_for(key)}); give the manifest another metadata.name or use another store"
            )
        if existing is None:
            self.store.write_json(key, wire)
        self.store.write_json(layout.split_sizes_key(self.name), dict(self.split_sizes))

    # --- observing ---
    def observe(self, status: WhaleRunStatus) -> Observations:
        children: dict[str, Child] = {}
        for phase, proc in self.procs.items():
            if status.attempts.get(phase, 1) == proc.attempt:
                children[phase] = proc.state()
        prefix = f"{layout.run_prefix(self.name)}/phases/"
        results = {}
        for key in self.store.list(prefix):
            if key.endswith("/result.json"):
                phase = key[len(prefix):-len("/result.json")]
                results[phase] = self.store.read_json(key)
        metrics = {}
        if status.active_phase:
            metrics[status.active_phase] = self.store.read_jsonl(layout.metrics_key(self.name, status.active_phase))
        checkpoints = set()
        for entry in self.store.list(layout.checkpoints_prefix(self.name) + "/", recursive=False):
            step = layout.parse_checkpoint_step(entry.rstrip("/").rsplit("/", 1)[-1])
            if step is not None and self.store.exists(layout.checkpoint_complete_key(self.name, step)):
                checkpoints.add(step)
        return Observations(
            run=self.name, children=children, results=results, metrics=metrics,
            checkpoints=frozenset(checkpoints), split_sizes=self.split_sizes, now=utc_now(),
        )

    # --- acting ---
    def running(self) -> _Proc | None:
        for proc in self.procs.values():
            if proc.popen.poll() is None:
                return proc
        return None

    def launch(self, action: StartPhase) -> None:
        req = action.request
        self.store.write_json(layout.request_key(self.name, req.phase), req.to_wire())
        log_path = self.workdir / "logs" / f"{req.phase}.attempt-{req.attempt}.log"
        log_path.parent.mkdir(parents=True, exist_ok=True)
        argv = [*self.workload_command, req.kind.workload, "--store", self.store.uri, "--run", self.name,
                "--phase", req.phase]
        env = {**os.environ, **self.env, "PYTHONUNBUFFERED": "1"}
        with open(log_path, "ab") as log_fh:
            popen = subprocess.Popen(argv, stdout=log_fh, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                     env=env, start_new_session=True)  # cwd inherited: relative paths in the spec work
        deadline_s = self.spec.retry.active_deadline_seconds
        self.procs[req.phase] = _Proc(req.phase, req.attempt, popen, log_path, time.monotonic(),
                                      time.monotonic() + deadline_s if deadline_s else None)
        log.info("started %s attempt %d (pid %d)", req.phase, req.attempt, popen.pid)

    def collect_log(self, proc: _Proc) -> None:
        try:
            self.store.write_bytes(layout.log_key(self.name, proc.phase, proc.attempt), proc.log_path.read_bytes())
        except OSError:
            log.warning("could not read the log of %s", proc.phase)

    def apply(self, decision: Decision) -> str | None:
        """Apply the actions; returns 'finished' / 'failed' / 'suspended' when the loop should end."""
        outcome = None
        # Owed evaluations first: they report on points the run has already passed.
        ordered = sorted(decision.actions, key=lambda a: not (isinstance(a, StartPhase) and a.kind is PhaseKind.EVAL))
        for action in ordered:
            if isinstance(action, StartPhase):
                current = self.procs.get(action.phase)
                if current and current.attempt == action.attempt and current.popen.poll() is None:
                    continue  # already running (idempotent)
                if self.running() is None:
                    self.launch(action)
            elif isinstance(action, StopPhase):
                self.store.write_text(layout.stop_key(self.name, action.phase), action.reason + "\n")
            elif isinstance(action, SuspendRun):
                self.stop_all(action.reason)
                outcome = "suspended"
            elif isinstance(action, Finish):
                outcome = "finished"
            elif isinstance(action, Fail):
                outcome = "failed"
            elif isinstance(action, ServeCheckpoint):
                pass  # in-process inference loads the checkpoint each phase is given
        return outcome

    def stop_all(self, reason: str) -> None:
        for proc in self.procs.values():
            if proc.popen.poll() is None:
                proc.terminate(reason)
                self.collect_log(proc)

    # --- the loop ---
    def run(self, max_seconds: float | None = None) -> WhaleRunStatus:
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.claim()
        status = self.load_status()
        if status.phase.is_terminal():
            return status
        deadline = time.monotonic() + max_seconds if max_seconds else None
        finished_logs: set[tuple[str, int]] = set()
        try:
            while True:
                decision = decide(self.spec, status, self.observe(status))
                previous, status = status, decision.status
                if status != previous:
                    self.save_status(status)
                if self.on_status is not None:
                    self.on_status(status, previous, decision)
                outcome = self.apply(decision)
                for proc in self.procs.values():
                    if proc.popen.poll() is not None and (proc.phase, proc.attempt) not in finished_logs:
                        finished_logs.add((proc.phase, proc.attempt))
                        self.collect_log(proc)
                if outcome is not None or status.phase.is_terminal():
                    return status
                if deadline is not None and time.monotonic() > deadline:
                    raise TimeoutError(f"run {self.name} did not finish within {max_seconds} s")
                proc = self.running()
                if proc is not None:
                    try:
                        proc.popen.wait(timeout=self.poll_interval_s)
                    except subprocess.TimeoutExpired:
                        pass
                elif not decision.of_type(StartPhase):
                    # Nothing running and nothing to start: only a store that changes under us moves on.
                    time.sleep(self.poll_interval_s)
        except BaseException:
            self.stop_all("runner interrupted")
            self.save_status(status)
            raise


def status_summary(status: WhaleRunStatus) -> dict[str, Any]:
    """The fields a person looks at first (the CLI prints these)."""
    best = status.best
    return {
        "phase": status.phase.value,
        "cycle": status.cycle,
        "stage": status.stage.value if status.stage else None,
        "step": status.step,
        "totalSteps": status.total_steps,
        "iteration": status.iteration,
        "reward": status.training_reward,
        "harnessScore": status.harness_score,
        "activePhase": status.active_phase,
        "best": f"{best.mean_at_k:.4f} (mean@{best.k}, {best.phase})" if best else None,
        "rolloutsSpent": status.rollouts_spent,
        "message": status.message,
    }
