"""Leases: one live holder of a store key at a time. The local runner's run lock (``layout.lock_key``).

Why: a run must never have two controllers writing it — a second ``whale run`` of the same run, or a
new one next to a workload that a killed runner left behind. Each backend holds a lease the strongest
way it can (``docs/storage.md``, "The run lock"):

* folder store: an exclusive ``flock(2)`` on the lock file, held by the runner and inherited by every
  workload supervisor it starts, so the lock lives exactly as long as the last process of the run and
  a crash (even SIGKILL) releases it; the file holds the holder's JSON, for messages only;
* S3: the lock object holds the holder's JSON and an expiry; it is taken with a conditional write
  (``If-None-Match: *``), renewed every ``ttl/3`` with ``If-Match`` on its ETag, released with a
  conditional delete, and stolen only when it has expired (or its process is provably gone: same
  machine, pid not running). A holder that cannot renew in time treats the lease as lost.

The holder record names the process (pid, host, start time) so a refusal can say who holds the run.
"""

from __future__ import annotations

import abc
import contextlib
import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any

from whale.store.base import StoreError

log = logging.getLogger(__name__)

#: lease lifetime on S3 without a renewal; renewed every third of it
DEFAULT_TTL_S = 60.0
#: the environment variable through which the local runner tells its workloads the owner id of the run lock
RUN_OWNER_ENV = "WHALE_RUN_OWNER"


def iso(t: float, *, ms: bool = False) -> str:
    """UTC ISO 8601; ``ms`` keeps milliseconds (an expiry rounded down to the second would end early)."""
    text = datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%dT%H:%M:%S.%f" if ms else "%Y-%m-%dT%H:%M:%S")
    return (text[:-3] if ms else text) + "Z"


def parse_iso(text: str) -> float:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def machine_id() -> str:
    """Where a pid means a process: this boot of this kernel, this pid namespace ('' when unknown)."""
    try:
        with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as fh:
            boot = fh.read().strip()
        return f"{boot}/{os.readlink('/proc/self/ns/pid')}"
    except OSError:
        return ""


def process_start(pid: int) -> int | None:
    """The start time of ``pid`` in clock ticks since boot (tells a reused pid apart), None if gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            stat = fh.read()
    except OSError:
        return None
    fields = stat[stat.rfind(b")") + 2 :].split()
    return int(fields[19]) if len(fields) > 19 else None


@dataclass(frozen=True)
class LeaseHolder:
    """Who holds (or held) a lease. Serialised camelCase into the lock object."""

    owner: str  #: random id; the runner passes it to its workloads as ``WHALE_RUN_OWNER``
    purpose: str  #: e.g. "whale run r1"
    pid: int
    host: str
    machine: str  #: :func:`machine_id` of the holder: where ``pid`` can be checked
    pid_start: int | None
    started_at: str
    expires_at: str | None = None  #: S3 only: the holder renews it
    ttl_s: float | None = None

    def to_wire(self) -> dict[str, Any]:
        return {
            "owner": self.owner,
            "purpose": self.purpose,
            "pid": self.pid,
            "host": self.host,
            "machine": self.machine,
            "pidStart": self.pid_start,
            "startedAt": self.started_at,
            "expiresAt": self.expires_at,
            "ttlSeconds": self.ttl_s,
        }

    @classmethod
    def from_wire(cls, raw: dict[str, Any]) -> LeaseHolder:
        return cls(
            owner=str(raw["owner"]),
            purpose=str(raw.get("purpose", "")),
            pid=int(raw["pid"]),
            host=str(raw.get("host", "?")),
            machine=str(raw.get("machine", "")),
            pid_start=raw.get("pidStart"),
            started_at=str(raw.get("startedAt", "?")),
            expires_at=raw.get("expiresAt"),
            ttl_s=raw.get("ttlSeconds"),
        )

    def renewed(self, now: float, ttl_s: float) -> LeaseHolder:
        return replace(self, expires_at=iso(now + ttl_s, ms=True), ttl_s=ttl_s)

    def expired(self, now: float) -> bool:
        return self.expires_at is not None and parse_iso(self.expires_at) <= now

    def process_alive(self) -> bool | None:
        """Whether the holder's process still runs; None when it lives elsewhere (cannot tell)."""
        if not self.machine or self.machine != machine_id():
            return None
        start = process_start(self.pid)
        return start is not None and (self.pid_start is None or start == self.pid_start)

    def describe(self) -> str:
        text = f"pid {self.pid} on host {self.host} ({self.purpose}), started {self.started_at}"
        return text + (f", lease expires {self.expires_at}" if self.expires_at else "")


def this_process(purpose: str, clock: Callable[[], float] = time.time) -> LeaseHolder:
    """A holder record for the calling process, with a fresh owner id."""
    pid = os.getpid()
    return LeaseHolder(
        owner=uuid.uuid4().hex,
        purpose=purpose,
        pid=pid,
        host=socket.gethostname(),
        machine=machine_id(),
        pid_start=process_start(pid),
        started_at=iso(clock()),
    )


@dataclass(frozen=True)
class LeaseInfo:
    """What a reader sees of a lease: its holder (None when unreadable or released) and whether it is live."""

    uri: str
    holder: LeaseHolder | None
    live: bool
    note: str = ""

    def describe(self) -> str:
        who = self.holder.describe() if self.holder else "an unknown holder"
        return f"{who}{'; ' + self.note if self.note else ''}"


class LeaseHeld(StoreError):
    """Another live holder has the lease; the message names it."""

    def __init__(self, message: str, info: LeaseInfo):
        self.info = info
        super().__init__(message)


class LeaseLost(StoreError):
    """This process no longer holds its lease (taken over after it expired, or not renewed in time)."""


class Lease(abc.ABC):
    """A held lease. Release it (or let the process end) to let another holder in."""

    key: str
    uri: str
    holder: LeaseHolder
    #: seconds between renewals; None when the lease needs none (flock)
    renew_interval_s: float | None = None
    #: descriptors a child must inherit to share the lease (flock); () for none
    inherit_fds: tuple[int, ...] = ()

    @abc.abstractmethod
    def check(self) -> None:
        """Raise :class:`LeaseLost` when the lease is no longer ours (cheap; call it often)."""

    @abc.abstractmethod
    def renew(self) -> None:
        """Extend the lease; :class:`LeaseLost` when another holder took it."""

    @abc.abstractmethod
    def release(self) -> None:
        """Give the lease up (idempotent); a lease another holder took is left alone."""

    @contextlib.contextmanager
    def keep_alive(self) -> Iterator[Lease]:
        """Renew in a background thread while the block runs; release at its end."""
        stop = threading.Event()
        thread = None
        if self.renew_interval_s is not None:
            interval = self.renew_interval_s

            def loop() -> None:
                while not stop.wait(interval):
                    try:
                        self.renew()
                    except LeaseLost:
                        log.error("lost the lease %s", self.uri)
                        return
                    except StoreError as exc:  # an outage: check() turns it into LeaseLost before expiry
                        log.warning("could not renew the lease %s: %s", self.uri, exc)

            thread = threading.Thread(target=loop, name=f"lease-renewal {self.key}", daemon=True)
            thread.start()
        try:
            yield self
        finally:
            stop.set()
            if thread is not None:
                thread.join(timeout=5.0)  # a renewal stuck in a slow request is a daemon: release wins anyway
            try:
                self.release()
            except StoreError as exc:  # the store is away: an S3 lease then ends by itself at its expiry
                log.warning("could not release the lease %s: %s", self.uri, exc)
