"""``python -m whale.workloads <train|search|eval|prepare> --store URI --run RUN --phase PHASE``.

Imports ``whale.workloads.<kind>`` and calls its ``main(store, run, phase)``. Any failure exits
non-zero with one line on stderr (the controller shows it); the traceback goes to the log first.

Before any work it checks the run lock (``layout.lock_key``, ``whale.store.lease``): started by the
local runner (``$WHALE_RUN_OWNER`` set), it refuses unless that runner still holds the lock; started
by hand, it refuses while any live runner holds it — either way a phase never gets a second writer.
On a cluster nobody takes the lock (the operator's Jobs have one owner each), so nothing is refused.
SIGTERM ends the workload like Ctrl-C: ``finally`` blocks run, so its sandboxes are shut down.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import signal
import sys
from collections.abc import Mapping
from typing import Any

from whale.core import layout
from whale.workloads import WORKLOADS

log = logging.getLogger("whale.workloads")


class RunOwnerError(RuntimeError):
    """Another live process owns the run this workload was asked to write."""


def check_run_owner(store: Any, run: str, environ: Mapping[str, str] | None = None) -> None:
    """Refuse (RunOwnerError) to write ``run`` when the run lock says another live process owns it."""
    from whale.store.lease import RUN_OWNER_ENV

    env = os.environ if environ is None else environ
    owner = env.get(RUN_OWNER_ENV)
    info = store.read_lease(layout.lock_key(run))
    held = info is not None and info.live
    if owner:
        if not held or info.holder is None or info.holder.owner != owner:
            now = f"it is held by {info.describe()}" if held else "nobody holds it"
            raise RunOwnerError(
                f"refusing to write run {run!r}: the runner that started this workload (lock owner {owner}) no longer "
                f"holds the run lock {store.uri_for(layout.lock_key(run))}; {now}"
            )
    elif held:
        raise RunOwnerError(
            f"refusing to write run {run!r}: it is being run by {info.describe()}, so a workload started by hand "
            "would be a second writer of its phases; stop that runner first (or let it run this phase)"
        )


def _terminate_like_ctrl_c() -> None:
    def handler(signum: int, _frame: Any) -> None:
        signal.signal(signum, signal.SIG_IGN)  # once: the cleanup that follows must not be cut short again
        raise KeyboardInterrupt(signal.Signals(signum).name)

    signal.signal(signal.SIGTERM, handler)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m whale.workloads", description=__doc__.splitlines()[0])
    parser.add_argument("kind", choices=WORKLOADS)
    parser.add_argument("--store", required=True, help="store URI (file:///path or s3://bucket/prefix)")
    parser.add_argument("--run", required=True)
    parser.add_argument("--phase", required=True)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    _terminate_like_ctrl_c()
    try:
        from whale.store import open_store

        store = open_store(args.store)
        check_run_owner(store, args.run)
        module = importlib.import_module(f"whale.workloads.{args.kind}")
        from whale.rsft.heap import freeze_in_this_process

        freeze_in_this_process()  # this process runs one phase and exits (whale.rsft.heap)
        module.main(store, args.run, args.phase)
        from whale.tracking import export_phase  # spec.execution.tracking.reportTo (off by default); never raises

        export_phase(store, args.run, args.phase)
    except KeyboardInterrupt as exc:
        print(f"{args.kind} workload interrupted{f' ({exc})' if str(exc) else ''}", file=sys.stderr)
        return 130
    except Exception as exc:  # the contract: non-zero exit with a one-line reason
        log.exception("%s workload failed", args.kind)
        reason = str(exc).replace("\n", " ").strip() or type(exc).__name__
        print(f"{args.kind} workload failed: {type(exc).__name__}: {reason}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
