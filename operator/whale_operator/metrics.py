"""Prometheus metrics of the operator (``whale_operator_*``), on their own registry.

One :class:`OperatorMetrics` per operator process (held in kopf's memo), never module globals, so
tests that start several operators do not share counters.
"""

from __future__ import annotations

import threading
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

from whale.core.status import RunPhase

HANDLER_BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
CPU_BUCKETS_S = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25)
PHASE_BUCKETS_S = (60, 300, 900, 1800, 3600, 7200, 14400, 28800, 86400)


class OperatorMetrics:
    def __init__(self, registry: CollectorRegistry | None = None):
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.handler_duration = Histogram(
            "whale_operator_handler_duration_seconds",
            "Time spent in one reconcile / handler call",
            ["handler"],
            buckets=HANDLER_BUCKETS_S,
            registry=r,
        )
        self.reconcile_cpu = Histogram(
            "whale_operator_reconcile_cpu_seconds",
            "CPU time of one reconcile's own thread (what a reconcile costs, apart from waits)",
            buckets=CPU_BUCKETS_S,
            registry=r,
        )
        self.reconcile_errors = Counter(
            "whale_operator_reconcile_errors", "Reconciles that raised, by error type", ["error"], registry=r
        )
        self.watch_restarts = Counter(
            "whale_operator_watch_restarts",
            "Watches of the runs' children begun again: expired (410 Gone: listed afresh) or after an error",
            ["kind", "reason"],
            registry=r,
        )
        self.watch_cpu = Counter(
            "whale_operator_watch_cpu_seconds",
            "CPU time of the threads watching the runs' children (reading, decoding, the informer, the wakes)",
            ["kind"],
            registry=r,
        )
        self.watch_events = Counter(
            "whale_operator_watch_events", "Watch events of the runs' children received, by kind", ["kind"], registry=r
        )
        self.runs = Gauge("whale_operator_runs", "WhaleRuns seen by this operator, by phase", ["phase"], registry=r)
        self.phase_duration = Histogram(
            "whale_operator_phase_duration_seconds",
            "Wall time of finished phase attempts (Job start to end)",
            ["kind", "outcome"],
            buckets=PHASE_BUCKETS_S,
            registry=r,
        )
        self.rollouts = Gauge(
            "whale_operator_rollouts_spent", "Training rollouts spent per run", ["namespace", "run"], registry=r
        )
        self.stalled = Gauge(
            "whale_operator_run_stalled",
            "1 while the run's Stalled condition is True (a child runs, the store shows no progress)",
            ["namespace", "run"],
            registry=r,
        )
        self.children_created = Counter(
            "whale_operator_children_created", "Child objects created, by kind", ["kind"], registry=r
        )
        self.evictions = Counter(
            "whale_operator_evictions",
            "Phase attempts evicted by the queue (Kueue preemption, waitForPodsReady timeout) after they had started, "
            "by phase kind; counted apart from failures",
            ["kind"],
            registry=r,
        )
        self.actions = Counter(
            "whale_operator_actions", "Actions applied from decide(), by type", ["action"], registry=r
        )
        self._phases: dict[str, RunPhase] = {}
        self._counts: dict[RunPhase, int] = dict.fromkeys(RunPhase, 0)
        self._phases_lock = threading.Lock()  # reconciles of different runs call set_run_phase at once
        for p in RunPhase:
            self.runs.labels(phase=p.value).set(0)

    def set_run_phase(self, uid: str, phase: RunPhase | None) -> None:
        """Track each run's phase (a run counts once); the gauges of the phases it left and entered are updated, in
        constant time (a recount over every run at each reconcile grew with the number of runs)."""
        with self._phases_lock:
            old = self._phases.pop(uid, None)
            if phase is not None:
                self._phases[uid] = phase
            if old is phase:
                return
            for p, step in ((old, -1), (phase, 1)):
                if p is not None:
                    self._counts[p] += step
                    self.runs.labels(phase=p.value).set(self._counts[p])

    def forget_run(self, uid: str, namespace: str, name: str) -> None:
        """A deleted run leaves no series behind (per-run labels would otherwise grow without bound)."""
        self.set_run_phase(uid, None)
        for gauge in (self.rollouts, self.stalled):
            try:
                gauge.remove(namespace, name)
            except KeyError:
                pass  # never reconciled far enough to have the series

    def serve(self, port: int, addr: str = "0.0.0.0") -> Any:
        """Start the /metrics endpoint; returns the HTTP server (``shutdown()`` stops it)."""
        server, _thread = start_http_server(port, addr=addr, registry=self.registry)
        return server
