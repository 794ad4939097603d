"""The local runner: the embedded default behind `whale run`.

The same ``decide()`` loop the operator runs, with each phase a local subprocess running the
workload entrypoint, and the store (a local folder or S3) as the source of truth. The status is
persisted to the store after every transition, so Ctrl-C (or a crash) followed by `whale run`
again resumes where it stopped: finished phases are read back from their results, and a phase
that was running is relaunched and resumes from its own state in the store.

One child runs at a time (a laptop or CI machine has no spare cores); the actions that ``decide``
asks for while a child runs are asked for again after it ends (``decide`` is level-based).

What keeps a run consistent however the runner ends:

* one runner per run: the run lock (``layout.lock_key``, ``whale.store.lease``) is held for the
  runner's whole life; a second runner of the same run is refused with the holder's pid, host and
  start time; the workloads get the lock's owner id (``WHALE_RUN_OWNER``) and refuse to write a run
  that another live process holds;
* no orphans: every workload runs under ``whale/runner/supervise.py``, which kills the workload and
  everything it started when the runner dies, even by SIGKILL;
* an honest status: Ctrl-C, SIGTERM (see :func:`interrupt_on_signals`), ``--timeout``, a store error
  or a crash stop the children, then save the status with the ``Interrupted`` condition and a message
  saying how to resume; a Running run becomes Interrupted (``decide`` reads it as Running, so the
  next runner resumes it level-based and clears the condition);
* ``retry=True`` (``whale run --retry``) puts a Failed run back to Running from its last good state
  (:func:`retry_status`);
* a manifest may change between runs only outside the experiment (``whale.core.mutability``, the rule the
  operator and the CRD apply too); a change of the experiment is refused, naming each differing field;
* `whale stop NAME` (``whale.runner.control``): a stop request addressed to this runner's lock is polled
  between decisions and ends the run like a signal, with the reason ``StopRequested``.

For people watching: each launch records the child (``control/child.json``: phase, attempt, log file),
its log is copied to the store every :data:`LOG_SYNC_INTERVAL_S` while it runs (and in full when it ends),
so `whale logs` follows it from anywhere; ``on_view`` hears the status with the running child's metrics
lines and progress object (:class:`RunnerView`) at most every :data:`VIEW_INTERVAL_S`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from whale.control.observer import StoreObserver
from whale.control.planner import RunEnd, plan, prune_checkpoints, write_request, write_stop
from whale.core import layout
from whale.core.alternation import (
    Child,
    ChildState,
    Observations,
    StartPhase,
    Transition,
    decide,
)
from whale.core.mutability import IMMUTABLE, MUTABLE, FieldChange, experiment_changes, spec_changes
from whale.core.protocol import PhaseMetrics, PhaseProgress, PhaseRequest
from whale.core.spec import WhaleRunSpec
from whale.core.state import RunState
from whale.core.status import ConditionType, MetaCondition, Reason, RunPhase, WhaleRunStatus
from whale.runner.control import ChildRecord, StopRequest, read_stop, write_child
from whale.store import Store, StoreError
from whale.store.lease import DEFAULT_TTL_S, RUN_OWNER_ENV, Lease, LeaseHeld, LeaseLost, this_process

log = logging.getLogger(__name__)

POLL_INTERVAL_S = 0.5
#: a stopped workload gets this long to exit after SIGTERM before it is killed
TERMINATE_GRACE_S = 10.0
#: how long the runner waits for the supervisor to finish killing, at each escalation
KILL_WAIT_S = 5.0
#: when the run is done, a child that wrote its result gets this long to exit by itself before it is stopped
EXIT_WAIT_S = 10.0
DEFAULT_WORKLOAD_COMMAND = (sys.executable, "-m", "whale.workloads")
SUPERVISOR_PATH = str(Path(__file__).resolve().with_name("supervise.py"))
#: the status condition that says the last runner stopped before the run ended
INTERRUPTED = ConditionType.INTERRUPTED
#: at most this many differing fields are listed in a refusal
MAX_LISTED_CHANGES = 20
#: the running child's log is copied to the store at most this often (and in full when it ends)
LOG_SYNC_INTERVAL_S = 3.0
#: ``on_view`` hears the running child's metrics and progress at most this often (and at every change of child)
VIEW_INTERVAL_S = 1.0
#: the condition reason of a run stopped by `whale stop`
STOP_REQUESTED = Reason.STOP_REQUESTED


class RunConflictError(RuntimeError):
    """The store already holds a run of this name started from a spec that differs in fields that may not change."""


class RunLockedError(LeaseHeld):
    """Another live process runs this run (the run lock is held)."""


class RunInterrupted(KeyboardInterrupt):
    """SIGTERM / SIGHUP, raised in the main thread like Ctrl-C's KeyboardInterrupt."""

    def __init__(self, signum: int):
        self.signum = signum
        super().__init__(signal.Signals(signum).name)


