"""GPU-seconds per RSFT step, colocated vs separate, in one run (issue #17 item 2).

Each arm runs ``benchmarks/rsft_step.py``'s whole step (the train workload's own code, through a real
``vllm serve`` in dev mode with ``VLLMReloadSync``) in its own process, so the GPU memory of one arm
never helps the other:

* ``separate`` (the paper's launchers): the trainer on GPU 0, the vLLM server on GPU 1 with
  ``--gpu-memory-utilization 0.9``; each idles while the other works. A step holds 2 GPUs.
* ``colocated`` (``inference.placement: colocated``): trainer and server on GPU 0, the server with
  ``--enable-sleep-mode`` at ``--colocated-memory`` of the GPU, put to sleep around each SFT update
  (``whale.rsft.colocated``). A step holds 1 GPU.

``--weight-sync cudaIpc`` makes the colocated arm sync through CUDA IPC (``inference.weightSync: cudaIpc``,
``whale.rsft.sync.VLLMIpcSync``; the server with ``--weight-transfer-config '{"backend": "ipc"}'`` and
``VLLM_ALLOW_INSECURE_SERIALIZATION=1``, as the operator renders it) instead of a shared folder.

GPU-seconds per step = the step's wall time x the GPUs it holds (ordinary steps: the first compiles,
the last checkpoints and evaluates; both are reported too). Needs vLLM importable and, for the
separate arm, two GPUs. With one GPU, ``--separate-on-one-gpu`` runs the separate arm with both processes
on GPU 0 (the server awake throughout, at ``--separate-memory`` of the GPU instead of 0.9) and still counts
the 2 GPUs that placement holds: an RSFT step generates, then trains, never both at once, so its wall time
is what two GPUs would give, up to the contention of two processes on one device (the report says it was
emulated).

Options this script does not know go to ``rsft_step.py`` as they are (``--steps``, ``--prompts``,
``--reply-tokens``, ``--max-tokens``, ``--ceiling``...); each arm's report carries rsft_step's ceiling
(default: the server replay of the last step's calls) and its per-step reports.

    PYTHONPATH=. python benchmarks/colocated_step.py --steps 4 --json colocated.json [rsft_step.py options]
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

#: arm -> the GPU its vLLM server takes, and the GPUs the arm holds
ARMS: dict[str, dict[str, Any]] = {
    "separate": {"server_gpu": "1", "gpus": 2},
    "colocated": {"server_gpu": "0", "gpus": 1},
}


def run_arm(
    arm: str,
    colocated_memory: float,
    sleep_level: int,
    rest: list[str],
    server_gpu: str,
    separate_memory: float,
    weight_sync: str = "auto",
) -> dict[str, Any]:
    """One arm in this process: rsft_step.main with the server placed (and configured) for ``arm``."""
    ipc = arm == "colocated" and weight_sync == "cudaIpc"
    import rsft_step

    base_spec, base_server = rsft_step.run_spec, rsft_step.vllm_server

    def run_spec(args: argparse.Namespace, model_dir: Path, base_url: str | None) -> dict[str, Any]:
        spec = base_spec(args, model_dir, base_url)
        if arm == "colocated":
            spec["inference"].update(
                placement="colocated", colocatedGpuMemoryUtilization=colocated_memory, sleepLevel=sleep_level
            )
            if ipc:
                spec["inference"]["weightSync"] = "cudaIpc"
        return spec

    @contextlib.contextmanager
    def vllm_server(model_dir: Path, workdir: Path, port: int, memory: float, max_model_len: int):
        from weight_sync_vllm import Server

        extra = [
            "--gpu-memory-utilization",
            str(colocated_memory if arm == "colocated" else separate_memory),
            "--max-model-len",
            str(max_model_len),
        ]
        if arm == "colocated" and sleep_level:  # what the operator renders (level 0: it never sleeps)
            extra.append("--enable-sleep-mode")
        if ipc:  # what the operator renders for weightSync cudaIpc
            from whale.inference.vllm_control import IPC_WEIGHT_TRANSFER_ARGS, IPC_WEIGHT_TRANSFER_ENV

            extra += IPC_WEIGHT_TRANSFER_ARGS
            os.environ.update(IPC_WEIGHT_TRANSFER_ENV)
        server = Server(model_dir, port, workdir / "vllm.log", extra)
        # the trainer's CUDA context already exists: only the server's process sees this
        before = os.environ.get("CUDA_VISIBLE_DEVICES")
        os.environ["CUDA_VISIBLE_DEVICES"] = server_gpu
        try:
            server.started_s = server.start()
        finally:
            if before is None:
                os.environ.pop("CUDA_VISIBLE_DEVICES", None)
            else:
                os.environ["CUDA_VISIBLE_DEVICES"] = before
        try:
            yield server
        finally:
            server.stop()

    rsft_step.run_spec, rsft_step.vllm_server = run_spec, vllm_server
    del base_server
    report = rsft_step.main(["--vllm", *rest])
    gpus = ARMS[arm]["gpus"]
    if report.get("warm_only"):  # the model built and the server started once: nothing was stepped
        return {"arm": arm, "gpus": gpus, "warm_only": True, "meta": report["meta"]}
    return {
        "arm": arm,
        "weight_sync": "cudaIpc" if ipc else "auto",
        "gpus": gpus,
        "steps": [
            {
                "step": s["step"],
                "wall_s": s["wall_s"],
                "gpu_seconds": s["wall_s"] * gpus,
                "seconds": s["seconds"],
                "gpu_busy": s.get("gpu_busy"),
                "generated_tokens": s.get("generated_tokens"),
                "kept": s.get("kept"),
            }
            for s in report["steps"]
        ],
        "meta": report["meta"],
        "ceiling": report["ceiling"],
        "generation_vs_ceiling": report["generation_vs_ceiling"],
        "step_reports": report["steps"],
    }


def parse(argv: list[str] | None = None) -> tuple[argparse.ArgumentParser, argparse.Namespace, list[str]]:
    """This script's options; the rest (``--steps``, ``--reply-tokens``, ``--ceiling``...) go to rsft_step."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    parser.add_argument(
        "--colocated-memory",
        type=float,
        default=0.35,
        help="inference.colocatedGpuMemoryUtilization of the colocated server",
    )
    parser.add_argument(
        "--sleep-level", type=int, choices=[0, 1, 2], default=1, help="inference.sleepLevel (0: never sleeps)"
    )
    parser.add_argument("--json", type=Path, help="write the report here")
    parser.add_argument(
        "--weight-sync",
        choices=["auto", "cudaIpc"],
        default="auto",
        help="inference.weightSync of the colocated arm (auto: the shared folder; cudaIpc: CUDA IPC handles)",
    )
    parser.add_argument(
        "--separate-on-one-gpu",
        action="store_true",
        help="one GPU: run the separate arm with trainer and server both on GPU 0 (2 GPUs counted)",
    )
    parser.add_argument(
        "--separate-memory", type=float, default=None, help="the separate server's --gpu-memory-utilization"
    )
    parser.add_argument(
        "--arms", default="colocated,separate", help="which arms to run, comma-separated (one per call: --combine)"
    )
    parser.add_argument(
        "--combine", type=Path, nargs="+", help="merge the reports of earlier calls (one arm each) into one"
    )
    parser.add_argument("--arm", choices=sorted(ARMS), help=argparse.SUPPRESS)
    parser.add_argument("--server-gpu", help=argparse.SUPPRESS)
    args, rest = parser.parse_known_args(argv)
    return parser, args, rest


