"""The thread CPU of one reconcile, driven by hand, transition by transition: a quieter figure than
``operator_bench.py``'s, for telling a cut to the reconcile's own code from the machine's noise.

No kopf and no other run: the benchmark plays the watch events itself (the finished Job, then the new Job and the
sidecar's acknowledgement, fed to the operator's informer as kopf's handlers feed it) and calls
:meth:`Reconciler.reconcile` in this thread, timing each call by ``time.thread_time()``. Per transition of a run's
schedule (a child finished) four reconciles are timed: ``finish`` (the finished child read, the next one created,
the status written; after a weight phase, the new checkpoint served instead, its child made once it is acknowledged),
``running`` (the new child and the acknowledgement seen), ``started`` (the Job controller started the new child:
``startTime``, ``active``; the operator marks it started) and ``noop`` (its pod ready: a reconcile that finds nothing
new), each woken by a watch event as in the operator (``Reading.EVENT``: the store's results read only for a child
that has ended; a run's first reconcile reads everything). The API server is the emulator on loopback in a process of
its own, as ``operator_bench.py`` runs it (``--emulator-thread``: in a thread of this process, as before; then each reconcile's
garbage collections also walk the emulator's objects, which grow with every run's Jobs and made a late transition
look dearer than it is), the store a local folder (``--store s3``: S3 on loopback, SeaweedFS, each run reaching it
with its own credentials Secret, as ``operator_bench.py --store s3`` runs it: a reconcile's store requests then cost
what an S3 client's cost). What the set-up made is frozen out of the garbage collector's
full passes after it, as the operator's start-up does (``gc.freeze``). Each run's first transition (its
first reconciles, the spec parsed) is left out of those; a new run's reconciles until its first Job (the spec parsed,
its infrastructure made, the serving target acknowledged, the Job made) are timed together as ``create``, one figure a
run, apart from ``all`` (the transitions' reconciles). ``per_transition`` holds the same reconciles by the transition
they belong to (``"weight -> eval"``: the kinds of the Job that finished and of the next one; ``"eval -> end"``: the
run's last): ``operator_bench.py``'s steady section makes only weight -> eval transitions, each a reconcile that serves
the new checkpoint (``finish``) and one that makes the evaluation's Job once it is served (``running``), so those two
with ``started`` and ``noop`` (the new Job's start and readiness, which the benchmark's Job controller writes too), are
its figures by hand; ``all`` counts the other transitions too.

    .venv/bin/python benchmarks/reconcile_cpu.py [--runs 8] [--total-steps N] [--emulator-thread] [--store s3] [--out FILE]

Run from another checkout's folder (``python /tmp/before/benchmarks/reconcile_cpu.py``) it measures that checkout's
operator, as ``operator_bench.py`` does.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

# this tree's whale and whale_operator, before any installed copy (a benchmark of an older commit, unpacked beside)
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "operator"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import operator_bench
from operator_bench import STORES, BenchStore, EmulatorProcess, EmulatorThread

from tests.fixtures.kube import KubeAPI
from tests.operator.conftest import BASE_SPEC, prepared_run
from tests.operator.player import job_finished
from whale_operator.crd import crd

KINDS = ("create", "finish", "running", "started", "noop")
#: the reconciles of a transition (``all`` is their mix); ``create`` is a new run's, one figure a run
TRANSITION_KINDS = KINDS[1:]
NS = "bench"


def measure(
    runs: int,
    workdir: Path,
    total_steps: int | None = None,
    by_transition: dict[int, list[float]] | None = None,
    emulator_process: bool = True,
    store_kind: str = "folder",
    by_kind: dict[str, dict[str, list[float]]] | None = None,
) -> dict[str, list[float]]:
    """Each kind's reconciles' thread CPU, seconds. ``total_steps``: the runs' schedule (two steps a cycle) instead of
    the tests' short one; ``by_transition`` gets each transition's four reconciles, summed, by its index in the run;
    ``emulator_process``: the API server's stand-in in a process of its own, else a thread of this one; ``store_kind``:
    the runs' store (:data:`operator_bench.STORES`); ``by_kind`` gets each kind's reconciles by the transition they
    belong to (``"weight -> eval"``: :func:`operator_bench.transition`), as ``operator_bench.py`` reports reactions."""
    (workdir / "kube").mkdir()
    emulator = EmulatorProcess(workdir / "kube") if emulator_process else EmulatorThread(workdir / "kube")
    os.environ["KUBECONFIG"] = str(emulator.kubeconfig)
    os.environ["WHALE_OPERATOR_METRICS_PORT"] = "0"
    # imported after $KUBECONFIG is set (the operator's client reads it when built)
    from whale_operator.config import OperatorConfig
    from whale_operator.informer import Informer
    from whale_operator.kube import KubeClient
    from whale_operator.metrics import OperatorMetrics
    from whale_operator.reconcile import Reading, Reconciler

    api = KubeAPI(emulator.url)
    bench_store: BenchStore | None = None
    try:
        api.create("apiextensions.k8s.io/v1", "customresourcedefinitions", None, crd())
        api.create("v1", "namespaces", None, {"metadata": {"name": NS}})
        bench_store = BenchStore(store_kind, workdir)
        bench_store.prepare(api, NS)
        os.environ.update(bench_store.driver_env())  # the workloads' stand-in opens each run's store by its URI
        store = bench_store.base
        spec: dict[str, Any] = {**BASE_SPEC, "storage": bench_store.storage()}
        if total_steps is not None:
            spec["schedule"] = {**spec.get("schedule", {}), "totalSteps": total_steps, "weightStepsPerCycle": 2}
        kube = KubeClient.from_environment()
        informer = Informer(kube)
        kube.on_write = informer.observe
        # the operator's settings as its admins set them for this store (the S3 endpoint allowed); no keys of its own
        config = OperatorConfig.from_env(bench_store.operator_env())
        reconciler = Reconciler(kube, OperatorMetrics(), config, reads=informer)
        # what the operator's start-up does (handlers.settle_collector): its long-lived objects out of full collections
        gc.collect()
        gc.freeze()
        cpu: dict[str, list[float]] = {kind: [] for kind in KINDS}

        def seen(job: dict[str, Any]) -> None:  # the watch event kopf would bring
            now = api.get("batch/v1", "jobs", NS, job["metadata"]["name"])
            assert now is not None, f"Job {job['metadata']['name']} is gone"
            informer.observe(now)

        for r in range(runs):
            name = f"r{r}"
            player = prepared_run(api, store, NS, name, spec)
            first = 0.0  # a new run: the reconciles until its first Job (spec parsed, infrastructure made, Job made)
            for attempt in range(8):  # the run's infrastructure, its serving target acknowledged, its first Job
                player.ack_serving()
                started = time.thread_time()
                # the operator's: its first reconcile of a run reads everything, the next ones are woken by events
                reconciler.reconcile(NS, name, Reading.EVENT if attempt else Reading.FULL)
                first += time.thread_time() - started
                if player.jobs():
                    break
            cpu["create"].append(first)
            for transition in range(400):
                pending = [j for j in player.jobs() if not job_finished(j)]
                if not pending:
                    break
                player.finish(pending[0])
                seen(pending[0])
                spent = 0.0
                took_by_kind: dict[str, float] = {}
                for kind in TRANSITION_KINDS:
                    if kind == "running":
                        player.ack_serving()
                        for job in player.jobs():
                            seen(job)
                    elif kind in ("started", "noop"):  # the Job controller: the new Job's pod made, then ready
                        write = api.start_job if kind == "started" else api.ready_job
                        for job in player.jobs():
                            if not job_finished(job):
                                informer.observe(write(NS, job["metadata"]["name"]))
                    started = time.thread_time()
                    reconciler.reconcile(NS, name, Reading.EVENT)  # each woken by a watch event, as in the operator
                    took = time.thread_time() - started
                    spent += took
                    took_by_kind[kind] = took
                    if transition > 0:
                        cpu[kind].append(took)
                if by_transition is not None:
                    by_transition.setdefault(transition, []).append(spent)
                if by_kind is not None and transition > 0:
                    made = [j for j in player.jobs() if not job_finished(j)]
                    held = by_kind.setdefault(operator_bench.transition(pending[0], made[0] if made else None), {})
                    for kind, took in took_by_kind.items():
                        held.setdefault(kind, []).append(took)
        kube.close()
        return cpu
    finally:
        api.close()
        emulator.close()
        if bench_store is not None:
            bench_store.close()


def summary(values: list[float]) -> dict[str, float]:
    return {
        "n": len(values),
        "mean_s": statistics.fmean(values),
        "median_s": statistics.median(values),
        "min_s": min(values),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=8, help="runs played one after another, each to its end")
    ap.add_argument("--out", type=Path, help="write the raw JSON here (benchmarks/results/...)")
    ap.add_argument(
        "--total-steps",
        type=int,
        help="the runs' schedule (two steps a cycle; the tests' short one by default): a long run shows whether a "
        "transition costs more the further the run is",
    )
    ap.add_argument(
        "--emulator-thread",
        action="store_true",
        help="the emulator in a thread of this process (its objects then add to each garbage collection's walk)",
    )
    ap.add_argument(
        "--store", choices=STORES, default="folder", help="the runs' store: a local folder, or S3 on loopback"
    )
    args = ap.parse_args()
    if args.total_steps is not None and not 2 <= args.total_steps <= 200:
        ap.error("--total-steps must be between 2 and 200")
    by_transition: dict[int, list[float]] = {}
    by_kind: dict[str, dict[str, list[float]]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        cpu = measure(
            args.runs, Path(tmp), args.total_steps, by_transition, not args.emulator_thread, args.store, by_kind
        )
    every = [v for kind in TRANSITION_KINDS for v in cpu[kind]]
    by_tens = {
        f"{t}-{t + 9}": statistics.fmean(v for i in range(t, t + 10) for v in by_transition.get(i, []))
        for t in range(0, max(by_transition, default=-1) + 1, 10)
    }
    per_kind = {kind: summary(cpu[kind]) for kind in KINDS}
    overall = summary(every)
    result = {
        "command": " ".join(["benchmarks/reconcile_cpu.py", *sys.argv[1:]]),
        "tree": str(Path(__file__).resolve().parents[1]),
        "load_average": os.getloadavg(),
        "emulator": "a thread of this process" if args.emulator_thread else "own process",
        "store": args.store,
        "per_kind": per_kind,
        # the same reconciles by the transition they belong to (the kinds of the Job that finished and of the next):
        # ``operator_bench.py``'s steady section makes one kind of transition, weight -> eval, compare it with that
        "per_transition": {
            name: {kind: summary(values) for kind, values in kinds.items()} for name, kinds in sorted(by_kind.items())
        },
        "all": overall,
        # a transition's four reconciles, summed, by tens of transitions into the run: their mean, seconds
        "transition_by_tens_s": by_tens,
        "raw_s": cpu,
    }
    for kind, s in [*per_kind.items(), ("all", overall)]:
        print(
            f"{kind:8s} n={s['n']:3.0f} mean {s['mean_s'] * 1e3:.2f} ms  median {s['median_s'] * 1e3:.2f}  "
            f"min {s['min_s'] * 1e3:.2f}"
        )
    for name, kinds in result["per_transition"].items():
        print(
            f"{name:18s}",
            "  ".join(f"{kind} {s['mean_s'] * 1e3:.2f} ms (n={s['n']})" for kind, s in kinds.items()),
        )
    print(
        "a transition's reconciles by how far the run is:",
        {k: round(v * 1e3, 2) for k, v in by_tens.items()},
        "ms",
    )
    if args.out:
        args.out.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