class RunTimeout(TimeoutError):
    """``max_seconds`` (``whale run --timeout``) passed before the run ended."""


class RunStopped(Exception):
    """`whale stop` asked this runner to stop (``request``); the run is resumable."""

    def __init__(self, request: StopRequest):
        self.request = request
        super().__init__(f"stopped by {request.describe()}")


def supervised(command: list[str], watch_fd: int, grace_s: float) -> list[str]:
    """``command`` under the supervisor (``supervise.py``), which kills it and all it started once ``watch_fd``'s
    write end closes (the launcher holding it died) and SIGKILLs it ``grace_s`` after a forwarded SIGTERM."""
    return [
        sys.executable,
        "-I",
        "-S",
        SUPERVISOR_PATH,
        "--watch-fd",
        str(watch_fd),
        "--grace",
        str(grace_s),
        "--",
        *command,
    ]


def utc_now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@contextlib.contextmanager
def interrupt_on_signals(signums: tuple[int, ...] = (signal.SIGTERM, signal.SIGHUP)) -> Iterator[None]:
    """Inside the block, SIGTERM and SIGHUP raise :class:`RunInterrupted` in the main thread, so the runner
    stops its children and saves the status as it does on Ctrl-C. Outside the main thread it does nothing
    (Python delivers signals to the main thread only)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {s: signal.getsignal(s) for s in signums}

    def handler(signum: int, _frame: Any) -> None:
        raise RunInterrupted(signum)

    for s in signums:
        signal.signal(s, handler)
    try:
        yield
    finally:
        for s, h in previous.items():
            signal.signal(s, h)


@contextlib.contextmanager
def _shielded() -> Iterator[None]:
    """Ignore SIGINT/SIGTERM/SIGHUP while the runner cleans up, so a second Ctrl-C cannot leave it half done
    (the supervisors still clean up if the runner is SIGKILLed)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    signums = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
    previous = {s: signal.signal(s, signal.SIG_IGN) for s in signums}
    try:
        yield
    finally:
        for s, h in previous.items():
            signal.signal(s, h)


# ----- the manifest on resume -----------------------------------------------------------------------


def _readable(wire: Any) -> WhaleRunSpec | None:
    """The stored spec as this version reads it (its defaults filled), or None where it cannot."""
    try:
        return WhaleRunSpec.model_validate(wire)
    except ValidationError:
        return None


def conflict_message(run: str, uri: str, fixed: list[FieldChange]) -> str:
    listed = [f"    {c}" for c in fixed[:MAX_LISTED_CHANGES]]
    if len(fixed) > MAX_LISTED_CHANGES:
        listed.append(f"    ... and {len(fixed) - MAX_LISTED_CHANGES} more")
    sections = ", ".join(f"spec.{name}" for name in IMMUTABLE)
    others = ", ".join(f"spec.{name}" for name in MUTABLE)
    return (
        f"the store already has a run named {run!r} with a different spec ({uri}); "
        f"{len(fixed)} field(s) of the experiment differ, which a resumed run may not change:\n"
        + "\n".join(listed)
        + "\n"
        f"The experiment ({sections}) is what the run computes; only the rest ({others}) may "
        "change on resume. Restore those fields, or give the manifest another metadata.name or use another store to start "
        "a new run"
    )


# ----- the status on interrupt and retry ----------------------------------------------------------


