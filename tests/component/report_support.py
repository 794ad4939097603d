"""Real stores for report tests: the local runner drives each condition with the simulated workloads
(tests/workloads/simulated.py writes exactly what the real workloads write), so a report reads a store
laid out by the real controller — status.json, metrics lines, results, checkpoints, accepted harnesses."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from whale.core.spec import WhaleRunSpec
from whale.core.status import RunPhase, WhaleRunStatus
from whale.runner.local import LocalRunner
from whale.store import open_store

SIM = (sys.executable, "-m", "tests.workloads.simulated")
SIZES = {"weight": 2560, "harness": 4, "test": 10}

#: the three conditions the paper compares, as small simulated runs (16 rollouts/step, 4/iteration)
CONDITIONS: dict[str, dict] = {
    "sim-rsft-only": {"condition": "rsft_only", "schedule": {"totalSteps": 6}},
    "sim-mh-only": {"condition": "mh_only", "schedule": {"mhOnlyIterations": 3}},
    "sim-whale": {
        "condition": "whale",
        "schedule": {"totalSteps": 6, "weightStepsPerCycle": 3, "harnessIterationsPerCycle": 2},
    },
}


def spec_for(name: str, **extra) -> WhaleRunSpec:
    c = CONDITIONS[name]
    return WhaleRunSpec.model_validate(
        {
            "domain": "counting",
            "condition": c["condition"],
            "model": {"name": "tiny"},
            "schedule": c["schedule"],
            # 2 prompts x 8 rollouts = the 16 rollouts per step the simulated train workload reports
            "rsft": {"promptsPerStep": 2, "rolloutsPerPrompt": 8},
            "evaluation": {"intervalSteps": 2},
            "retry": {"maxAttempts": 2},
            **extra,
        }
    )


def simulated_run(store_dir: Path, name: str, workdir: Path, sim: dict | None = None, **extra) -> WhaleRunStatus:
    """Run condition ``name`` to the end in the store at ``store_dir``; returns the final status."""
    store = open_store(str(store_dir))
    runner = LocalRunner(
        name=name,
        spec=spec_for(name, **extra),
        store=store,
        split_sizes=SIZES,
        workdir=workdir,
        workload_command=SIM,
        env={"WHALE_SIM": json.dumps(sim or {})},
        poll_interval_s=0.05,
    )
    status = runner.run(max_seconds=90)
    if status.phase is not RunPhase.SUCCEEDED:
        raise RuntimeError(f"simulated run {name} ended {status.phase.value}: {status.message}")
    return status
