"""`whale list`: the runs of a store, one row each — phase, what runs now, best, rollouts, age, runner, disk use.

Reads per run its status, its lock and the runner's child record (three small objects) and lists its objects'
sizes (the disk use), for at most
:data:`MAX_LISTED_RUNS` runs (the rest are counted), so a listing stays bounded on a large bucket.
"""

from __future__ import annotations

import dataclasses
from datetime import datetime
from typing import Any

from pydantic import ValidationError

from whale.console.progress import duration
from whale.core import layout
from whale.core.status import WhaleRunStatus
from whale.report.source import list_runs
from whale.runner.control import read_child
from whale.store import Store
from whale.store.lease import parse_iso

#: rows `whale list` reads and shows; more runs are counted, not read
MAX_LISTED_RUNS = 200


@dataclasses.dataclass(frozen=True)
class RunRow:
    name: str
    phase: str
    #: what runs now ("c02-weight step 5/8"), or why nothing does
    now: str
    #: best mean@k and its k: "0.5391 @4"
    best: str
    rollouts: int | None
    started_at: str | None
    age: str
    #: the live lock holder, or "-"
    runner: str
    #: bytes the run takes in the store (checkpoints, traces, logs), None: not read
    disk_bytes: int | None = None

    def to_wire(self) -> dict[str, Any]:
        return {
            "diskBytes": self.disk_bytes,
            "name": self.name,
            "phase": self.phase,
            "now": self.now,
            "best": self.best,
            "rollouts": self.rollouts,
            "startedAt": self.started_at,
            "age": self.age,
            "runner": self.runner,
        }


def run_names(store: Store) -> list[str]:
    """Every run of the store (a folder under ``runs/`` with a spec.json), sorted."""
    return list_runs(store)


def size_words(n: int | None) -> str:
    """``812 B``, ``4.2 MB``, ``5.1 GB`` (powers of 1000); ``-`` for None."""
    if n is None:
        return "-"
    value, unit = float(n), "B"
    for unit in ("B", "kB", "MB", "GB", "TB"):
        if value < 1000 or unit == "TB":
            break
        value /= 1000
    return f"{n} B" if unit == "B" else f"{value:.1f} {unit}"


def run_row(store: Store, name: str, now: datetime) -> RunRow:
    return dataclasses.replace(_row(store, name, now), disk_bytes=store.usage(layout.run_prefix(name)))


def _row(store: Store, name: str, now: datetime) -> RunRow:
    raw = store.read_json_or_none(layout.status_key(name))
    try:
        status = WhaleRunStatus.model_validate(raw) if raw is not None else None
    except ValidationError:
        status = None
    lock = store.read_lease(layout.lock_key(name))
    live = lock is not None and lock.live and lock.holder is not None
    runner = f"pid {lock.holder.pid} on {lock.holder.host}" if lock is not None and live and lock.holder else "-"
    if status is None:
        return RunRow(name, "Pending" if raw is None else "unreadable", "-", "-", None, None, "-", runner)
    best = f"{status.best.mean_at_k:.4f} @{status.best.k}" if status.best else "-"
    age = "-"
    if status.start_time:
        try:
            age = duration(now.timestamp() - parse_iso(status.start_time))
        except ValueError:
            age = "-"
    return RunRow(
        name,
        status.phase.value,
        _now(store, name, status, live),
        best,
        status.rollouts_spent,
        status.start_time,
        age,
        runner,
    )


def _now(store: Store, name: str, status: WhaleRunStatus, live: bool) -> str:
    if status.phase.is_terminal():
        return status.stage.value if status.stage else "-"
    if not live:
        interrupted = next((c for c in status.conditions if c.type == "Interrupted" and c.status == "True"), None)
        return f"not running (interrupted: {interrupted.reason})" if interrupted else "not running"
    child = read_child(store, name)
    if child is not None and child.ended_at is None:
        where = child.phase
    else:
        where = status.active_phase or (status.stage.value if status.stage else "-")
    if where == status.active_phase and status.total_steps and where.endswith("-weight"):
        where += f" step {status.step}/{status.total_steps}"
    elif where == status.active_phase and where.endswith("-harness"):
        where += f" iteration {status.iteration}"
    return where


def run_rows(store: Store, now: datetime) -> tuple[list[RunRow], int]:
    """(rows of the first :data:`MAX_LISTED_RUNS` runs, how many more there are)."""
    names = run_names(store)
    return [run_row(store, name, now) for name in names[:MAX_LISTED_RUNS]], max(0, len(names) - MAX_LISTED_RUNS)
