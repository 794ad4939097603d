"""The watches of the runs' children (Jobs, JobSets, Deployments, the doorbell ConfigMaps), outside kopf.

kopf keeps the WhaleRuns (their daemons, finalizer, peering). A child's watch event only feeds the informer and wakes
the run that owns it, and kopf's machinery around each event (causes, a logger, the handler's kwargs: about 0.5 ms)
cost several times that; so each child kind (in each watched namespace) has a thread of its own here that lists and
watches as client-go's reflector does:

* list (``labelSelector`` = the operator's ``managed-by`` label), then watch from the list's ``resourceVersion`` with
  ``allowWatchBookmarks`` and ``timeoutSeconds`` (``WHALE_OPERATOR_WATCH_TIMEOUT_S``, kopf's ``server_timeout``);
* a stream that ends, or a connection error, resumes from the last version seen (an event's or a bookmark's), the
  latter after a back-off doubling from :data:`BACKOFF_S` to :data:`MAX_BACKOFF_S`;
* 410 Gone (an ``ERROR`` event or the HTTP status): the version is too old, so list afresh; what the new list lacks
  was deleted meanwhile (forgotten, its run woken) and the informer lists that kind again at its next reads;
* JobSets only while the API server serves them (checked again every :data:`ABSENT_RECHECK_S`).

The pure part (:func:`decide`, :class:`ChildIndex`) says what an event does; :class:`ChildWatches` does the I/O. The
namespaces watched are kopf's (``WHALE_OPERATOR_NAMESPACES``, set from the same value as kopf's ``--namespace``:
:func:`watch_namespaces`).
"""

from __future__ import annotations

import asyncio
import enum
import json
import logging
import re
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from whale_operator import names, observe
from whale_operator.config import backoff_s
from whale_operator.informer import Informer
from whale_operator.kube import KubeClient, KubeError, NotFound, Stream, watch_path
from whale_operator.metrics import OperatorMetrics

log = logging.getLogger(__name__)

#: the children watched, (apiVersion, kind); JobSet only where the API server serves it
KINDS: tuple[tuple[str, str], ...] = (
    ("batch/v1", "Job"),
    (names.JOBSET_API_VERSION, "JobSet"),
    ("apps/v1", "Deployment"),
    ("v1", "ConfigMap"),
)
OPTIONAL = frozenset({"JobSet"})
SELECTOR = f"app.kubernetes.io/managed-by={names.MANAGED_BY}"
DEFAULT_TIMEOUT_S = 300
#: a watch's read waits this much longer than its ``timeoutSeconds`` for a byte before the connection is taken as dead
READ_MARGIN_S = 30.0
BACKOFF_S = 1.0
MAX_BACKOFF_S = 30.0
ABSENT_RECHECK_S = 10.0
#: how long stopping waits for each thread (they end at once: their streams are shut)
JOIN_S = 5.0
_NAMESPACE = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")


def watch_namespaces(env: Mapping[str, str]) -> tuple[str, ...]:
    """``WHALE_OPERATOR_NAMESPACES`` (comma-separated): the namespaces kopf serves (its ``--namespace``); empty or
    unset: every namespace (``--all-namespaces``)."""
    raw = env.get("WHALE_OPERATOR_NAMESPACES", "")
    spaces = tuple(dict.fromkeys(n.strip() for n in raw.split(",") if n.strip()))
    bad = [n for n in spaces if not _NAMESPACE.match(n)]
    if bad:
        raise ValueError(
            f"WHALE_OPERATOR_NAMESPACES: {bad[0]!r} is not a namespace name; give the namespaces kopf serves, "
            "comma-separated (the chart sets it from watchNamespace), or leave it unset for all namespaces"
        )
    return spaces


def watch_timeout_s(env: Mapping[str, str]) -> int:
    """``WHALE_OPERATOR_WATCH_TIMEOUT_S``: how long one watch request lasts (kopf's ``server_timeout`` too)."""
    raw = env.get("WHALE_OPERATOR_WATCH_TIMEOUT_S", str(DEFAULT_TIMEOUT_S))
    if not raw.strip().isdigit() or int(raw) < 1:
        raise ValueError(f"WHALE_OPERATOR_WATCH_TIMEOUT_S must be a whole number of seconds >= 1, not {raw!r}")
    return int(raw)


# --- pure: what an event does ---
class Step(enum.Enum):
    APPLY = "apply"  # a child's version (ADDED, MODIFIED, DELETED): to the informer, maybe a wake
    BOOKMARK = "bookmark"  # only a version to resume from
    EXPIRED = "expired"  # 410 Gone: list afresh
    FAILED = "failed"  # another ERROR: watch again from the last version, after a back-off


@dataclass(frozen=True)
class Decision:
    step: Step
    #: where the next watch resumes ("" : where it would have)
    resource_version: str = ""
    message: str = ""


