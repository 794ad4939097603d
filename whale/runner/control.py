"""What the CLI and the local runner tell each other through the store, beside the status and the run lock.

Both go through the store, so they work the same on a folder and on S3, from this machine or another:

* ``control/child.json`` (:class:`ChildRecord`, written by the runner): its latest child — phase, attempt,
  the log file on the runner's host, when it started and ended. `whale logs` follows that log (the file
  itself on the runner's host, else the copy the runner keeps in the store) and `whale list` shows the
  phase running now; it means "running now" only while the run lock is live.
* ``control/stop.json`` (:class:`StopRequest`, written by `whale stop`): asks the runner that holds the
  lock — named by its owner id, so a request can never stop a later runner — to stop its children and
  save the status as interrupted (``reason: StopRequested``), resumable with `whale run FILE`. The runner
  polls it between decisions and deletes it when it has stopped.
"""

from __future__ import annotations

import os
import socket

from pydantic import BaseModel, ConfigDict
from pydantic.alias_generators import to_camel

from whale.core import layout
from whale.core.protocol import PhaseKind
from whale.store import Store
from whale.store.lease import LeaseInfo


class _Wire(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="ignore", frozen=True)

    def to_wire(self) -> dict[str, object]:
        return self.model_dump(mode="json", by_alias=True)


class ChildRecord(_Wire):
    """The local runner's latest child (``layout.child_key``)."""

    phase: str
    kind: PhaseKind
    attempt: int
    #: the runner's host, where ``log`` is a file
    host: str
    #: the workload's output on the runner's host; the store keeps a copy (``layout.log_key``)
    log: str
    started_at: str
    ended_at: str | None = None


class StopRequest(_Wire):
    """`whale stop`: addressed to one runner by its lock owner id."""

    owner: str
    requested_at: str
    #: who asked: "pid N on host H"
    by: str

    def describe(self) -> str:
        return f"`whale stop` ({self.by}, at {self.requested_at})"


def read_child(store: Store, run: str) -> ChildRecord | None:
    raw = store.read_json_or_none(layout.child_key(run))
    return ChildRecord.model_validate(raw) if raw is not None else None


def write_child(store: Store, run: str, child: ChildRecord) -> None:
    store.write_json(layout.child_key(run), child.to_wire())


def read_stop(store: Store, run: str) -> StopRequest | None:
    raw = store.read_json_or_none(layout.stop_request_key(run))
    return StopRequest.model_validate(raw) if raw is not None else None


def request_stop(store: Store, run: str, now: str) -> LeaseInfo | None:
    """Ask the runner that holds ``run``'s lock to stop; the lock it was addressed to, or None when no
    live runner holds the lock (nothing to stop, nothing written)."""
    info = store.read_lease(layout.lock_key(run))
    if info is None or not info.live or info.holder is None:
        return None
    request = StopRequest(
        owner=info.holder.owner, requested_at=now, by=f"pid {os.getpid()} on host {socket.gethostname()}"
    )
    store.write_json(layout.stop_request_key(run), request.to_wire())
    return info


class RunBusyError(Exception):
    """The run is being run now; the message names its runner."""


def run_keys(store: Store, run: str) -> list[str]:
    """Every object of the run (its store prefix ``runs/NAME/``), the run lock last."""
    lock = layout.lock_key(run)
    keys = [k for k in store.list(layout.run_prefix(run) + "/") if k != lock]
    return keys + ([lock] if store.exists(lock) else [])


def delete_run(store: Store, run: str, keys: list[str]) -> int:
    """Delete ``keys`` (:func:`run_keys`) while holding the run lock, so no `whale run` drives the run
    meanwhile; the lock itself goes last, after its release. Raises :class:`RunBusyError` naming the runner
    that holds it. The domains' prepared data (``data/``) is shared by runs and stays. Returns the count."""
    from whale.store.lease import LeaseHeld, this_process

    lock = layout.lock_key(run)
    try:
        lease = store.acquire_lease(lock, this_process(f"whale delete {run}"), 60.0)
    except LeaseHeld as exc:
        raise RunBusyError(
            f"run {run!r} is being run now by {exc.info.describe()}; `whale stop {run}` first, then delete it"
        ) from None
    try:
        for key in keys:
            if key != lock:
                store.delete(key)
    finally:
        lease.release()
    store.delete(lock)
    return len(keys)
