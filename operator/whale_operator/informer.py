"""What a reconcile reads of Kubernetes: the WhaleRun, its phase children (Jobs, JobSets) and its Deployments.

Two sources with one interface:

* :class:`ApiReads` asks the API server every time (a :class:`~whale_operator.reconcile.Reconciler` driven by
  hand, with no watch feeding it);
* :class:`Informer` keeps them in memory, fed by the watch events kopf already receives (the handlers call
  :meth:`Informer.observe` before they wake the run) and by the API server's answers to the operator's own writes
  (:attr:`~whale_operator.kube.KubeClient.on_write`), so the next reconcile sees its own writes even before their
  events arrive. Of two versions of an object the newer ``resourceVersion`` wins. The children of one kind are listed
  once per namespace (one list for every run there: the first reconcile that asks, and every :data:`RELIST_S` as a
  safety net for a lost event), a run's own after a reconcile of it failed; a WhaleRun a watch event brought is
  read. Every other reconcile reads them from memory, asking the API server nothing: with 200 new runs, 2 lists in
  place of 600 requests.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from whale.core.spec import API_GROUP, API_VERSION
from whale_operator import names
from whale_operator.kube import KubeClient, collection_path

#: the kinds a reconcile reads, by (apiVersion, kind)
RUN = (f"{API_GROUP}/{API_VERSION}", "WhaleRun")
JOB = ("batch/v1", "Job")
JOBSET = (names.JOBSET_API_VERSION, "JobSet")
DEPLOYMENT = ("apps/v1", "Deployment")
TRACKED = frozenset(kind for _, kind in (RUN, JOB, JOBSET, DEPLOYMENT))
#: how long a run's children listed once are trusted to be kept current by the watch events alone
RELIST_S = 300.0

Key = tuple[str, str, str]  # (kind, namespace, name)
#: the children whose pod templates the informer drops (:func:`slim`)
TEMPLATED = frozenset(kind for _, kind in (JOB, JOBSET, DEPLOYMENT))


def slim(body: Mapping[str, Any]) -> dict[str, Any]:
    """``body`` as the informer holds it: a child without what no reconcile reads of it, its pod template (a Job's, a
    Deployment's, each of a JobSet's replicated Jobs'), and without the API server's field-ownership record
    (``metadata.managedFields``) on any kind. A reconcile reads a child's metadata, its status, a Job's ``suspend`` and
    a Deployment's ``replicas`` (:func:`~whale_operator.observe.wake_digest` lists them); it builds templates from the spec and
    sends them whole, never from what it holds. The templates were two thirds of the containers the informer held at
    201 runs (each a dict or a list the garbage collector's full passes walk), and a run keeps its finished Jobs: the
    informer grows with the runs' length. A shallow copy: the parts kept are shared, never changed in place."""
    out = dict(body)
    meta = body.get("metadata")
    if isinstance(meta, Mapping) and "managedFields" in meta:
        out["metadata"] = {k: v for k, v in meta.items() if k != "managedFields"}
    spec = body.get("spec")
    if body.get("kind") not in TEMPLATED or not isinstance(spec, Mapping):
        return out
    if "template" in spec:
        out["spec"] = {k: v for k, v in spec.items() if k != "template"}
    elif isinstance(spec.get("replicatedJobs"), list):  # a JobSet: its replicated Jobs' names and counts
        out["spec"] = {
            **spec,
            "replicatedJobs": [
                {k: v for k, v in rjob.items() if k != "template"} if isinstance(rjob, Mapping) else rjob
                for rjob in spec["replicatedJobs"]
            ],
        }
    return out


class ApiReads:
    """The reads of a reconcile, each a request to the API server."""

    def __init__(self, kube: KubeClient):
        self.kube = kube

    def run(self, namespace: str, name: str) -> dict[str, Any] | None:
        """The WhaleRun (None: gone)."""
        return self.kube.get_run(namespace, name)

    def children(self, kind: tuple[str, str], namespace: str, run: str) -> list[dict[str, Any]]:
        """The run's children of one kind (``whale.dev/run=<run>``, made by the operator)."""
        return self.kube.list(*kind, namespace, names.run_selector(run))

    def relist(self, namespace: str, run: str) -> None:
        """The next reads of the run come from the API server (nothing is held here: they always do)."""

    def forget(self, namespace: str, run: str) -> None:
        """The run is gone: drop what is held for it (nothing here)."""


def _newer(incoming: Mapping[str, Any], held: Mapping[str, Any] | None) -> bool:
    """``incoming`` is at least as new as ``held`` (resourceVersions compared as numbers, as etcd's are; one that is
    not a number is taken as newer: the API server's latest word)."""
    if held is None:
        return True
    new = str((incoming.get("metadata") or {}).get("resourceVersion", ""))
    old = str((held.get("metadata") or {}).get("resourceVersion", ""))
    if new.isdigit() and old.isdigit():
        return int(new) >= int(old)
    return True


class Informer(ApiReads):
    """The objects a reconcile reads, held in memory and kept current by watch events (thread-safe: events come on
    kopf's event loop, reads and write answers on the reconciles' worker threads). Objects are replaced whole, never
    changed in place: a reader may keep what it got. Children are held without their pod templates (:func:`slim`)."""

    def __init__(self, kube: KubeClient, clock: Callable[[], float] = time.monotonic):
        super().__init__(kube)
        self.clock = clock
        self._lock = threading.Lock()
        self._objects: dict[Key, dict[str, Any]] = {}
        #: (kind, namespace, run label) -> names of the run's children of that kind
        self._by_run: dict[Key, set[str]] = {}
        #: what :meth:`_held` answers for a key, made at a read and dropped when one of its objects changes (a run
        #: keeps its finished Jobs: sorting and gathering them at every read grew with the run's length)
        self._held_lists: dict[Key, list[dict[str, Any]]] = {}
        #: (kind, namespace, run) -> when the run's children of that kind were last listed (RUN: the object read, by a
        #: request or a watch event)
        self._listed: dict[Key, float] = {}
        #: (kind, namespace) -> when the operator's children of that kind in the namespace were last listed
        self._ns_listed: dict[tuple[str, str], float] = {}
        #: (kind, namespace, run) to list on their own, not from a namespace's list (:meth:`relist`)
        self._stale: set[Key] = set()
        #: objects deleted, by key -> the resourceVersion of their deletion: a late answer must not bring one back
        self._gone: dict[Key, str] = {}

    # --- feeding ---
    def observe(self, body: Mapping[str, Any], deleted: bool = False, watched: bool = False) -> None:
        """One version of an object (a watch event, or the answer to a write); ``deleted``: a DELETED event;
        ``watched``: a watch event, the API server's word as it stands (a WhaleRun so brought needs no read)."""
        kind = body.get("kind")
        meta = body.get("metadata") or {}
        if kind not in TRACKED or not meta.get("name") or not meta.get("namespace"):
            return
        key = (str(kind), meta["namespace"], meta["name"])
        with self._lock:
            held = self._objects.get(key)
            if not _newer(body, held):
                return
            gone = self._gone.get(key)
            if gone is not None and not deleted and _newer({"metadata": {"resourceVersion": gone}}, body):
                return  # not newer than its deletion: a late answer or event of what is gone
            if watched and kind == RUN[1] and key not in self._stale:
                self._listed[key] = self.clock()
            run = (meta.get("labels") or {}).get(names.LABEL_RUN)
            index = (key[0], key[1], run) if run and kind != RUN[1] else None
            if deleted:
                self._objects.pop(key, None)
                self._gone[key] = str(meta.get("resourceVersion", ""))
                if len(self._gone) > 8192:
                    self._gone.clear()  # only a write answered after its object's deletion event needs it
                if index is not None:
                    self._discard(index, key[2])
                return
            self._gone.pop(key, None)
            self._objects[key] = slim(body)
            if index is not None:
                self._by_run.setdefault(index, set()).add(key[2])
                self._held_lists.pop(index, None)

    def newest(self, body: Mapping[str, Any]) -> Mapping[str, Any]:
        """The newest version held of ``body``'s object (``body`` itself when none is newer): a watch event may
        bring a version older than one the operator has already written."""
        meta = body.get("metadata") or {}
        with self._lock:
            held = self._objects.get((str(body.get("kind")), meta.get("namespace", ""), meta.get("name", "")))
        return held if held is not None and not _newer(body, held) else body

    # --- reads ---
    def run(self, namespace: str, name: str) -> dict[str, Any] | None:
        key = (RUN[1], namespace, name)
        with self._lock:
            if self._fresh(key):
                return self._objects.get(key)
        obj = self.kube.get_run(namespace, name)
        if obj is not None:
            self.observe(obj)
        with self._lock:
            self._stale.discard(key)
            self._listed[key] = self.clock()
            return self._objects.get(key) if obj is not None else None

    def children(self, kind: tuple[str, str], namespace: str, run: str) -> list[dict[str, Any]]:
        key = (kind[1], namespace, run)
        with self._lock:
            if self._fresh(key) or (
                key not in self._stale and self._fresh_at(self._ns_listed.get((kind[1], namespace)))
            ):
                return self._held(key)
            own = key in self._stale
        # a run to read afresh lists its own; else one list holds the children of every run in the namespace
        selector = names.run_selector(run) if own else names.children_selector()
        answer = self.kube.request("GET", collection_path(*kind, namespace), query={"labelSelector": selector})
        listed = list(answer.get("items") or [])
        for obj in listed:
            self.observe({"kind": kind[1], "apiVersion": kind[0], **obj})
        at = str((answer.get("metadata") or {}).get("resourceVersion", ""))
        with self._lock:
            # what the list does not hold is gone, unless a newer version came meanwhile (an event, a write)
            there = {o["metadata"]["name"] for o in listed}
            runs = [key] if own else [k for k in self._by_run if k[0] == kind[1] and k[1] == namespace]
            for index in runs:
                for name in list(self._by_run.get(index, ())):
                    if name not in there and not self._since(at, (kind[1], namespace, name)):
                        self._objects.pop((kind[1], namespace, name), None)
                        self._discard(index, name)
                        self._gone[(kind[1], namespace, name)] = at
            if own:
                self._stale.discard(key)
                self._listed[key] = self.clock()
            else:
                self._ns_listed[(kind[1], namespace)] = self.clock()
            return self._held(key)

    def relist(self, namespace: str, run: str) -> None:
        with self._lock:
            for kind in (RUN, JOB, JOBSET, DEPLOYMENT):
                self._listed.pop((kind[1], namespace, run), None)
                self._stale.add((kind[1], namespace, run))

    def expire(self, kind: tuple[str, str]) -> None:
        """A watch of ``kind`` may have missed events (410 Gone: it listed again): every run's children of that kind
        are listed afresh at their next read, so a child whose DELETED event was lost is not kept."""
        with self._lock:
            for key in [k for k in self._listed if k[0] == kind[1]]:
                del self._listed[key]
            for spot in [k for k in self._ns_listed if k[0] == kind[1]]:
                del self._ns_listed[spot]

    def forget(self, namespace: str, run: str) -> None:
        with self._lock:
            for kind in (JOB, JOBSET, DEPLOYMENT):
                self._held_lists.pop((kind[1], namespace, run), None)
                for name in self._by_run.pop((kind[1], namespace, run), set()):
                    self._objects.pop((kind[1], namespace, name), None)
            self._objects.pop((RUN[1], namespace, run), None)
            for kind in (RUN, JOB, JOBSET, DEPLOYMENT):
                self._listed.pop((kind[1], namespace, run), None)
                self._stale.discard((kind[1], namespace, run))

    # --- under the lock ---
    def _fresh(self, key: Key) -> bool:
        return self._fresh_at(self._listed.get(key))

    def _fresh_at(self, listed: float | None) -> bool:
        return listed is not None and self.clock() - listed < RELIST_S

    def _held(self, key: Key) -> list[dict[str, Any]]:
        held = self._held_lists.get(key)
        if held is None:
            held = self._held_lists[key] = [
                self._objects[(key[0], key[1], n)]
                for n in sorted(self._by_run.get(key, ()))
                if (key[0], key[1], n) in self._objects
            ]
        return list(held)  # the caller's own list; the objects are never changed in place

    def _discard(self, index: Key, name: str) -> None:
        self._by_run.get(index, set()).discard(name)
        self._held_lists.pop(index, None)

    def _since(self, listed_at: str, key: Key) -> bool:
        """The object held under ``key`` is newer than a list answered at resourceVersion ``listed_at``."""
        held = self._objects.get(key)
        version = str((held or {}).get("metadata", {}).get("resourceVersion", ""))
        return held is not None and listed_at.isdigit() and version.isdigit() and int(version) > int(listed_at)
