"""GPU-seconds per RSFT step, colocated vs separate, in one run (issue #17 item 2).

Each arm runs ``benchmarks/rsft_step.py``'s whole step (the train workload's own code, through a real
``vllm serve`` in dev mode with ``VLLMReloadSync``) in its own process, so the GPU memory of one arm
never helps the other:

* ``separate`` (the paper's launchers): the trainer on GPU 0, the vLLM server on GPU 1 with
  ``--gpu-memory-utilization 0.9``; each idles while the other works. A step holds 2 GPUs.
* ``colocated`` (``inference.placement: colocated``): trainer and server on GPU 0, the server with
  ``--enable-sleep-mode`` at ``--colocated-memory`` of the GPU, put to sleep around each SFT update
  (``whale.rsft.colocated``). A step holds 1 GPU.

GPU-seconds per step = the step's wall time x the GPUs it holds (ordinary steps: the first compiles,
the last checkpoints and evaluates; both are reported too). Needs vLLM importable and, for the
separate arm, two GPUs (with one, only the colocated arm runs and the report says so).

NOT RUN YET: vLLM cannot be carried to the GPU machine of this session. On a machine with vLLM::

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


def run_arm(arm: str, colocated_memory: float, sleep_level: int, rest: list[str]) -> dict[str, Any]:
    """One arm in this process: rsft_step.main with the server placed (and configured) for ``arm``."""
    import rsft_step

    base_spec, base_server = rsft_step.run_spec, rsft_step.vllm_server

    def run_spec(args: argparse.Namespace, model_dir: Path, base_url: str | None) -> dict[str, Any]:
        spec = base_spec(args, model_dir, base_url)
        if arm == "colocated":
            spec["inference"].update(
                placement="colocated", colocatedGpuMemoryUtilization=colocated_memory, sleepLevel=sleep_level
            )
        return spec

    @contextlib.contextmanager
    def vllm_server(model_dir: Path, workdir: Path, port: int, memory: float, max_model_len: int):
        from weight_sync_vllm import Server

        extra = [
            "--gpu-memory-utilization",
            str(colocated_memory if arm == "colocated" else 0.9),
            "--max-model-len",
            str(max_model_len),
        ]
        if arm == "colocated":
            extra.append("--enable-sleep-mode")
        server = Server(model_dir, port, workdir / "vllm.log", extra)
        # the trainer's CUDA context already exists: only the server's process sees this
        before = os.environ.get("CUDA_VISIBLE_DEVICES")
        os.environ["CUDA_VISIBLE_DEVICES"] = str(ARMS[arm]["server_gpu"])
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
    return {
        "arm": arm,
        "gpus": gpus,
        "steps": [
            {
                "step": s["step"],
                "wall_s": s["wall_s"],
                "gpu_seconds": s["wall_s"] * gpus,
                "seconds": s["seconds"],
                "gpu_busy": s.get("gpu_busy"),
            }
            for s in report["steps"]
        ],
        "meta": report["meta"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--colocated-memory",
        type=float,
        default=0.35,
        help="inference.colocatedGpuMemoryUtilization of the colocated server",
    )
    parser.add_argument("--sleep-level", type=int, choices=[1, 2], default=1, help="inference.sleepLevel")
    parser.add_argument("--json", type=Path, help="write the report here")
    parser.add_argument("--arm", choices=sorted(ARMS), help=argparse.SUPPRESS)
    args, rest = parser.parse_known_args()
    if importlib.util.find_spec("vllm") is None:
        raise SystemExit(
            "colocated_step.py needs vLLM importable (it measures real servers); carry its wheels "
            "(docs/performance.md, weight sync) or run where vLLM is installed"
        )
    if args.arm:
        print(json.dumps(run_arm(args.arm, args.colocated_memory, args.sleep_level, rest)))
        return
    import torch

    gpus = torch.cuda.device_count()
    arms = ["colocated", "separate"] if gpus >= 2 else ["colocated"]
    results = []
    for arm in arms:
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
                *rest,
            ],
            capture_output=True,
            text=True,
            timeout=3600,
            check=False,
            env={**os.environ, "CUDA_VISIBLE_DEVICES": "0,1" if gpus >= 2 else "0"},
        )
        if proc.returncode != 0:
            raise SystemExit(f"arm {arm} failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}")
        results.append(json.loads(proc.stdout.strip().splitlines()[-1]))
    report: dict[str, Any] = {"arms": results}
    if len(results) == 2:
        # ordinary steps: neither the first (compile) nor the last (checkpoint + evaluation)
        def ordinary(r: dict[str, Any]) -> list[float]:
            steps = r["steps"][1:-1] or r["steps"]
            return [s["gpu_seconds"] for s in steps]

        col, sep = (sum(ordinary(r)) / len(ordinary(r)) for r in results)
        report["compare"] = {
            "gpu_seconds_per_step": {"colocated": col, "separate": sep},
            "separate/colocated": sep / col,
        }
    else:
        report["note"] = f"{gpus} GPU(s): the separate arm needs 2; only colocated measured"
    text = json.dumps(report, indent=2)
    if args.json:
        args.json.write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
