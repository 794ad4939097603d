"""kopf handlers: observe, decide, act — nothing else lives here.

* one daemon per WhaleRun runs :meth:`Reconciler.reconcile` in a worker thread, then sleeps until
  woken by a change of one of its children (Job / JobSet / Deployment / doorbell watch events) or of its spec, with a
  timer only as a safety net (``WHALE_OPERATOR_RESYNC_S``);
* the children's watches (:mod:`whale_operator.watches`: threads of their own, started here, outside kopf's
  per-event machinery) keep the operator's informer current (:mod:`whale_operator.informer`: a reconcile reads the
  run and its children from memory, not from the API server) and wake the owning run's daemon, so a finished Job
  leads to the next child within a watch round-trip plus one reconcile; the same for the served-weights
  acknowledgement, which the vLLM pod's sidecar stamps on the run's ConfigMap ``<run>-served``
  (:mod:`whale.inference.doorbell`).

Run: ``kopf run -m whale_operator.handlers --all-namespaces`` (see docs/operator.md); with ``--namespace=NS``, set
``WHALE_OPERATOR_NAMESPACES=NS`` too (the children's watches serve the same namespaces).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import gc
import logging
import os
import random
import time
from typing import Any

import kopf

from whale.core.spec import API_GROUP, API_VERSION, PLURAL
from whale.core.status import RunPhase
from whale_operator.config import DaemonTimings, OperatorConfig, backoff_s, whole_setting, worker_threads
from whale_operator.informer import Informer
from whale_operator.kube import KubeClient
from whale_operator.metrics import OperatorMetrics
from whale_operator.reconcile import Reading, Reconciler
from whale_operator.watches import ChildWatches, watch_timeout_s

log = logging.getLogger(__name__)


class NoEssence(kopf.AnnotationsDiffBaseStorage):
    """kopf's diff base for an operator with no change-detecting handlers (no ``on.create``/``update``/``resume``/
    ``delete``/``field``: a daemon and watch handlers only). kopf builds every watched object's essence at every event
    (a deep copy of the whole body, a Job's pod template included, and a second to strip its own annotations: over
    half of the operator's CPU outside its reconciles); only those handlers use it, so none is built. A
    change-detecting handler added here needs the stock storage back."""

    def build(self, *, body: kopf.Body, extra_fields: Any = None) -> kopf.BodyEssence:
        return kopf.BodyEssence()


@kopf.on.startup()  # type: ignore[arg-type]  # kopf passes its kwargs by name; the handler takes the ones it uses
def configure(settings: kopf.OperatorSettings, memo: kopf.Memo, logger: logging.Logger, **_: Any) -> None:
    """Clients, metrics and settings of this operator process (resolved once, here)."""
    env = dict(os.environ)
    try:
        config = OperatorConfig.from_env(env)
        memo.workers = worker_threads(env)
        # peering (a second replica): a random priority makes exactly one replica active, the other standby
        priority = whole_setting(env, "WHALE_OPERATOR_PEERING_PRIORITY", random.randint(1, 32767), 0, 2**31 - 1)
        # how long a replica that stopped renewing its peering record (a crashed pod) keeps the others on standby
        lifetime = whole_setting(env, "WHALE_OPERATOR_PEERING_LIFETIME_S", 60, 1, 86400)
        watch_timeout = watch_timeout_s(env)  # the children's watches' too
        port = whole_setting(env, "WHALE_OPERATOR_METRICS_PORT", 8080, 0, 65535)
    except ValueError as exc:  # a setting of this process's environment: the operator stops, naming it (kopf would
        # retry any other error of a start-up handler every minute, forever)
        raise kopf.PermanentError(f"the operator's settings: {exc}") from None
    settings.persistence.finalizer = f"{API_GROUP}/operator"
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=API_GROUP)
    settings.persistence.diffbase_storage = NoEssence(prefix=API_GROUP)
    settings.posting.level = logging.INFO
    settings.peering.priority = priority
    settings.peering.lifetime = lifetime
    settings.watching.server_timeout = watch_timeout
    metrics = OperatorMetrics()
    memo.metrics_server = None
    if port:
        memo.metrics_server = metrics.serve(port)
        logger.info("metrics on :%d/metrics", port)
    kube = KubeClient.from_environment(pool_size=memo.workers)
    memo.informer = Informer(kube)
    kube.on_write = memo.informer.observe  # the operator's own writes, before their watch events come
    memo.metrics = metrics
    memo.kube = kube
    memo.reconciler = Reconciler(kube, metrics, config, reads=memo.informer)
    memo.wakeups = {}


def _configured(memo: kopf.Memo) -> None:
    """For a start-up handler that builds on :func:`configure`'s work: kopf runs every start-up handler of a pass, so
    when configure refused a setting (or failed), this one stops too rather than being retried every minute, and the
    operator exits with configure's error in its log."""
    if "reconciler" not in memo:
        raise kopf.PermanentError("start-up stopped: configure did not finish (its error is logged above)")


@kopf.on.startup()
async def thread_pool(memo: kopf.Memo, **_: Any) -> None:
    """The reconciles' worker threads (:func:`~whale_operator.config.worker_threads`, read by :func:`configure`)."""
    _configured(memo)
    asyncio.get_running_loop().set_default_executor(
        concurrent.futures.ThreadPoolExecutor(max_workers=memo.workers, thread_name_prefix="reconcile")
    )


@kopf.on.startup()
async def child_watches(memo: kopf.Memo, **_: Any) -> None:
    """The watches of the runs' children (:mod:`whale_operator.watches`: threads of their own, not kopf's): each
    event feeds the informer and wakes the run that owns the child, here on the event loop."""
    _configured(memo)
    wakeups: dict[str, asyncio.Event] = memo.wakeups

    def wake(runs: tuple[str, ...]) -> None:
        for uid in runs:
            if uid in wakeups:
                wakeups[uid].set()

    memo.watches = ChildWatches.build(
        memo.kube, memo.informer, memo.metrics, wake, asyncio.get_running_loop(), os.environ
    )
    # kopf runs the cleanup handlers only after a start-up that completed: a stop (or a failure) while a later start-up
    # handler runs skips them, and threads started here and stopped only there would be left running. A task owns them
    # instead: kopf ends every task of the operator still running when it exits, cleanup or not.
    memo.watching = asyncio.create_task(hold_watches(memo.watches), name="whale child watches")


async def hold_watches(watches: ChildWatches) -> None:
    """The children's watches, run until this task is cancelled: by the cleanup handler (:func:`stop_child_watches`),
    or, when the operator stopped before its start-up completed, by kopf ending the tasks left at its exit (after its
    5 s grace for them). Stopping shuts each stream and joins its thread: at once, here on the loop."""
    watches.start()
    try:
        await asyncio.Event().wait()
    finally:
        watches.stop()


@kopf.on.startup()
def settle_collector(**_: Any) -> None:
    """What start-up made (the modules, kopf's registry, the SDK's and pydantic's schemas: about 97,000 objects) lives
    as long as the process: moved out of the garbage collector's full passes, which would walk it every time
    (``gc.freeze``; it stays freed by reference counting should any of it go)."""
    gc.collect()
    gc.freeze()


@kopf.on.login()
def login(**kwargs: Any) -> kopf.ConnectionInfo | None:
    """In-cluster service account, else $KUBECONFIG as it is now (not when a library was imported)."""
    return kopf.login_with_service_account(**kwargs) or kopf.login_with_kubeconfig(**kwargs)


@kopf.on.cleanup()
async def stop_child_watches(memo: kopf.Memo, **_: Any) -> None:
    """The watches end before the client they read through is closed (:func:`shutdown`, the next cleanup handler)."""
    watching = getattr(memo, "watching", None)
    if watching is not None:
        watching.cancel()
        await asyncio.wait([watching])


@kopf.on.cleanup()
def shutdown(memo: kopf.Memo, **_: Any) -> None:
    kube = getattr(memo, "kube", None)
    if kube is not None:
        kube.close()
    server = getattr(memo, "metrics_server", None)
    if server is not None:
        server.shutdown()
        server.server_close()


def _wakeup(memo: kopf.Memo, uid: str) -> asyncio.Event:
    wakeups: dict[str, asyncio.Event] = memo.wakeups
    if uid not in wakeups:
        wakeups[uid] = asyncio.Event()
    return wakeups[uid]


@kopf.daemon(API_GROUP, API_VERSION, PLURAL, cancellation_polling=0.5)  # type: ignore[arg-type]  # as above
async def whalerun_daemon(
    name: str,
    namespace: str,
    uid: str,
    body: kopf.Body,
    memo: kopf.Memo,
    stopped: kopf.DaemonStopped,
    logger: logging.Logger,
    **_: Any,
) -> None:
    """Reconcile the run whenever something it depends on changed; never crash-loops."""
    reconciler: Reconciler = memo.reconciler
    metrics: OperatorMetrics = memo.metrics
    timings: DaemonTimings = reconciler.config.timings
    wake = _wakeup(memo, uid)
    failures = 0  # reconciles in a row that raised or were refused by the API server: the back-off grows
    reading, read_at = Reading.FULL, time.monotonic()  # the first reconcile reads everything
    try:
        while not stopped:
            wake.clear()
            started = time.perf_counter()
            delay = timings.resync_s
            if reading is Reading.FULL:
                read_at = time.monotonic()
            try:
                outcome = await asyncio.to_thread(_timed_reconcile, reconciler, metrics, namespace, name, reading)
            except Exception as exc:
                metrics.reconcile_errors.labels(error=type(exc).__name__).inc()
                reconciler.reads.relist(namespace, name)  # the next reconcile reads the run afresh
                failures += 1
                delay = backoff_s(failures, timings.error_backoff_s, timings.max_backoff_s)
                logger.exception("reconcile of %s/%s failed; retrying in %.0f s", namespace, name, delay)
            else:
                for ev in outcome.events if outcome is not None else []:
                    kopf.event(body, type=ev.type, reason=ev.reason, message=ev.message[:1000])
                if outcome is not None and (outcome.rejected or outcome.unavailable):
                    metrics.reconcile_errors.labels(
                        error="ChildRejected" if outcome.rejected else "StoreUnavailable"
                    ).inc()
                    failures += 1
                    delay = backoff_s(failures, timings.error_backoff_s, timings.max_backoff_s)
                else:
                    failures = 0
                if (
                    outcome is not None
                    and not (outcome.rejected or outcome.unavailable)
                    and (outcome.poll or (outcome.status.phase is RunPhase.RUNNING and outcome.status.active_phase))
                ):
                    delay = min(delay, timings.progress_s)
            finally:
                metrics.handler_duration.labels(handler="reconcile").observe(time.perf_counter() - started)
            woken = await _sleep(wake, stopped, delay)
            # a failure or the resync reads everything afresh; a watch event what it may have changed; a progress poll
            # what a running phase writes (Reading)
            if failures > 0 or time.monotonic() - read_at >= timings.resync_s:
                reading = Reading.FULL
            else:
                reading = Reading.EVENT if woken else Reading.POLL
    finally:
        memo.wakeups.pop(uid, None)
        reconciler.forget(uid, namespace, name)
        metrics.forget_run(uid, namespace, name)  # a deleted run leaves no series


def _timed_reconcile(
    reconciler: Reconciler, metrics: OperatorMetrics, namespace: str, name: str, reading: Reading
) -> Any:
    """The reconcile itself, timed apart from the wait for a worker thread (``reconcile_work``), and its own
    thread's CPU time (``whale_operator_reconcile_cpu_seconds``)."""
    started, cpu = time.perf_counter(), time.thread_time()
    try:
        return reconciler.reconcile(namespace, name, reading)
    finally:
        metrics.reconcile_cpu.observe(time.thread_time() - cpu)
        metrics.handler_duration.labels(handler="reconcile_work").observe(time.perf_counter() - started)


async def _sleep(wake: asyncio.Event, stopped: kopf.DaemonStopped, delay: float) -> bool:
    """Until woken, stopped (the run is being deleted / the operator exits) or ``delay`` passes; True when woken."""
    woken = asyncio.ensure_future(wake.wait())
    halted = asyncio.ensure_future(stopped.wait(delay))
    try:
        await asyncio.wait([woken, halted], return_when=asyncio.FIRST_COMPLETED)
    finally:
        woken.cancel()
        halted.cancel()
    return wake.is_set()


@kopf.on.event(API_GROUP, API_VERSION, PLURAL)
async def whalerun_event(event: kopf.RawEvent, uid: str, memo: kopf.Memo, type: str | None, **_: Any) -> None:
    """The spec changed (e.g. suspend flipped): wake the run's daemon. Status-only updates (our own
    writes) are skipped: observedGeneration already matches; so is a generation a reconcile has already read (kopf's
    own marks on a new run come before its first status: they would retry a refused run at once, not after its
    back-off). Every version goes to the informer. It reads the event's own dict, not kopf's ``body``, a view of it
    whose every read is a few Python calls deep (most of this handler's time on kopf's event loop, in py-spy's samples
    of a creation burst)."""
    obj = event["object"]
    memo.informer.observe(obj, deleted=type == "DELETED", watched=True)  # the run's next reconcile reads this
    newest = memo.informer.newest(obj)  # an event older than the operator's own status write wakes nothing
    generation = newest.get("metadata", {}).get("generation")
    observed = (newest.get("status") or {}).get("observedGeneration")
    # None: the run's first reconcile has not read it yet, and reads the newest version the informer holds
    read = memo.reconciler.read_generation(uid)
    if generation != observed and read is not None and generation != read and uid in memo.wakeups:
        memo.wakeups[uid].set()
