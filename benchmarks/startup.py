"""How fast the `whale` command starts (issue #32): `whale --version` and `whale validate` of an example manifest,
each as a ratio to `python -c pass` (the interpreter's own start-up) measured in the same run.

The three commands run interleaved (pass, version, validate; pass, version, validate; ...) as fresh processes of
this interpreter, so a machine loaded by other work slows all three alike and the ratios stay comparable where the
seconds do not. Per command: every wall time, the median and the minimum; the ratios are of the medians. The
targets (issue #32) are seconds on an idle core: `whale --version` <= 0.15 s, `whale validate` <= 0.5 s; with
`python -c pass` at about 0.02 s idle, that is about 7x and 25x. The load average at the start and the end is
recorded beside the figures.

    python benchmarks/startup.py --json benchmarks/results/startup_cpu.json
    python benchmarks/startup.py --repeats 1 --json /tmp/startup.json     # smoke (CI)
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "manifests" / "examples" / "math-whale.yaml"
#: the issue's targets, in seconds on an idle core
TARGET_S = {"version": 0.15, "validate": 0.5}


def commands(manifest: Path) -> dict[str, list[str]]:
    """The measured commands, as the `whale` console script runs them (``whale.__main__:main``)."""
    entry = "import sys; from whale.__main__ import main; sys.argv[0] = 'whale'; main()"
    return {
        "pass": [sys.executable, "-c", "pass"],
        "version": [sys.executable, "-c", entry, "--version"],
        "validate": [sys.executable, "-c", entry, "validate", str(manifest)],
    }


#: the children's environment: bytecode caches written and used, as after any installation (a shell with
#: PYTHONDONTWRITEBYTECODE set would otherwise recompile every whale module on every start)
ENV = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}


def timed(argv: list[str]) -> float:
    """Wall seconds of one run of ``argv``, which must succeed."""
    start = time.perf_counter()
    proc = subprocess.run(argv, cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=120, check=False)
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"{argv[3:] or argv}: exit {proc.returncode}\n{proc.stdout}\n{proc.stderr}")
    return wall


def measure(repeats: int, manifest: Path) -> dict[str, Any]:
    cmds = commands(manifest)
    for argv in cmds.values():  # warm the page cache and the bytecode caches; not counted
        timed(argv)
    load_before = os.getloadavg()
    walls: dict[str, list[float]] = {name: [] for name in cmds}
    for _ in range(repeats):
        for name, argv in cmds.items():
            walls[name].append(timed(argv))
    load_after = os.getloadavg()
    median = {name: statistics.median(w) for name, w in walls.items()}
    return {
        "benchmark": "startup",
        "manifest": str(manifest.relative_to(ROOT) if manifest.is_relative_to(ROOT) else manifest),
        "repeats": repeats,
        "python": sys.version.split()[0],
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform()},
        "load_average_1_5_15": {"before": list(load_before), "after": list(load_after)},
        "wall_s": walls,
        "median_s": median,
        "min_s": {name: min(w) for name, w in walls.items()},
        "ratio_to_python": {name: median[name] / median["pass"] for name in ("version", "validate")},
        "target_idle_s": TARGET_S,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=20, help="runs of each command (interleaved)")
    ap.add_argument("--manifest", type=Path, default=EXAMPLE, help="the manifest `whale validate` checks")
    ap.add_argument("--json", type=Path, help="write the raw figures here")
    args = ap.parse_args()
    if args.repeats < 1:
        ap.error("--repeats must be >= 1")
    result = measure(args.repeats, args.manifest.resolve())
    med, ratio = result["median_s"], result["ratio_to_python"]
    print(f"load average (1 min) {result['load_average_1_5_15']['before'][0]:.2f} on {os.cpu_count()} CPUs")
    print(f"python -c pass   {med['pass'] * 1000:7.1f} ms (median of {args.repeats})")
    for name in ("version", "validate"):
        print(
            f"whale {name:<10} {med[name] * 1000:7.1f} ms = {ratio[name]:5.1f} x python "
            f"(target {TARGET_S[name]} s on an idle core)"
        )
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