def interruption(exc: BaseException, max_seconds: float | None = None) -> tuple[Reason, str]:
    """(condition reason, what stopped the runner) for the exception that ended the loop."""
    if isinstance(exc, RunInterrupted):
        return Reason.SIGNAL, f"the runner got {signal.Signals(exc.signum).name}"
    if isinstance(exc, KeyboardInterrupt):
        return Reason.SIGNAL, "the runner got Ctrl-C (SIGINT)"
    if isinstance(exc, RunStopped):
        return STOP_REQUESTED, str(exc)
    if isinstance(exc, RunTimeout):
        return Reason.TIMEOUT, f"the runner stopped at its --timeout of {max_seconds:g} s" if max_seconds else "timeout"
    if isinstance(exc, StoreError):
        return Reason.STORE_ERROR, f"the store failed: {exc}"
    return Reason.RUNNER_ERROR, f"the runner crashed: {type(exc).__name__}: {exc}"


def mark_interrupted(status: WhaleRunStatus, reason: Reason, what: str, hint: str, now: str) -> WhaleRunStatus:
    """The status of a run whose runner stopped before the run ended (:meth:`RunState.interrupted`): the
    message says what happened and how to resume."""
    message = f"interrupted at {now}: {what}; run `{hint}` to resume"
    return _transition(status, lambda s: s.interrupted(reason, message, now))


def interrupted(status: WhaleRunStatus) -> MetaCondition | None:
    return RunState.from_status(status).interruption()


def clear_interrupted(status: WhaleRunStatus) -> WhaleRunStatus:
    """The status as a new runner takes the run over: no longer interrupted."""
    return _transition(status, RunState.taken_over)


def retry_status(status: WhaleRunStatus) -> WhaleRunStatus:
    """A Failed run back to Running from its last good state (:meth:`RunState.retried`)."""
    return _transition(status, RunState.retried)


def _transition(status: WhaleRunStatus, step: Callable[[RunState], RunState]) -> WhaleRunStatus:
    """``status`` itself when ``step`` changes nothing, so an unchanged status is not saved again."""
    before = RunState.from_status(status)
    after = step(before)
    return status if after == before else after.to_status()


# ----- children -----------------------------------------------------------------------------------


