"""A progress poll's reading of a running phase's metrics lines, as long as the examples' phases make them.

A controller reads the metrics lines of each running phase at every progress poll (the operator every 15 s a run;
``whale.control.observer``). A weight phase writes a line a step: 42 in a cycle of the ``whale`` examples, up to
420 in the one weight phase of an ``rsft_only`` example. Side by side, for each length, on a local store:

* ``whole``: the file read and every line parsed (what each poll did before ``MetricsLines``);
* ``one_new``: the observer's reading when one line was appended since its last (what a poll finds mid-phase);
* ``none_new``: the observer's reading when nothing was appended (the file still read, nothing parsed).

Each figure is the median thread CPU of ``--repeats`` readings, with its ratio to ``whole``; the lines each reading
returned are checked to be the same. A store on S3 adds the object's download to each (not measured here).

    .venv/bin/python benchmarks/metrics_read.py [--lines 10,42,420] [--repeats 50] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from whale.control.observer import StoreObserver, read_metrics
from whale.core import layout
from whale.core.protocol import WeightStepMetrics
from whale.store import open_store

RUN, PHASE = "bench", "c01-weight"
ARMS = ("whole", "one_new", "none_new")


def line(step: int) -> bytes:
    """A weight phase's metrics line as the train workload writes it."""
    raw = WeightStepMetrics(
        step=step,
        epoch=step / 70,
        reward_mean=0.42,
        acceptance_rate=0.37,
        kept=11,
        loss=0.6931,
        learning_rate=1e-6,
        rollouts=128,
    ).to_wire()
    return (json.dumps(raw) + "\n").encode()


def timed(read: Callable[[], Any], before: Callable[[], None], repeats: int) -> tuple[list[float], Any]:
    """``repeats`` thread-CPU timings of ``read``, ``before`` run (untimed) ahead of each; the last result."""
    took, result = [], None
    for _ in range(repeats):
        before()
        started = time.thread_time()
        result = read()
        took.append(time.thread_time() - started)
    return took, result


def measure(lines: int, repeats: int, folder: Path) -> dict[str, Any]:
    store = open_store(str(folder / f"store-{lines}"))
    key = layout.metrics_key(RUN, PHASE)
    body = b"".join(line(step) for step in range(1, lines))
    last = line(lines)

    def reset() -> None:  # the file as the phase wrote it one step ago
        store.write_bytes(key, body)

    def append() -> None:  # one more step's line
        store.write_bytes(key, body + last)

    observer = StoreObserver(store, RUN)
    figures: dict[str, list[float]] = {}
    results: dict[str, Any] = {}

    def one_new_setup() -> None:
        reset()
        observer.read_metrics(PHASE)  # the poll before: the file one line shorter
        append()

    figures["whole"], results["whole"] = timed(lambda: read_metrics(store, RUN, PHASE), append, repeats)
    figures["one_new"], results["one_new"] = timed(lambda: observer.read_metrics(PHASE), one_new_setup, repeats)
    figures["none_new"], results["none_new"] = timed(lambda: observer.read_metrics(PHASE), lambda: None, repeats)
    if not results["whole"] == results["one_new"] == results["none_new"] or len(results["whole"]) != lines:
        raise SystemExit(f"{lines} lines: the readings returned different lines")
    medians = {arm: statistics.median(figures[arm]) for arm in ARMS}
    return {
        "lines": lines,
        "bytes": len(body) + len(last),
        "median_s": medians,
        "over_whole": {arm: medians[arm] / medians["whole"] for arm in ARMS},
        "raw_s": figures,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lines", default="10,42,420", help="file lengths, comma-separated (default: 10,42,420)")
    ap.add_argument("--repeats", type=int, default=50, help="readings timed per figure (default 50)")
    ap.add_argument("--out", type=Path, help="write the raw JSON here (benchmarks/results/...)")
    args = ap.parse_args()
    try:
        lengths = [int(n) for n in args.lines.split(",")]
    except ValueError:
        ap.error(f"--lines: {args.lines!r} is not a comma-separated list of whole numbers, e.g. 10,42,420")
    if not all(1 <= n <= 100_000 for n in lengths):
        ap.error("--lines: each length must be between 1 and 100000")
    if not 1 <= args.repeats <= 10_000:
        ap.error("--repeats must be between 1 and 10000")
    with tempfile.TemporaryDirectory() as tmp:
        rows = [measure(n, args.repeats, Path(tmp)) for n in lengths]
    result = {
        "command": " ".join(["benchmarks/metrics_read.py", *sys.argv[1:]]),
        "python": platform.python_version(),
        "load_average": os.getloadavg(),
        "store": "local folder",
        "per_length": rows,
    }
    print(f"{'lines':>6} {'bytes':>8} {'whole':>10} {'one new':>18} {'none new':>18}")
    for row in rows:
        m, r = row["median_s"], row["over_whole"]
        print(
            f"{row['lines']:>6} {row['bytes']:>8} {1000 * m['whole']:>8.3f}ms "
            f"{1000 * m['one_new']:>8.3f}ms ({r['one_new']:.2f}x) {1000 * m['none_new']:>8.3f}ms ({r['none_new']:.2f}x)"
        )
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