def main() -> None:
    parser, args, rest = parse()
    if args.combine:
        arms = [arm for path in args.combine for arm in json.loads(path.read_text())["arms"]]
        write_report(summarize(arms, gpus=None), args.json)
        return
    if importlib.util.find_spec("vllm") is None:
        raise SystemExit(
            "colocated_step.py needs vLLM importable (it measures real servers); carry its wheels "
            "(docs/performance.md, weight sync) or run where vLLM is installed"
        )
    if args.arm:
        server_gpu = args.server_gpu or ARMS[args.arm]["server_gpu"]
        separate_memory = args.separate_memory or 0.9
        report = run_arm(
            args.arm, args.colocated_memory, args.sleep_level, rest, server_gpu, separate_memory, args.weight_sync
        )
        print(json.dumps(report))
        return
    import torch

    gpus = torch.cuda.device_count()
    emulated = gpus < 2 and args.separate_on_one_gpu
    wanted = [a for a in args.arms.split(",") if a]
    if unknown := sorted(set(wanted) - set(ARMS)):
        parser.error(f"--arms: unknown arm(s) {unknown}; use {sorted(ARMS)}")
    arms = [a for a in wanted if a == "colocated" or gpus >= 2 or emulated]
    results = []
    for arm in arms:
        placed = ["--server-gpu", "0"] if emulated else []
        if arm == "separate" and emulated:
            placed += ["--separate-memory", str(args.separate_memory or 0.45)]
        proc = subprocess.run(
            [
                sys.executable,
                __file__,
                "--arm",
                arm,
                "--colocated-memory",
                str(args.colocated_memory),
                "--sleep-level",
                str(args.sleep_level),
                "--weight-sync",
                args.weight_sync,
                *placed,
                *rest,
            ],
            stdout=subprocess.PIPE,  # the report; its progress and log go straight on to stderr
            text=True,
            timeout=3600,
            check=False,
            env={**os.environ, "CUDA_VISIBLE_DEVICES": "0,1" if gpus >= 2 else "0"},
        )
        if proc.returncode != 0:
            raise SystemExit(f"arm {arm} failed (its log is above):\n{proc.stdout[-2000:]}")
        results.append(json.loads(proc.stdout.strip().splitlines()[-1]))
        if arm == "separate" and emulated:
            results[-1]["emulated_on_one_gpu"] = True
    write_report(summarize(results, gpus), args.json)


def summarize(results: list[dict[str, Any]], gpus: int | None) -> dict[str, Any]:
    """The arms side by side: GPU-seconds of an ordinary step (neither the first, which compiles, nor
    the last, which checkpoints and evaluates), when both arms are there."""
    report: dict[str, Any] = {"arms": results}
    by_arm = {r["arm"]: r for r in results}
    if set(by_arm) == set(ARMS) and all("steps" in r for r in results):

        def ordinary(r: dict[str, Any]) -> float:
            steps = r["steps"][1:-1] or r["steps"]
            return sum(s["gpu_seconds"] for s in steps) / len(steps)

        col, sep = ordinary(by_arm["colocated"]), ordinary(by_arm["separate"])
        report["compare"] = {
            "gpu_seconds_per_step": {"colocated": col, "separate": sep},
            "separate/colocated": sep / col,
        }
    else:
        report["note"] = (
            f"{gpus} GPU(s): the separate arm needs 2 (or --separate-on-one-gpu); only colocated measured"
            if gpus is not None
            else f"arms {sorted(by_arm)}: both are needed to compare"
        )
    return report


def write_report(report: dict[str, Any], path: Path | None) -> None:
    text = json.dumps(report, indent=2)
    if path:
        path.write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
