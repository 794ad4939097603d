"""One RSFT step's burst of rollouts through the harness runtime, next to a replay of the same calls, in one run.

An RSFT step starts ``prompts x rollouts`` episodes at once and waits for the last. What it pays for
generation is the span from the first model call sent to the last answered (what ``benchmarks/rsft_step.py``
reports as generation). Against a loopback server with a fixed service time (``whale.inference.server``
over a fixed-latency backend, in its own process, as vLLM would be), this script measures that span

* for the sampler as it was: one sandboxed harness process answering every episode's hooks, one request
  per rollout (``EpisodeRunner`` over a one-process pool, ``share_first_turn`` off);
* for ``whale.rsft.sampling.HarnessSampler`` as the train workload runs it: a pool of harness processes, and
  an item's rollouts sharing one ``n=rollouts`` first request;

and, right after each, for a replay of exactly the calls it made (same messages and ``n``) all sent at
once through the same client library: the most any client gets from this server for those calls. The
ratio replay span / runtime span is the share of the server's speed the runtime keeps (the rollouts-vs-
ceiling figure of issue 17). With a fixed service time the server does not model a GPU's batching: the
figures isolate what the runtime adds (hooks queueing, the client), not what prefill sharing saves on vLLM.

    .venv/bin/python benchmarks/rollout_burst.py [--prompts 96] [--rollouts 8] [--latency-ms 3000] [--json OUT]
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
for _path in (HERE.parent, HERE):
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))

from runtime_throughput import HARNESS, CountDomain, burst_shape, fixed_latency_server, send_all  # noqa: E402

from whale.harness.process import HarnessPool  # noqa: E402
from whale.harness.runner import EpisodeRunner, RunnerConfig  # noqa: E402
from whale.inference.base import ChatResult, InferenceClient, SamplingParams  # noqa: E402
from whale.inference.openai_http import OpenAIClient  # noqa: E402
from whale.rsft.sampling import HarnessSampler  # noqa: E402

SAMPLING = SamplingParams(max_tokens=16)


class RecordingClient(InferenceClient):
    """Delegates to an OpenAIClient and records each call as sent (messages copied: the runtime appends the
    reply to the same list afterwards) with its in-flight span."""

    def __init__(self, inner: OpenAIClient):
        self.inner = inner
        self.model = inner.model
        self.calls: list[dict[str, Any]] = []
        self.spans: list[tuple[float, float]] = []

    async def chat(
        self,
        messages: list[dict[str, Any]],
        sampling: SamplingParams,
        n: int = 1,
        tools: list[dict[str, Any]] | None = None,
    ) -> ChatResult:
        sent = copy.deepcopy(messages)
        start = time.perf_counter()
        result = await self.inner.chat(messages, sampling, n, tools)
        self.spans.append((start, time.perf_counter()))
        self.calls.append({"messages": sent, "sampling": sampling, "n": n, "tools": tools})
        return result

    async def aclose(self) -> None:
        await self.inner.aclose()


def _pool_size(prompts: int, rollouts: int) -> int:
    return max(16, prompts * rollouts)


def summary(label: str, spans: list[tuple[float, float]], wall: float, completions: int) -> dict[str, Any]:
    shape = burst_shape(spans)
    span = (max(e for _, e in spans) - min(s for s, _ in spans)) if spans else 0.0
    return {
        "row": label,
        "requests": len(spans),
        "completions": completions,
        "span_s": span,
        "wall_s": wall,
        **shape,
    }


async def replay(url: str, calls: list[dict[str, Any]], pool: int) -> tuple[list[tuple[float, float]], float, int]:
    """The calls again, all at once, through the same client library and pool size."""
    client = OpenAIClient(url, model="fixed-latency", max_connections=pool)
    try:
        results, spans, wall = await send_all(client, calls)
    finally:
        await client.aclose()
    return spans, wall, sum(len(r.completions) for r in results)


def before(url: str, domain: CountDomain, items: list[dict[str, Any]], rollouts: int) -> dict[str, Any]:
    """The sampler as it was: one harness process, a request per rollout."""

    async def go() -> tuple[RecordingClient, float]:
        client = RecordingClient(
            OpenAIClient(url, model="fixed-latency", max_connections=_pool_size(len(items), rollouts))
        )
        try:
            async with HarnessPool(domain.h0_path(), domain.allowed_imports, processes=1) as harness:
                runner = EpisodeRunner(
                    domain, harness, client, SAMPLING, RunnerConfig(max_concurrency=len(items) * rollouts)
                )
                start = time.perf_counter()
                episodes = await runner.run(items, k=rollouts)
                wall = time.perf_counter() - start
        finally:
            await client.aclose()
        assert all(e.end != "error" for e in episodes), [e.error for e in episodes if e.error][:3]
        return client, wall

    client, wall = asyncio.run(go())
    return {"client": client, "wall": wall}


def sampler(
    url: str, domain: CountDomain, items: list[dict[str, Any]], rollouts: int, processes: int | None
) -> dict[str, Any]:
    """``HarnessSampler`` as the train workload runs it."""
    client = RecordingClient(OpenAIClient(url, model="fixed-latency", max_connections=_pool_size(len(items), rollouts)))
    with HarnessSampler(
        domain, domain.h0_path(), client, SAMPLING, max_concurrency=len(items) * rollouts, processes=processes
    ) as s:
        start = time.perf_counter()
        trajectories = s.sample(items, list(range(len(items))), rollouts, seed=0)
        wall = time.perf_counter() - start
    assert len(trajectories) == len(items) * rollouts
    return {"client": client, "wall": wall, "processes": len(s._pool.workers) if s._pool else None}


def measure(url: str, harness: Path, prompts: int, rollouts: int, processes: int | None) -> list[dict[str, Any]]:
    domain = CountDomain(1, harness)
    items = [{"id": f"p{i}"} for i in range(prompts)]
    pool = _pool_size(prompts, rollouts)
    rows = []
    for label, run in (
        ("one harness process, a request per rollout (before)", lambda: before(url, domain, items, rollouts)),
        (
            "HarnessSampler: process pool, shared first request",
            lambda: sampler(url, domain, items, rollouts, processes),
        ),
    ):
        out = run()
        client: RecordingClient = out["client"]
        completions = sum(c["n"] for c in client.calls)
        row = summary(label, client.spans, out["wall"], completions)
        spans, wall, got = asyncio.run(replay(url, client.calls, pool))
        row["replay"] = summary("replay of the same calls, all at once", spans, wall, got)
        row["span_ratio"] = row["replay"]["span_s"] / row["span_s"] if row["span_s"] else None
        row["harness_processes"] = out.get("processes", 1)
        rows.append(row)
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=96)
    parser.add_argument("--rollouts", type=int, default=8)
    parser.add_argument("--latency-ms", type=float, default=3000.0, help="the server's time per request")
    parser.add_argument("--processes", type=int, default=None, help="harness pool size (default: the sampler's)")
    parser.add_argument("--json", type=Path, default=None, metavar="OUT", help="also write the rows as JSON to OUT")
    args = parser.parse_args(argv)
    for name in ("prompts", "rollouts"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be at least 1")
    with fixed_latency_server(args.latency_ms) as url, tempfile.TemporaryDirectory() as tmp:
        harness = Path(tmp) / "count_harness.py"
        harness.write_text(HARNESS)
        rows = measure(url, harness, args.prompts, args.rollouts, args.processes)
    print(
        f"one step's burst: {args.prompts} prompts x {args.rollouts} rollouts, {args.latency_ms:g} ms a request, "
        f"{os.cpu_count()} CPUs; span = first call sent to last answered"
    )
    print(
        f"{'runtime':<52} {'procs':>5} {'requests':>8} {'span s':>7} {'ramp s':>7} {'in flight':>9} "
        f"{'replay span s':>13} {'replay/runtime':>14}"
    )
    for row in rows:
        print(
            f"{row['row']:<52} {row['harness_processes']:>5} {row['requests']:>8} {row['span_s']:>7.3f} "
            f"{row['ramp_s']:>7.3f} {row['mean_in_flight']:>9.0f} {row['replay']['span_s']:>13.3f} "
            f"{row['span_ratio']:>14.1%}"
        )
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        meta = {
            "prompts": args.prompts,
            "rollouts": args.rollouts,
            "latency_ms": args.latency_ms,
            "cpus": os.cpu_count(),
        }
        args.json.write_text(json.dumps({"meta": meta, "rows": rows}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