@dataclass
class _Proc:
    """One workload under its supervisor. ``watch_w`` is the runner's end of the supervisor's watch pipe:
    closing it (or the runner dying) makes the supervisor kill the workload's whole tree."""

    phase: str
    attempt: int
    popen: subprocess.Popen[bytes]
    log_path: Path
    started: float
    deadline: float | None
    watch_w: int | None = None
    grace_s: float = TERMINATE_GRACE_S
    stop_reason: str | None = None
    request: PhaseRequest | None = None
    #: the child record (``control/child.json``) of this launch
    record: ChildRecord | None = None
    #: bytes of the log last copied to the store, and when (monotonic)
    log_synced: int = -1
    log_synced_at: float = float("-inf")

    def state(self) -> Child:
        code = self.popen.poll()
        if code is None:
            if self.deadline is not None and time.monotonic() > self.deadline:
                self.terminate("deadline exceeded (spec.execution.retry.activeDeadlineSeconds)")
                return Child(ChildState.FAILED, self.stop_reason or "deadline exceeded")
            return Child(ChildState.RUNNING)
        if code == 0:
            return Child(ChildState.SUCCEEDED)
        if self.stop_reason:
            return Child(ChildState.FAILED, self.stop_reason)
        why = f"exit code {code}" if code > 0 else f"killed by signal {-code}"
        tail = last_line(self.log_path)
        return Child(ChildState.FAILED, f"{why}: {tail}" if tail else why)

    def _wait(self, timeout_s: float) -> bool:
        try:
            self.popen.wait(timeout=timeout_s)
            return True
        except subprocess.TimeoutExpired:
            return False

    def terminate(self, reason: str) -> None:
        """SIGTERM to the supervisor (it forwards it and kills the workload after its grace); then close
        the watch pipe (it kills the tree at once); then SIGKILL the process group as a last resort."""
        self.stop_reason = reason
        if self.popen.poll() is None:
            try:
                os.kill(self.popen.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            if not self._wait(self.grace_s + KILL_WAIT_S):
                self.close_watch()
                if not self._wait(KILL_WAIT_S):
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(self.popen.pid, signal.SIGKILL)
                    self._wait(KILL_WAIT_S)
        self.close_watch()

    def close_watch(self) -> None:
        if self.watch_w is not None:
            os.close(self.watch_w)
            self.watch_w = None


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


@dataclass(frozen=True)
class ChildView:
    """The running child as a display sees it."""

    request: PhaseRequest
    #: when it was launched (``time.monotonic``)
    started_s: float
    #: its phase's metrics lines so far (an earlier attempt's included), parsed
    metrics: tuple[PhaseMetrics, ...]
    #: where it is now, from its progress object (None: not written yet)
    progress: PhaseProgress | None


@dataclass(frozen=True)
class RunnerView:
    """What ``on_view`` hears: the status and the child running now (None between children)."""

    status: WhaleRunStatus
    child: ChildView | None


@dataclass
class LocalRunner:
    """Drives one run to a terminal (or suspended) status on this machine."""

    name: str
    spec: WhaleRunSpec
    store: Store
    #: the domain's split sizes when the caller knows them (`whale run` asks the domain); None: the run's
    #: data preparation (a ``prepare`` child ``decide`` schedules) writes them to the store
    split_sizes: dict[str, int] | None
    workdir: Path
    workload_command: tuple[str, ...] = DEFAULT_WORKLOAD_COMMAND
    env: dict[str, str] = field(default_factory=dict)
    poll_interval_s: float = POLL_INTERVAL_S
    on_status: Callable[[WhaleRunStatus, WhaleRunStatus | None, Transition], None] | None = None
    procs: dict[str, _Proc] = field(default_factory=dict)
    #: the command a person runs to resume; the interrupted status names it
    resume_hint: str = "whale run FILE"
    #: the run lock's lifetime without renewal (S3; a folder store's flock needs none)
    lease_ttl_s: float = DEFAULT_TTL_S
    terminate_grace_s: float = TERMINATE_GRACE_S
    #: the run lock while :meth:`run` holds it
    lease: Lease | None = None
    #: manifest fields that changed since the run was started (none of them in the experiment)
    changes: list[FieldChange] = field(default_factory=list)
    #: hears the status and the running child's metrics and progress (see :class:`RunnerView`)
    on_view: Callable[[RunnerView], None] | None = None
    log_sync_interval_s: float = LOG_SYNC_INTERVAL_S
    view_interval_s: float = VIEW_INTERVAL_S
    #: the time ``decide`` is given (RFC 3339); tests pass their own (the Stalled condition counts with it)
    clock: Callable[[], str] = utc_now
    _last_obs: Observations | None = field(default=None, repr=False)
    _observer: StoreObserver | None = field(default=None, repr=False)
    _last_view: tuple[float, str | None, WhaleRunStatus | None] = field(default=(float("-inf"), None, None), repr=False)

    @property
    def observer(self) -> StoreObserver:
        if self._observer is None:
            self._observer = StoreObserver(self.store, self.name)
        return self._observer

    # --- persistence ---
    def load_status(self) -> WhaleRunStatus:
        raw = self.store.read_json_or_none(layout.status_key(self.name))
        return WhaleRunStatus.model_validate(raw) if raw else WhaleRunStatus()

    def save_status(self, status: WhaleRunStatus) -> None:
        self.store.write_json(layout.status_key(self.name), status.to_wire())

    def claim(self) -> None:
        """Record the spec; refuse to resume a run of the same name whose experiment differs (naming each
        field, :func:`~whale.core.mutability.experiment_changes`); record the new spec when only its execution
        differs."""
        key = layout.spec_key(self.name)
        wire = self.spec.to_wire()
        existing = self.store.read_json_or_none(key)
        if existing is not None and existing != wire:
            stored = _readable(existing)
            if stored is None:  # written by a version that read specs otherwise: compared as written
                changes = spec_changes(existing, wire)
                fixed = [c for c in changes if c.in_experiment]
            else:
                changes = spec_changes(stored.to_wire(), wire)
                fixed = experiment_changes(stored, self.spec)
            if fixed:
                raise RunConflictError(conflict_message(self.name, self.store.uri_for(key), fixed))
            self.changes = changes
            log.warning("run %s resumes with a changed manifest: %s", self.name, "; ".join(map(str, changes)))
        if existing != wire:
            self.store.write_json(key, wire)
        if self.split_sizes is not None:
            self.store.write_json(layout.split_sizes_key(self.name), dict(self.split_sizes))

    # --- observing ---
    def observe(self, status: WhaleRunStatus) -> Observations:
        children = {
            phase: dataclasses.replace(proc.state(), name=f"process {proc.popen.pid}")
            for phase, proc in self.procs.items()
            if status.attempts.get(phase, 1) == proc.attempt
        }
        self._last_obs = self.observer.observe(status, children, self.known_split_sizes(), self.clock())
        return self._last_obs

    def known_split_sizes(self) -> dict[str, int]:
        """The split sizes: the caller's, else what data preparation wrote to the store (empty: not yet)."""
        if self.split_sizes is not None:
            return self.split_sizes
        raw = self.store.read_json_or_none(layout.split_sizes_key(self.name))
        if not isinstance(raw, dict):
            return {}
        self.split_sizes = {k: int(v) for k, v in raw.items()}
        return self.split_sizes

    # --- acting ---
    def running(self) -> _Proc | None:
        for proc in self.procs.values():
            if proc.popen.poll() is None:
                return proc
        return None

    def launch(self, action: StartPhase) -> None:
        """Start the workload under its supervisor (``supervise.py``), in a session of its own so a Ctrl-C
        in the terminal reaches only the runner, which then stops it in order."""
        if self.lease is None:
            raise RuntimeError("launch() outside run(): the run lock is not held")
        req = action.request
        write_request(self.store, self.name, req)
        self.store.delete(layout.progress_key(self.name, req.phase))  # an earlier attempt's; this one writes anew
        log_path = self.workdir / "logs" / f"{req.phase}.attempt-{req.attempt}.log"
        log_path.parent.mkdir(parents=True, exist_ok=True)
        workload = [
            *self.workload_command,
            req.kind.workload,
            "--store",
            self.store.uri,
            "--run",
            self.name,
            "--phase",
            req.phase,
        ]
        env = {**os.environ, **self.env, "PYTHONUNBUFFERED": "1", RUN_OWNER_ENV: self.lease.holder.owner}
        watch_r, watch_w = os.pipe()
        argv = supervised(workload, watch_r, self.terminate_grace_s)
        try:
            with open(log_path, "ab") as log_fh:
                popen = subprocess.Popen(
                    argv,
                    stdout=log_fh,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                    env=env,
                    start_new_session=True,  # cwd inherited: relative spec paths work
                    pass_fds=(watch_r, *self.lease.inherit_fds),
                )
        except BaseException:
            os.close(watch_w)
            raise
        finally:
            os.close(watch_r)
        deadline_s = self.spec.execution.retry.active_deadline_seconds
        record = ChildRecord(
            phase=req.phase,
            kind=req.kind,
            attempt=req.attempt,
            host=self.lease.holder.host,
            log=str(log_path.resolve()),
            started_at=utc_now(),
        )
        self.procs[req.phase] = _Proc(
            req.phase,
            req.attempt,
            popen,
            log_path,
            time.monotonic(),
            time.monotonic() + deadline_s if deadline_s else None,
            watch_w,
            self.terminate_grace_s,
            request=req,
            record=record,
        )
        log.info("started %s attempt %d (pid %d)", req.phase, req.attempt, popen.pid)
        write_child(self.store, self.name, record)

    def collect_log(self, proc: _Proc) -> None:
        try:
            data = proc.log_path.read_bytes()
        except OSError:
            log.warning("could not read the log of %s", proc.phase)
            return
        self.store.write_bytes(layout.log_key(self.name, proc.phase, proc.attempt), data)
        proc.log_synced, proc.log_synced_at = len(data), time.monotonic()

    def sync_log(self, proc: _Proc) -> None:
        """Copy a running child's log to the store when it grew and the last copy is old enough: so
        `whale logs` follows a run from another machine (on this one it reads the file itself)."""
        if time.monotonic() - proc.log_synced_at < self.log_sync_interval_s:
            return
        try:
            size = proc.log_path.stat().st_size
        except OSError:
            return
        if size != proc.log_synced:
            self.collect_log(proc)
        else:
            proc.log_synced_at = time.monotonic()

    def child_ended(self, proc: _Proc) -> None:
        """Its log in full to the store, and its end in the child record (when it is still the latest)."""
        proc.close_watch()
        self.collect_log(proc)
        if proc.record is not None and proc.record.ended_at is None:
            proc.record = proc.record.model_copy(update={"ended_at": utc_now()})
            latest = max(self.procs.values(), key=lambda p: p.started)
            if latest is proc:
                write_child(self.store, self.name, proc.record)

    def let_children_exit(self, finished_logs: set[tuple[str, int]]) -> None:
        """The run is done, so a child still running has written its result and is shutting down: let it
        end by itself (its log then ends as it should, not with a SIGTERM) before :meth:`stop_all`."""
        for proc in self.procs.values():
            if (
                proc.popen.poll() is None
                and proc._wait(EXIT_WAIT_S)
                and (proc.phase, proc.attempt) not in finished_logs
            ):
                finished_logs.add((proc.phase, proc.attempt))
                self.child_ended(proc)

    def check_stop_request(self, lease: Lease) -> None:
        """Raise :class:`RunStopped` when `whale stop` asked this runner (by its lock owner id) to stop."""
        request = read_stop(self.store, self.name)
        if request is not None and request.owner == lease.holder.owner:
            raise RunStopped(request)

    def view(self, status: WhaleRunStatus) -> None:
        """Tell ``on_view`` the status and the running child's metrics and progress (throttled)."""
        if self.on_view is None:
            return
        proc = self.running()
        phase = proc.phase if proc is not None else None
        last_at, last_phase, last_status = self._last_view
        now = time.monotonic()
        if now - last_at < self.view_interval_s and phase == last_phase and status == last_status:
            return
        self._last_view = (now, phase, status)
        child = None
        if proc is not None and proc.request is not None:
            obs = self._last_obs
            if obs is not None and proc.phase in obs.metrics:
                metrics = obs.metrics[proc.phase]
            else:
                metrics = self.observer.read_metrics(proc.phase)
            raw = self.store.read_json_or_none(layout.progress_key(self.name, proc.phase))
            try:
                progress = PhaseProgress.model_validate(raw) if raw is not None else None
            except ValidationError:
                log.warning("ignoring an unreadable progress object of %s", proc.phase)
                progress = None
            child = ChildView(proc.request, proc.started, tuple(metrics), progress)
        try:
            self.on_view(RunnerView(status, child))
        except Exception:
            log.exception("the progress display failed; the run goes on without it")
            self.on_view = None

    def apply(self, decision: Transition) -> RunEnd | None:
        """Carry out the shared plan (:func:`whale.control.planner.plan`); returns why the loop should end.
        The serving target is not written: in-process inference loads the checkpoint each phase is given."""
        running = {proc.phase for proc in self.procs.values() if proc.popen.poll() is None}
        step = plan(decision, running)
        for stop in step.stops:
            write_stop(self.store, self.name, stop)
        if step.end is RunEnd.SUSPENDED:
            self.stop_all(step.end_reason)
        if step.start is not None and step.start.phase not in running:
            self.launch(step.start)
        return step.end

    def stop_all(self, reason: str) -> None:
        for proc in self.procs.values():
            if proc.popen.poll() is None:
                proc.terminate(reason)
                try:
                    self.child_ended(proc)
                except StoreError as exc:
                    log.warning("could not store the log of %s: %s", proc.phase, exc)

    # --- the loop ---
    def run(self, max_seconds: float | None = None, *, retry: bool = False) -> WhaleRunStatus:
        """Hold the run lock, then drive the run until it ends, fails or is suspended (or ``max_seconds``
        pass). ``retry``: a Failed run is put back to Running first (:func:`retry_status`)."""
        self.workdir.mkdir(parents=True, exist_ok=True)
        holder = this_process(f"whale run {self.name}")
        try:
            lease = self.store.acquire_lease(layout.lock_key(self.name), holder, self.lease_ttl_s)
        except LeaseHeld as exc:
            raise RunLockedError(
                f"run {self.name!r} is already being run by {exc.info.describe()} (lock {exc.info.uri}); "
                "stop that runner (or let it finish) before starting another",
                exc.info,
            ) from None
        with lease.keep_alive():
            self.lease = lease
            try:
                return self._run_locked(lease, max_seconds, retry)
            finally:
                self.stop_all("runner exiting")  # nothing is left running on a normal return; a safety net
                for proc in self.procs.values():
                    proc.close_watch()
                self.lease = None

    def _run_locked(self, lease: Lease, max_seconds: float | None, retry: bool) -> WhaleRunStatus:
        self.claim()
        status = self.load_status()
        if retry and status.phase is RunPhase.FAILED:
            status = retry_status(status)
            self.save_status(status)
            log.warning("run %s: %s", self.name, status.message)
        stale = read_stop(self.store, self.name)
        if stale is not None and stale.owner != lease.holder.owner:  # addressed to an earlier runner
            self.store.delete(layout.stop_request_key(self.name))
        if status.phase.is_terminal():
            return status
        resumed = clear_interrupted(status)
        if resumed != status:
            status = resumed
            self.save_status(status)
        deadline = time.monotonic() + max_seconds if max_seconds else None
        finished_logs: set[tuple[str, int]] = set()
        try:
            while True:
                lease.check()
                self.check_stop_request(lease)
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
                        self.child_ended(proc)
                    elif proc.popen.poll() is None:
                        self.sync_log(proc)
                self.view(status)
                if outcome is not None or status.phase.is_terminal():
                    if outcome is RunEnd.FINISHED:
                        self.let_children_exit(finished_logs)
                        pruned = prune_checkpoints(
                            self.store, self.name, status, self.spec.experiment.rsft.keep_checkpoints
                        )
                        if pruned:
                            log.info(
                                "run %s: deleted the checkpoints of steps %s (rsft.keepCheckpoints)", self.name, pruned
                            )
                    return status
                if deadline is not None and time.monotonic() > deadline:
                    raise RunTimeout(
                        f"run {self.name} did not finish within {max_seconds:g} s; its status is saved, "
                        f"run `{self.resume_hint}` to resume"
                    )
                current = self.running()
                if current is not None:
                    try:
                        current.popen.wait(timeout=self.poll_interval_s)
                    except subprocess.TimeoutExpired:
                        pass
                elif not decision.of_type(StartPhase):
                    # Nothing running and nothing to start: only a store that changes under us moves on.
                    time.sleep(self.poll_interval_s)
        except BaseException as exc:
            with _shielded():
                self.stop_all("runner interrupted")
                if isinstance(exc, LeaseLost):
                    log.error("run %s: %s; the status is left to the runner that holds the lock now", self.name, exc)
                else:
                    reason, what = interruption(exc, max_seconds)
                    status = mark_interrupted(status, reason, what, self.resume_hint, utc_now())
                    try:
                        self.save_status(status)
                        if isinstance(exc, RunStopped):  # done: the next runner must not see it
                            self.store.delete(layout.stop_request_key(self.name))
                    except StoreError as save_exc:
                        log.error("run %s: could not save the interrupted status: %s", self.name, save_exc)
            raise


def status_summary(status: WhaleRunStatus) -> dict[str, Any]:
    """The fields a person looks at first (the CLI prints these)."""
    best = status.best
    stalled = RunState.from_status(status).stalled()
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
        "final": f"{status.final.mean_at_k:.4f} (mean@{status.final.k}, {status.final.phase})"
        if status.final
        else None,
        "rolloutsSpent": status.rollouts_spent,
        "emptySteps": (
            f"{status.empty_steps} RSFT step(s) kept no trajectory (last: step {status.last_empty_step}); "
            "SFT skipped, the weights did not move"
            if status.empty_steps
            else None
        ),
        "interrupted": interrupted(status) is not None,
        "stalled": stalled.message if stalled is not None and stalled.status == "True" else None,
        "message": status.message,
    }
