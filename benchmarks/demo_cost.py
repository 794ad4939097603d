"""What `make demo` costs (issue #33): wall time, CPU-seconds in all and per process (the tiny model's build, each
phase's workload), the load average beside them, and what the demo showed (its evaluations' mean@4).

Each repeat runs the command (default ``make demo`` into a fresh store under ``.whale/demo-cost/``) as a child of
this script, the tiny model rebuilt as in a fresh clone (its ``.built`` mark removed first; ``--keep-model``: not). The CPU-seconds in all are the kernel's count for the waited-for descendants (``RUSAGE_CHILDREN``:
exact); per process they are the last reading of ``/proc/PID/stat`` (user + system) of every descendant, polled
every ``--poll`` seconds, so a process's last fraction of a poll is missing from its own figure (not from the
total). On a shared machine the wall time depends on the other work and the CPU-seconds far less: both are
recorded, with the load average at the start and the end. ``OMP_NUM_THREADS`` is recorded as the command saw it
(``make demo`` sets 1 unless it is set).

    python benchmarks/demo_cost.py --repeats 3 --json benchmarks/results/demo_cost_cpu.json
    python benchmarks/demo_cost.py --command "make demo" --repeats 1 --json /tmp/demo_cost.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RUN = "tiny-synthetic-whale"
TINY_MODEL = Path(".whale/models/synthetic-tiny")  # the Makefile's TINY_MODEL
TICK = os.sysconf("SC_CLK_TCK")


def _proc_table() -> dict[int, tuple[int, int, str, float]]:
    """pid -> (parent pid, start time in ticks, command line, CPU-seconds so far) of every readable process."""
    out: dict[int, tuple[int, int, str, float]] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            stat = Path(f"/proc/{name}/stat").read_text()
            cmd = Path(f"/proc/{name}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        out[int(name)] = (int(fields[1]), int(fields[19]), cmd, (int(fields[11]) + int(fields[12])) / TICK)
    return out


def _label(cmd: str) -> str | None:
    """What a descendant process is, by its command line (None: not worth a line of its own)."""
    argv = cmd.split()
    if any(
        a.endswith("supervise.py") for a in argv
    ):  # the workload's supervisor: its command line holds the workload's
        return None
    if "synthetic.tiny_model" in argv:
        return "tiny model build"
    if "whale.workloads" in argv and "--phase" in argv:
        return f"{argv[argv.index('whale.workloads') + 1]} {argv[argv.index('--phase') + 1]}"
    for sub in ("validate", "run"):
        if any(a.endswith("/whale") for a in argv) and sub in argv:
            return f"whale {sub}"
    return None


def measure(command: list[str], store: Path, poll_s: float, *, keep_model: bool = False) -> dict[str, Any]:
    """One run of ``command`` with ``STORE=store``: wall, CPU in all and per process, the store's evaluations."""
    shutil.rmtree(store, ignore_errors=True)
    if not keep_model:
        (ROOT / TINY_MODEL / ".built").unlink(missing_ok=True)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    load_start = os.getloadavg()
    t0 = time.monotonic()
    log = store.with_suffix(".log")
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("wb") as fh:  # a file, not a pipe: a pipe not read until the end would fill and stall the demo
        child = subprocess.Popen(
            [*command, f"STORE={store}"], cwd=ROOT, stdout=fh, stderr=subprocess.STDOUT, start_new_session=True
        )
    seen: dict[tuple[int, int], tuple[str, float]] = {}
    try:
        while child.poll() is None:
            table = _proc_table()
            for pid, (_, start, cmd, cpu) in table.items():
                ancestor = pid
                while ancestor in table and ancestor != child.pid:
                    ancestor = table[ancestor][0]
                if ancestor == child.pid and pid != child.pid:
                    # the command line as first read: an exited process not yet reaped reads as "" (its CPU does not)
                    seen[(pid, start)] = (seen.get((pid, start), (cmd, 0.0))[0] or cmd, cpu)
            time.sleep(poll_s)
    except BaseException:  # interrupted: the command's whole group goes too (`whale run` stops its workloads on TERM)
        os.killpg(child.pid, signal.SIGTERM)
        child.wait(timeout=60)
        raise
    output = log.read_text(errors="replace")
    wall = time.monotonic() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    processes: dict[str, float] = {}
    for cmd, cpu in seen.values():
        label = _label(cmd)
        if label is not None:
            processes[label] = round(processes.get(label, 0.0) + cpu, 2)
    status_path = store / "runs" / RUN / "status.json"
    status = json.loads(status_path.read_text()) if status_path.exists() else {}
    return {
        "returncode": child.returncode,
        "wall_s": round(wall, 1),
        "cpu_user_s": round(after.ru_utime - before.ru_utime, 1),
        "cpu_system_s": round(after.ru_stime - before.ru_stime, 1),
        "cpu_s_per_process": dict(sorted(processes.items(), key=lambda kv: -kv[1])),
        "load_average_start": [round(x, 2) for x in load_start],
        "load_average_end": [round(x, 2) for x in os.getloadavg()],
        "evaluations": {e["phase"]: e["meanAtK"] for e in status.get("evals", [])},
        "best_mean_at_k": (status.get("best") or {}).get("meanAtK"),
        "phase": status.get("phase"),
        "output_tail": output[-1500:] if child.returncode else "",
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--command", default="make demo", help="run from the repository root; STORE=... is appended")
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--poll", type=float, default=0.2, help="seconds between readings of /proc")
    parser.add_argument("--keep-model", action="store_true", help="do not rebuild the tiny model first")
    parser.add_argument("--stores", type=Path, default=ROOT / ".whale" / "demo-cost", help="each repeat's store here")
    parser.add_argument("--json", type=Path, help="write the raw figures here")
    args = parser.parse_args(argv)
    runs = []
    for i in range(args.repeats):
        store = args.stores.resolve() / f"store-{i + 1}"
        run = measure(shlex.split(args.command), store, args.poll, keep_model=args.keep_model)
        runs.append(run)
        print(json.dumps({k: v for k, v in run.items() if k != "output_tail"}), flush=True)
        if run["returncode"]:
            print(run["output_tail"], file=sys.stderr)
            break
    result = {
        "benchmark": "demo_cost",
        "command": args.command,
        "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
        "tiny_model_rebuilt": not args.keep_model,
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "runs": runs,
    }
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    sys.exit(max((r["returncode"] for r in runs), default=0))


if __name__ == "__main__":
    main()
