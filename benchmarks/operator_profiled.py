"""The operator's handlers with every reconcile under cProfile, for ``operator_bench.py --profile FILE``.

Imported by ``kopf run -m benchmarks.operator_profiled`` in place of ``whale_operator.handlers``: it registers the
same handlers and wraps :meth:`Reconciler.reconcile` so each call runs under its worker thread's own profiler
(Python 3.11's cProfile profiles one thread), timed by the thread's CPU clock (the waits for the API server
are not the reconcile's cost); at exit the threads' profiles are merged and written as pstats to
``$WHALE_BENCH_PROFILE``. Read it with ``python -m pstats FILE`` (``sort tottime``, ``stats 30``). The thread that
imports it (kopf's event loop: its watch streams, its handlers, its own API requests) is profiled too, from import to
exit, into ``$WHALE_BENCH_PROFILE.loop``: what the operator spends outside its reconciles, but for the children's
watches, which run in threads of their own (:mod:`whale_operator.watches`; not profiled).
"""

from __future__ import annotations

import atexit
import cProfile
import os
import pstats
import threading
import time
from typing import Any

from whale_operator import handlers  # noqa: F401 - registers the operator's handlers with kopf
from whale_operator.reconcile import Reconciler

_local = threading.local()
_profiles: list[cProfile.Profile] = []
_lock = threading.Lock()
_reconcile = Reconciler.reconcile


def _profiled(self: Reconciler, *args: Any, **kwargs: Any) -> Any:
    prof = getattr(_local, "profile", None)
    if prof is None:
        prof = _local.profile = cProfile.Profile(time.thread_time)  # CPU, not the waits for the API
        with _lock:
            _profiles.append(prof)
    prof.enable()
    try:
        return _reconcile(self, *args, **kwargs)
    finally:
        prof.disable()


#: kopf's event loop runs in the thread that imports the handlers (``kopf run -m``)
_loop = cProfile.Profile(time.thread_time)


def _dump() -> None:
    _loop.disable()
    _loop.dump_stats(os.environ["WHALE_BENCH_PROFILE"] + ".loop")
    with _lock:
        if _profiles:
            stats = pstats.Stats(_profiles[0])
            for prof in _profiles[1:]:
                stats.add(prof)
            stats.dump_stats(os.environ["WHALE_BENCH_PROFILE"])


Reconciler.reconcile = _profiled  # type: ignore[method-assign]
atexit.register(_dump)
_loop.enable()
