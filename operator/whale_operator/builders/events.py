"""Kubernetes Events about a WhaleRun: core/v1 Events as client-go's event recorder writes them.

The operator posts them itself, from the reconcile's worker thread and through its own client (one kept-open
connection, about 0.05 ms of client CPU a request), not through kopf's poster, which sends each Event from the event
loop through aiohttp: a tenth of a millisecond of the loop's time per Event that every other run's watch events wait
behind (measured: ``benchmarks/results/operator_bench_cpu_events_*.json``).
"""

from __future__ import annotations

from typing import Any

from whale.core.spec import API_GROUP, API_VERSION, KIND
from whale_operator.builders.pods import RunRef

#: who writes the Events (``source.component``, ``reportingComponent``): ``kubectl describe`` shows it as From
COMPONENT = "whale-operator"
#: an Event is one line for ``kubectl describe``, not a log: longer messages are cut (kopf's limit, kept)
MESSAGE_LIMIT = 1000


def event_name(run: str, nanoseconds: int) -> str:
    """client-go's Event name: the object's name and the time in hex nanoseconds (unique per object and instant)."""
    return f"{run}.{nanoseconds:x}"


def run_event(run: RunRef, type_: str, reason: str, message: str, name: str, now: str) -> dict[str, Any]:
    """One Event about ``run`` (``type_``: Normal or Warning; ``now``: RFC 3339), counted once."""
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"name": name, "namespace": run.namespace},
        "involvedObject": {
            "apiVersion": f"{API_GROUP}/{API_VERSION}",
            "kind": KIND,
            "name": run.name,
            "namespace": run.namespace,
            "uid": run.uid,
        },
        "type": type_,
        "reason": reason,
        "message": message[:MESSAGE_LIMIT],
        "source": {"component": COMPONENT},
        "reportingComponent": COMPONENT,
        "firstTimestamp": now,
        "lastTimestamp": now,
        "count": 1,
    }
