"""Peak memory of the runtime under a harness that loops tool actions with 1 MiB messages (issue 27).

Runs ``--episodes`` episodes of the looping harness of ``tests/security/test_episode_bounds.py`` (a real
sandboxed harness process, the guess-the-number test domain whose ``hint`` tool answers at once) once per
mode, each in a fresh process so peak RSS is its own:

* ``bounded``: the default ``spec.execution.sandbox.episode`` bounds (the message bound ends every episode at once);
* ``lifted``: actions, message and episode bytes unbounded, only ``--seconds`` of wall time per episode
  (what an unbounded loop grows to in that time).

    PYTHONPATH=. .venv/bin/python benchmarks/episode_bounds_memory.py [--episodes 16] [--seconds 10] [--json OUT]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import resource
import subprocess
import sys
import tempfile
from pathlib import Path


def measure(mode: str, episodes: int, seconds: float) -> dict[str, object]:
    from tests.fixtures.guess_domain import GuessNumberDomainDouble
    from tests.security.test_episode_bounds import LOOP
    from whale.harness.runner import EpisodeBounds, RunnerConfig, run_episodes
    from whale.inference.base import SamplingParams
    from whale.inference.scripted import ScriptedClient

    bounds = (
        EpisodeBounds()
        if mode == "bounded"
        else EpisodeBounds(max_actions=10**9, max_message_bytes=1 << 40, max_episode_bytes=1 << 50, timeout_s=seconds)
    )

    async def run() -> list[str]:
        path = Path(tempfile.mkdtemp()) / "loop.py"
        path.write_text(LOOP.format(size=1 << 20))
        domain = GuessNumberDomainDouble([{"id": f"g{i}", "secret": 7} for i in range(episodes)])
        config = RunnerConfig(max_concurrency=episodes, bounds=bounds)
        done = await run_episodes(
            domain, path, ScriptedClient([]), domain.items, SamplingParams(), config=config, processes=1
        )
        return [e.end for e in done]

    ends = asyncio.run(run())
    return {
        "mode": mode,
        "episodes": episodes,
        "ends": sorted(set(ends)),
        "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--episodes", type=int, default=16)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--mode", choices=["bounded", "lifted"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.mode:
        print(json.dumps(measure(args.mode, args.episodes, args.seconds)))
        return
    rows = []
    for mode in ("bounded", "lifted"):
        out = subprocess.run(
            [
                sys.executable,
                __file__,
                "--mode",
                mode,
                "--episodes",
                str(args.episodes),
                "--seconds",
                str(args.seconds),
            ],
            check=True,
            capture_output=True,
            text=True,
        )
        rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
        print(rows[-1])
    if args.json:
        args.json.write_text(json.dumps({"benchmark": "episode_bounds_memory", "results": rows}, indent=2) + "\n")


if __name__ == "__main__":
    main()
