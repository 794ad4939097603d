"""Operator benchmarks against the Kubernetes API emulator on loopback.

* reaction time: a child Job marked finished (the status write returns) -> the next child Job exists
  (target <= 2 s);
* scale: 200 WhaleRuns at once: reconcile latency (p50/p99 from the operator's own histogram,
  ``whale_operator_handler_duration_seconds{handler="reconcile"}``, which includes waiting for a worker
  thread) and the operator process's RSS (targets: p99 <= 0.5 s, RSS <= 300 MB).

The operator runs as its own process (``kopf run``), exactly as in its image; the emulator and the
test double of the workloads (tests/operator/player.py) run in this process.

    .venv/bin/python benchmarks/operator_bench.py [--runs 200] [--transitions 12] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import httpx

from tests.fixtures.kube import start_emulator, wait_for
from tests.operator.conftest import BASE_SPEC, SPLITS, deep_merge
from tests.operator.player import WR, WorkloadPlayer
from whale.core.layout import split_sizes_key
from whale.crd import crd
from whale.store import open_store

NS = "bench"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rss_mb(pid: int) -> tuple[float, float]:
    """(current RSS, peak RSS) of a process, MB."""
    text = Path(f"/proc/{pid}/status").read_text()

    def kb(field: str) -> int:
        found = re.search(rf"{field}:\s+(\d+)", text)
        if found is None:
            raise RuntimeError(f"/proc/{pid}/status has no {field}")
        return int(found.group(1))

    return kb("VmRSS") / 1024, kb("VmHWM") / 1024


def histogram(metrics_url: str, handler: str = "reconcile") -> list[tuple[float, float]]:
    """Cumulative (upper bound, count) buckets of the reconcile histogram."""
    text = httpx.get(metrics_url).text
    out = []
    for m in re.finditer(
        r'whale_operator_handler_duration_seconds_bucket\{handler="%s",le="([^"]+)"\} (\S+)' % handler, text
    ):
        out.append((float("inf") if m.group(1) == "+Inf" else float(m.group(1)), float(m.group(2))))
    return out


def quantile(buckets: list[tuple[float, float]], q: float) -> float:
    """Upper bound of the bucket holding the q-quantile (Prometheus histograms are bucketed)."""
    total = buckets[-1][1]
    for le, count in buckets:
        if count >= q * total:
            return le
    return float("inf")


def delta(after: list[tuple[float, float]], before: list[tuple[float, float]]) -> list[tuple[float, float]]:
    b = dict(before)
    return [(le, c - b.get(le, 0.0)) for le, c in after]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=200)
    ap.add_argument("--transitions", type=int, default=12)
    ap.add_argument("--steady", type=int, default=40, help="children finished one by one with all runs present")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()

    work = Path(tempfile.mkdtemp(prefix="whale-opbench-"))
    cluster, stop = start_emulator(work)
    cluster.emulator.keep_requests = False
    api = cluster.api
    api.create("apiextensions.k8s.io/v1", "customresourcedefinitions", None, crd())
    api.create("v1", "namespaces", None, {"metadata": {"name": NS}})
    store = open_store(f"file://{work / 'store'}")
    port = free_port()
    env = {
        **os.environ,
        "KUBECONFIG": str(cluster.kubeconfig),
        "WHALE_OPERATOR_METRICS_PORT": str(port),
        "PYTHONPATH": str(Path(__file__).resolve().parents[1]),
    }
    log = open(work / "operator.log", "wb")  # noqa: SIM115 - the operator's stdout, closed after it stops
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "kopf",
            "run",
            "--standalone",
            "--namespace",
            NS,
            "--quiet",
            "-m",
            "whale_operator.handlers",
        ],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    metrics = f"http://127.0.0.1:{port}/metrics"
    results: dict[str, Any] = {}
    try:
        wait_for(lambda: _up(metrics), 60, 0.2, "the operator's metrics endpoint")

        def create(name: str) -> WorkloadPlayer:
            spec = deep_merge(
                BASE_SPEC, {"storage": {"uri": store.uri}, "schedule": {"totalSteps": 64, "weightStepsPerCycle": 2}}
            )
            store.write_json(split_sizes_key(name), SPLITS)
            api.create(
                WR, "whaleruns", NS, {"apiVersion": WR, "kind": "WhaleRun", "metadata": {"name": name}, "spec": spec}
            )
            return WorkloadPlayer(api, store, NS, name)

        # --- reaction time ---
        run = create("react")
        job = run.wait_job(60)
        reactions = []
        for _ in range(args.transitions):
            req = run.request(job)
            {"weight": run.finish_weight, "harness": run.finish_harness, "eval": run.finish_eval}[req.kind.value](req)
            run.handled.add(job["metadata"]["name"])
            t0 = time.perf_counter()
            api.complete_job(NS, job["metadata"]["name"])
            job = wait_for(run.pending_job, 30, 0.005, "the next Job")
            reactions.append(time.perf_counter() - t0)
        results["reaction_s"] = {
            "n": len(reactions),
            "median": statistics.median(reactions),
            "p95": sorted(reactions)[int(0.95 * (len(reactions) - 1))],
            "max": max(reactions),
        }

        # --- scale ---
        before, before_work = histogram(metrics), histogram(metrics, "reconcile_work")
        t0 = time.perf_counter()
        players = [create(f"scale-{i:03d}") for i in range(args.runs)]
        created_s = time.perf_counter() - t0
        firsts = wait_all_first(api, players)
        results["scale_first_child_all_s"] = time.perf_counter() - t0
        burst = delta(histogram(metrics), before)
        burst_work = delta(histogram(metrics, "reconcile_work"), before_work)
        mid, mid_work = histogram(metrics), histogram(metrics, "reconcile_work")
        t1 = time.perf_counter()
        for p in players:  # every run's first child finishes at once: 200 runs react together
            p.finish(firsts[p.run])
        seconds = wait_all_first(api, players, exclude={j["metadata"]["name"] for j in firsts.values()})
        results["scale_second_child_all_s"] = time.perf_counter() - t1
        time.sleep(2.0)
        steady = delta(histogram(metrics), mid)
        steady_work = delta(histogram(metrics, "reconcile_work"), mid_work)

        # steady state: 200 runs exist, their children finish one after another (as on a real cluster,
        # where phases last minutes to hours); reaction time and reconcile latency under that load
        time.sleep(5.0)
        calm, calm_work = histogram(metrics), histogram(metrics, "reconcile_work")
        loaded = []
        for p in players[: args.steady]:
            job = seconds[p.run]
            p.finish(job)
            t0 = time.perf_counter()
            wait_for(p.pending_job, 30, 0.005, "the next Job")
            loaded.append(time.perf_counter() - t0)
        busy = delta(histogram(metrics), calm)
        busy_work = delta(histogram(metrics, "reconcile_work"), calm_work)
        results["reaction_with_200_runs_s"] = {
            "n": len(loaded),
            "median": statistics.median(loaded),
            "p95": sorted(loaded)[int(0.95 * (len(loaded) - 1))],
            "max": max(loaded),
        }
        results["steady"] = {
            "reconciles": busy[-1][1],
            "p50_le_s": quantile(busy, 0.5),
            "p99_le_s": quantile(busy, 0.99),
            "work_p50_le_s": quantile(busy_work, 0.5),
            "work_p99_le_s": quantile(busy_work, 0.99),
        }
        cur, peak = rss_mb(proc.pid)
        results["scale"] = {
            "runs": args.runs,
            "create_s": created_s,
            "startup_burst": {
                "reconciles": burst[-1][1],
                "p50_le_s": quantile(burst, 0.5),
                "p99_le_s": quantile(burst, 0.99),
                "work_p50_le_s": quantile(burst_work, 0.5),
                "work_p99_le_s": quantile(burst_work, 0.99),
            },
            "all_children_finish_at_once": {
                "reconciles": steady[-1][1],
                "p50_le_s": quantile(steady, 0.5),
                "p99_le_s": quantile(steady, 0.99),
                "work_p50_le_s": quantile(steady_work, 0.5),
                "work_p99_le_s": quantile(steady_work, 0.99),
            },
            "operator_rss_mb": round(cur, 1),
            "operator_peak_rss_mb": round(peak, 1),
        }
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()
        api.close()
        stop.set()
    if args.json:
        print(json.dumps(results, indent=2))
    else:
        r = results["reaction_s"]
        print(
            f"reaction time (Job finished -> next Job): median {r['median']:.3f} s, p95 {r['p95']:.3f} s, "
            f"max {r['max']:.3f} s over {r['n']} transitions"
        )
        s = results["scale"]
        for label, key, took in (
            ("startup (all runs created at once)", "startup_burst", "scale_first_child_all_s"),
            ("every run's child finishes at once", "all_children_finish_at_once", "scale_second_child_all_s"),
        ):
            b = s[key]
            print(
                f"{s['runs']} WhaleRuns, {label}: next children of all in {results[took]:.1f} s; "
                f"{int(b['reconciles'])} reconciles; latency incl. thread wait p50 <= {b['p50_le_s']} s, "
                f"p99 <= {b['p99_le_s']} s; reconcile work p50 <= {b['work_p50_le_s']} s, "
                f"p99 <= {b['work_p99_le_s']} s"
            )
        r, b = results["reaction_with_200_runs_s"], results["steady"]
        print(
            f"with {s['runs']} runs present, children finishing one by one: reaction median {r['median']:.3f} s, "
            f"p95 {r['p95']:.3f} s, max {r['max']:.3f} s; {int(b['reconciles'])} reconciles, latency p50 <= "
            f"{b['p50_le_s']} s, p99 <= {b['p99_le_s']} s (work p99 <= {b['work_p99_le_s']} s)"
        )
        print(f"operator RSS {s['operator_rss_mb']} MB (peak {s['operator_peak_rss_mb']} MB)")


def wait_all_first(
    api, players: list[WorkloadPlayer], exclude: frozenset[str] | set[str] = frozenset(), timeout_s: float = 300
) -> dict[str, dict]:
    """One unfinished Job per scale run (one list call per poll, not one per run). Each poll also
    plays every run's weight-sync sidecar, as the operator creates a child only once the inference
    server serves that child's weights."""
    n = len(players)

    def poll() -> dict[str, dict] | None:
        for p in players:
            p.ack_serving()
        jobs = {}
        for j in api.list("batch/v1", "jobs", NS, "whale.dev/run"):
            run = j["metadata"]["labels"]["whale.dev/run"]
            if run.startswith("scale-") and j["metadata"]["name"] not in exclude:
                jobs[run] = j
        return jobs if len(jobs) >= n else None

    return wait_for(poll, timeout_s, 0.25, f"a new Job in each of {n} runs")


def _up(url: str) -> bool:
    try:
        return httpx.get(url).status_code == 200
    except httpx.HTTPError:
        return False


if __name__ == "__main__":
    main()