def decide(event: Mapping[str, Any]) -> Decision:
    """What one watch event does to the watch (not to the runs: :class:`ChildIndex`)."""
    kind = event.get("type")
    obj = event.get("object") or {}
    version = str((obj.get("metadata") or {}).get("resourceVersion") or "")
    if kind in ("ADDED", "MODIFIED", "DELETED"):
        return Decision(Step.APPLY, version)
    if kind == "BOOKMARK":
        return Decision(Step.BOOKMARK, version)
    if kind == "ERROR" and obj.get("code") == 410:
        return Decision(Step.EXPIRED, message=str(obj.get("message", "")))
    return Decision(Step.FAILED, message=f"{kind}: {obj.get('message', obj)}"[:300])


@dataclass(frozen=True)
class Seen:
    """A child as last seen: what a reconcile reads of it (:func:`~whale_operator.observe.wake_digest`) and its runs."""

    namespace: str
    name: str
    digest: str | None
    owners: tuple[str, ...]


def owners(body: Mapping[str, Any]) -> tuple[str, ...]:
    """The UIDs of the WhaleRuns that own a child."""
    refs = (body.get("metadata") or {}).get("ownerReferences") or []
    return tuple(r["uid"] for r in refs if r.get("kind") == "WhaleRun" and r.get("uid"))


class ChildIndex:
    """The children of one watch by UID, as last seen: which event wakes which run (one thread uses it).

    Every wake is a reconcile, and with hundreds of runs the reconciles of changes that matter wait behind the rest:
    an event that leaves what a reconcile reads unchanged wakes nothing, and neither does a child with nothing to
    read yet (the reconcile that made it knows it is there); a deletion always wakes."""

    def __init__(self) -> None:
        self.seen: dict[str, Seen] = {}

    def apply(self, event: str, body: Mapping[str, Any]) -> tuple[str, ...]:
        """The runs to wake for one event of a child."""
        meta = body.get("metadata") or {}
        uid = meta.get("uid", "")
        if event == "DELETED":
            self.seen.pop(uid, None)
            return owners(body)
        digest = observe.wake_digest(body)
        held = self.seen.get(uid)
        if held is not None and held.digest == digest:
            return ()
        self.seen[uid] = Seen(meta.get("namespace", ""), meta.get("name", ""), digest, owners(body))
        return () if digest is None else owners(body)

    def missing(self, listed: Iterable[Mapping[str, Any]]) -> list[Seen]:
        """After a list: the children held that it lacks (deleted while the watch was away), forgotten."""
        there = {(o.get("metadata") or {}).get("uid") for o in listed}
        gone = [uid for uid in self.seen if uid not in there]
        return [self.seen.pop(uid) for uid in gone]


# --- I/O: the threads ---
@dataclass(frozen=True)
class Target:
    """One watch: a kind in one namespace (``None``: all)."""

    api_version: str
    kind: str
    namespace: str | None

    @property
    def label(self) -> str:
        return f"{self.kind}/{self.namespace or '*'}"


class Expired(Exception):
    """The watch's version is too old (410 Gone): list afresh."""


