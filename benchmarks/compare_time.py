"""How long `whale compare` takes on a store at the paper's scale (issue #31: under 60 s for 4 conditions x 3 seeds).

A synthetic store, written through the store client as the runner lays it out: the four conditions x ``--seeds``
runs, each with the paper's schedule sizes — 420 RSFT steps (a metrics line each), harness phases of 6 iterations,
an evaluation point every 7 steps plus one after each phase (about 70 points), and the final point's per-item file
with ``--items`` test items x 8 samples — then ``whale compare STORE --by harnessSearch.proposer.backend -o json -o
html -o png`` as a fresh process (imports included), ``--repeats`` times. Prints the median wall time and its ratio
to the 60 s target; no figure is asserted.

    python benchmarks/compare_time.py --json benchmarks/results/compare_time_cpu.json
    python benchmarks/compare_time.py --seeds 1 --steps 14 --items 20 --repeats 1 --json /tmp/c.json   # smoke (CI)
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from whale.core import layout  # noqa: E402
from whale.core.layout import EvalAfter  # noqa: E402
from whale.core.protocol import HarnessIterationMetrics, WeightStepMetrics  # noqa: E402
from whale.core.spec import WhaleRunSpec  # noqa: E402
from whale.core.state import best_eval  # noqa: E402
from whale.core.status import EvalPoint, RunPhase, WhaleRunStatus  # noqa: E402
from whale.store import Store, open_store  # noqa: E402

TARGET_S = 60.0
CONDITIONS = ("rsft_only", "mh_only", "whale", "adaptive_whale")
#: the paper's schedule: 6 epochs x 70 steps, E = 42 steps, I = 6, an evaluation every 7 steps
CYCLE_STEPS, ITERATIONS, INTERVAL, ROLLOUTS_PER_STEP = 42, 6, 7, 2048


def spec_of(condition: str, seed: int, steps: int) -> WhaleRunSpec:
    schedule: dict[str, Any] = {"totalSteps": steps}
    if condition == "whale":
        schedule.update(weightStepsPerCycle=CYCLE_STEPS, harnessIterationsPerCycle=ITERATIONS)
    if condition == "mh_only":
        schedule = {"harnessIterationsPerCycle": 60}
    return WhaleRunSpec.model_validate(
        {
            "domain": "synthetic",
            "condition": condition,
            "model": {"name": "Qwen/Qwen3.5-2B"},
            "schedule": schedule,
            "seed": seed,
            "evaluation": {"samplesPerItem": 8},
        }
    )


def finished_point(cycle: int, step: int, after: EvalAfter, rollouts: int, mean: float) -> EvalPoint:
    """An evaluation point with its mean@8, as the status records it."""
    phase = layout.eval_phase_key(cycle, step, after)
    return EvalPoint(phase=phase, cycle=cycle, step=step, after=after, rollouts_at=rollouts).finished(mean, 8)


def write_run(store: Store, name: str, condition: str, seed: int, steps: int, items: int) -> None:
    """One run's records: weight metrics per step, harness metrics per iteration, eval points, final per-item file."""
    spec = spec_of(condition, seed, steps)
    evals: list[EvalPoint] = []
    completed: list[str] = []
    rollouts = 0
    step = 0
    cycles = max(1, steps // CYCLE_STEPS) if condition != "mh_only" else 1
    for cycle in range(1, cycles + 1):
        if condition != "mh_only":
            phase = layout.weight_phase_key(cycle)
            for _ in range(CYCLE_STEPS if condition != "rsft_only" else steps // cycles):
                step += 1
                rollouts += ROLLOUTS_PER_STEP
                line = WeightStepMetrics(
                    step=step,
                    epoch=step / 70,
                    reward_mean=0.3,
                    acceptance_rate=0.3,
                    kept=600,
                    loss=0.5,
                    learning_rate=1e-7,
                    rollouts=ROLLOUTS_PER_STEP,
                    seconds_sampling=120.0,
                    seconds_training=60.0,
                    seconds_syncing=3.0,
                    device="cuda",
                )
                store.append_jsonl(layout.metrics_key(name, phase), line.to_wire())
                if step % INTERVAL == 0:
                    evals.append(finished_point(cycle, step, "weight", rollouts, 0.3 + step / 4000))
            completed.append(phase)
        if condition in ("whale", "adaptive_whale", "mh_only"):
            phase = layout.harness_phase_key(cycle)
            for it in range(1, (60 if condition == "mh_only" else ITERATIONS) + 1):
                rollouts += 768
                line_h = HarnessIterationMetrics(
                    iteration=it, best_score=0.3, best_candidate=f"i{it:02d}-c1", rollouts=768, seconds=900.0
                )
                store.append_jsonl(layout.metrics_key(name, phase), line_h.to_wire())
            evals.append(finished_point(cycle, step, "harness", rollouts, 0.35 + step / 4000))
            completed.append(phase)
    evals.insert(0, finished_point(0, 0, "start", 0, 0.2))
    last = evals[-1]
    rows = "".join(
        json.dumps({"item_id": f"q{i}", "rewards": [float((i + seed + j) % 3 == 0) for j in range(8)]}) + "\n"
        for i in range(items)
    )
    store.write_bytes(layout.eval_items_key(name, last.phase), rows.encode("utf-8"))
    top = max(evals, key=lambda e: e.mean_at_k or 0.0)

    status = WhaleRunStatus(
        phase=RunPhase.SUCCEEDED,
        evals=evals,
        best=best_eval(top),
        final=best_eval(last),
        rollouts_spent=rollouts,
        step=step,
        completed_phases=completed,
    )
    store.write_json(layout.spec_key(name), spec.to_wire())
    store.write_json(layout.status_key(name), status.model_dump(mode="json", by_alias=True, exclude_none=True))


def timed_compare(store_uri: str, out: Path) -> float:
    argv = [
        sys.executable,
        "-c",
        "import sys; from whale.__main__ import main; sys.argv[0] = 'whale'; main()",
        "compare",
        store_uri,
        "--by",
        "harnessSearch.proposer.backend",
        "-o",
        "json",
        "-o",
        "html",
        "-o",
        "png",
        "--out",
        str(out),
    ]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "200"}
    t0 = time.perf_counter()
    proc = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600, check=False)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(
            f"whale compare failed (exit {proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
        )
    return wall


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=420, help="RSFT steps of the weight conditions (the paper's 420)")
    ap.add_argument("--items", type=int, default=500, help="test items in the final point's per-item file")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--json", type=Path, required=True)
    args = ap.parse_args()
    load_start = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="whale-compare-bench-") as tmp:
        uri = str(Path(tmp) / "store")
        store = open_store(uri)
        t0 = time.perf_counter()
        for condition in CONDITIONS:
            for seed in range(1, args.seeds + 1):
                write_run(store, f"{condition.replace('_', '-')}-s{seed}", condition, seed, args.steps, args.items)
        write_s = time.perf_counter() - t0
        walls = [timed_compare(uri, Path(tmp) / f"out{i}") for i in range(args.repeats)]
        doc = json.loads((Path(tmp) / "out0" / "compare.json").read_text())
    median = statistics.median(walls)
    result = {
        "what": "whale compare wall time (fresh process, -o json html png) on a paper-scale synthetic store",
        "runs": len(CONDITIONS) * args.seeds,
        "steps": args.steps,
        "items": args.items,
        "groups": len(doc["groups"]),
        "pairs": len(doc["pairs"]),
        "storeWriteSeconds": round(write_s, 3),
        "wallSeconds": [round(w, 3) for w in walls],
        "medianSeconds": round(median, 3),
        "targetSeconds": TARGET_S,
        "ratioToTarget": round(median / TARGET_S, 4),
        "loadAverage": {"start": load_start, "end": os.getloadavg()[0]},
        "cpu": platform.processor() or platform.machine(),
        "cpus": os.cpu_count(),
    }
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(result, indent=2) + "\n")
    print(
        f"whale compare, {result['runs']} runs ({len(CONDITIONS)} conditions x {args.seeds} seeds, {args.steps} steps, "
        f"{args.items} items): median {median:.2f} s over {args.repeats} (target {TARGET_S:.0f} s; ratio "
        f"{median / TARGET_S:.3f}); load {load_start:.1f} -> {result['loadAverage']['end']:.1f}"
    )


if __name__ == "__main__":
    main()
