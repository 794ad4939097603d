"""``python -m whale.workloads <train|search|eval|prepare> --store URI --run RUN --phase PHASE``.

Imports ``whale.workloads.<kind>`` and calls its ``main(store, run, phase)``. Any failure exits
non-zero with one line on stderr (the controller shows it); the traceback goes to the log first.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys

from whale.workloads import WORKLOADS

log = logging.getLogger("whale.workloads")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m whale.workloads", description=__doc__.splitlines()[0])
    parser.add_argument("kind", choices=WORKLOADS)
    parser.add_argument("--store", required=True, help="store URI (file:///path or s3://bucket/prefix)")
    parser.add_argument("--run", required=True)
    parser.add_argument("--phase", required=True)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        from whale.store import open_store

        module = importlib.import_module(f"whale.workloads.{args.kind}")
        store = open_store(args.store)
        module.main(store, args.run, args.phase)
        from whale.tracking import export_phase  # spec.tracking.reportTo (off by default); never raises

        export_phase(store, args.run, args.phase)
    except KeyboardInterrupt:
        print(f"{args.kind} workload interrupted", file=sys.stderr)
        return 130
    except Exception as exc:  # noqa: BLE001 - the contract: non-zero exit with a one-line reason
        log.exception("%s workload failed", args.kind)
        reason = str(exc).replace("\n", " ").strip() or type(exc).__name__
        print(f"{args.kind} workload failed: {type(exc).__name__}: {reason}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
