"""Full garbage collections inside RSFT steps, with and without the workload's freeze (``whale.rsft.heap``).

Runs ``benchmarks/rsft_step.py`` (the train workload's own code) twice per round, in fresh processes, once as
the train workload's process runs it (long-lived objects frozen out of full collections before the first
step and after it) and once with the collector as a library caller has it (``--no-gc-freeze``), and puts
their ordinary steps (all but the first, which compiles, and the last, which checkpoints and evaluates)
side by side: the step's wall time, its full collections and their seconds, and the sampling before the
first model call (where such a collection lands when the step's first allocations trigger it). Options this
script does not know go to ``rsft_step.py`` as they are.

    PYTHONPATH=.:domains python benchmarks/gc_freeze.py --rounds 2 --json OUT -- --model tiny --steps 4 \\
        --prompts 96 --max-tokens 12 --eval-items 8 --eval-samples 1
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ARMS: dict[str, list[str]] = {"frozen": [], "not frozen": ["--no-gc-freeze"]}
FIGURES = ("wall_s", "gc_full_collections", "gc_full_s", "gc_pause_s", "sample_head_s")


def run_arm(rest: list[str], extra: list[str], out: Path, timeout_s: float) -> dict[str, Any]:
    cmd = [sys.executable, str(HERE / "rsft_step.py"), *rest, *extra, "--json", str(out)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, check=False)
    if done.returncode != 0:
        raise SystemExit(f"rsft_step.py failed ({done.returncode}): {done.stderr[-2000:]}")
    return json.loads(out.read_text())


def ordinary_steps(report: dict[str, Any]) -> list[dict[str, Any]]:
    steps = report["steps"]
    middle = steps[1:-1]
    return middle or steps[-1:]  # a two-step run has no ordinary step: its last one stands in


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2, help="each arm this many times, interleaved")
    parser.add_argument("--timeout-s", type=float, default=1800.0, help="per rsft_step.py run")
    parser.add_argument("--json", type=Path, help="write the report here")
    args, rest = parser.parse_known_args(argv)
    rest = [a for a in rest if a != "--"]
    steps: dict[str, list[dict[str, Any]]] = {arm: [] for arm in ARMS}
    collector: dict[str, str] = {}  # how each arm's rsft_step.py ran, as it reports it
    with tempfile.TemporaryDirectory(prefix="gc-freeze-") as tmp:
        for r in range(args.rounds):
            for a, (arm, extra) in enumerate(ARMS.items()):
                report = run_arm(rest, extra, Path(tmp) / f"round{r}-arm{a}.json", args.timeout_s)
                steps[arm] += [{k: s[k] for k in ("step", *FIGURES)} for s in ordinary_steps(report)]
                collector[arm] = "left alone" if report["meta"]["args"]["no_gc_freeze"] else "frozen"
    medians = {arm: {k: statistics.median(s[k] for s in rows) for k in FIGURES} for arm, rows in steps.items()}
    frozen, thawed = medians["frozen"], medians["not frozen"]
    result = {
        "args": rest,
        "rounds": args.rounds,
        "collector": collector,
        "ordinary_steps": steps,
        "medians": medians,
        "wall_not_frozen_over_frozen": thawed["wall_s"] / frozen["wall_s"] if frozen["wall_s"] else None,
    }
    print(f"{'ordinary steps, median':<34}{'frozen':>12}{'not frozen':>12}")
    for k in FIGURES:
        print(f"{k:<34}{frozen[k]:>12.3f}{thawed[k]:>12.3f}")
    print(
        f"{len(steps['frozen'])} and {len(steps['not frozen'])} steps; wall not frozen / frozen = "
        f"{result['wall_not_frozen_over_frozen']:.3f}"
    )
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