class ChildWatch:
    """One target's list+watch loop, in a thread of its own. Each child event goes to the informer here (thread-safe),
    and the runs it wakes to ``wake`` on the event loop, where the daemons' events live."""

    def __init__(
        self,
        target: Target,
        kube: KubeClient,
        informer: Informer,
        metrics: OperatorMetrics,
        wake: Callable[[tuple[str, ...]], None],
        loop: asyncio.AbstractEventLoop,
        timeout_s: int,
    ):
        self.target, self.kube, self.informer, self.metrics = target, kube, informer, metrics
        self.wake, self.loop, self.timeout_s = wake, loop, timeout_s
        self.index = ChildIndex()
        self.stopping = threading.Event()
        self._lock = threading.Lock()
        self._stream: Stream | None = None
        #: runs to wake at the event loop's next turn: one hand-off for every wake until then, not one each
        self._pending: set[str] = set()
        self._events = metrics.watch_events.labels(kind=target.kind)
        self._cpu = metrics.watch_cpu.labels(kind=target.kind)
        self._cpu_at = 0.0
        self.thread = threading.Thread(target=self._run, name=f"watch-{target.label}", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        """Ask the thread to end and shut its stream (the read blocked in it returns at once)."""
        self.stopping.set()
        with self._lock:
            stream = self._stream
        if stream is not None:
            stream.shutdown()

    def _run(self) -> None:
        self._cpu_at = time.thread_time()
        version = ""  # "": list first
        failures = 0
        while not self.stopping.is_set():
            try:
                if not version:
                    listed = self._list()
                    if listed is None:  # an optional kind the API server does not serve (yet)
                        self.stopping.wait(ABSENT_RECHECK_S)
                        continue
                    version = listed
                version = self._watch(version)
                failures = 0
            except Expired as exc:
                self.metrics.watch_restarts.labels(kind=self.target.kind, reason="expired").inc()
                log.info("watch of %s expired (%s): listing afresh", self.target.label, exc)
                version = ""
            except Exception as exc:  # noqa: BLE001 - every failure is a restart, counted: the thread never dies
                if self.stopping.is_set():
                    break
                failures += 1
                if isinstance(exc, NotFound):  # the kind's API went away (a CRD deleted): list it again
                    version = ""
                self.metrics.watch_restarts.labels(kind=self.target.kind, reason=type(exc).__name__).inc()
                delay = backoff_s(failures, BACKOFF_S, MAX_BACKOFF_S)
                log.warning("watch of %s failed (%s); again in %.0f s", self.target.label, exc, delay)
                self.stopping.wait(delay)

    def _path(self) -> str:
        return watch_path(self.target.api_version, self.target.kind, self.target.namespace)

    def _list(self) -> str | None:
        """List and take in every child; the list's version (None: the API server does not serve an optional kind)."""
        try:
            answer = self.kube.request("GET", self._path(), query={"labelSelector": SELECTOR})
        except NotFound:
            if self.target.kind in OPTIONAL:
                return None
            raise
        items = list(answer.get("items") or [])
        at = str((answer.get("metadata") or {}).get("resourceVersion") or "")
        self.informer.expire((self.target.api_version, self.target.kind))
        for gone in self.index.missing(items):  # deleted while the watch was away: gone by the list's version
            meta = {"namespace": gone.namespace, "name": gone.name, "resourceVersion": at}
            self.informer.observe({"kind": self.target.kind, "metadata": meta}, deleted=True)
            self._wake(gone.owners)
        for obj in items:
            self._apply("ADDED", {"kind": self.target.kind, "apiVersion": self.target.api_version, **obj})
        self._account()
        return at

    def _watch(self, version: str) -> str:
        """One watch request from ``version``; the version to resume from once its stream ends."""
        query = {
            "watch": "true",
            "labelSelector": SELECTOR,
            "allowWatchBookmarks": "true",
            "timeoutSeconds": str(self.timeout_s),
            "resourceVersion": version,
        }
        try:
            stream = self.kube.stream(self._path(), query, self.timeout_s + READ_MARGIN_S)
        except KubeError as exc:
            if exc.status == 410:
                raise Expired(exc.message) from None
            raise
        with self._lock:
            self._stream = stream
        try:
            if self.stopping.is_set():
                return version
            for line in stream.lines():
                event = json.loads(line)
                decision = decide(event)
                if decision.step is Step.EXPIRED:
                    raise Expired(decision.message)
                if decision.step is Step.FAILED:
                    raise KubeError(500, decision.message)
                if decision.step is Step.APPLY:
                    self._apply(event["type"], event["object"])
                version = decision.resource_version or version
                self._account()
        finally:
            with self._lock:
                self._stream = None
            stream.close()
        return version

    def _account(self) -> None:
        """This thread's CPU since the last account, to ``whale_operator_watch_cpu_seconds``."""
        now = time.thread_time()
        self._cpu.inc(now - self._cpu_at)
        self._cpu_at = now

    def _apply(self, event: str, body: dict[str, Any]) -> None:
        self._events.inc()
        # first: the reconcile it wakes reads this version
        self.informer.observe(body, deleted=event == "DELETED", watched=True)
        self._wake(self.index.apply(event, body))

    def _wake(self, runs: tuple[str, ...]) -> None:
        if not runs:
            return
        with self._lock:
            scheduled = bool(self._pending)
            self._pending.update(runs)
        if not scheduled and not self.loop.is_closed():
            self.loop.call_soon_threadsafe(self._flush)

    def _flush(self) -> None:
        """On the event loop: wake every run the events since the last hand-off asked for."""
        with self._lock:
            runs, self._pending = tuple(self._pending), set()
        self.wake(runs)


class ChildWatches:
    """Every child watch of the operator: started at its start-up, stopped at its exit (by the task that holds them:
    :func:`whale_operator.handlers.hold_watches`)."""

    def __init__(self, watches: list[ChildWatch]):
        self.watches = watches

    @classmethod
    def build(
        cls,
        kube: KubeClient,
        informer: Informer,
        metrics: OperatorMetrics,
        wake: Callable[[tuple[str, ...]], None],
        loop: asyncio.AbstractEventLoop,
        env: Mapping[str, str],
    ) -> ChildWatches:
        timeout = watch_timeout_s(env)
        spaces: tuple[str | None, ...] = watch_namespaces(env) or (None,)
        return cls(
            [
                ChildWatch(Target(api_version, kind, ns), kube, informer, metrics, wake, loop, timeout)
                for api_version, kind in KINDS
                for ns in spaces
            ]
        )

    def start(self) -> None:
        for watch in self.watches:
            watch.start()

    def stop(self) -> None:
        for watch in self.watches:
            watch.stop()
        for watch in self.watches:
            watch.thread.join(JOIN_S)
            if watch.thread.is_alive():
                log.warning("the watch of %s did not stop within %.0f s", watch.target.label, JOIN_S)
