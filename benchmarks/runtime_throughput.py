"""Harness-runtime throughput next to the inference server's own ceiling, in one run.

A loopback OpenAI-compatible server (``whale.inference.server`` over a fixed-latency backend, in its
own process, as vLLM would be) answers every request after ``--latency-ms``. For each concurrency
level we measure

* the ceiling: requests/s of plain chat-completion calls at that concurrency with the HTTP library
  the runtime's client uses (aiohttp), the same connection pool size and a prebuilt body — the most
  any client of that library gets from this server;
* the raw ceiling: the same with a minimal raw-socket HTTP/1.1 client (what the server itself serves);
* the runtime: episodes/s of ``run_episodes`` (sandboxed harness process pool, env steps, traces
  written) at that concurrency through ``OpenAIClient``; each episode makes ``--turns`` requests,
  so its request rate is episodes/s x turns;

and print them side by side with the ratios runtime ÷ ceiling (target ≥ 0.9 at concurrency 64) and
runtime ÷ raw ceiling.

    .venv/bin/python benchmarks/runtime_throughput.py [--latency-ms 50] [--levels 1 8 64] [--seconds 6] [--json OUT]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import httpx

from whale.domain import Domain, Environment, StepResult
from whale.harness.runner import RunnerConfig, run_episodes
from whale.inference.base import SamplingParams
from whale.inference.openai_http import OpenAIClient
from whale.inference.server import free_port

HARNESS = """
import re
from whale.harness.api import BaseHarness, env_action


class Harness(BaseHarness):
    SYSTEM_PROMPT = "Count."
    USER_TEMPLATE = "Round {round}: answer <n>NUMBER</n>."
    MAX_TURNS = 8

    def parse_action(self, text, state):
        match = re.search(r"<n>(\\d+)</n>", text)
        return env_action(match.group(1)) if match else None
"""


class CountEnv(Environment):
    """Ends after ``turns`` answers; reward 1."""

    def __init__(self, turns: int):
        self.turns, self.answers = turns, 0

    def reset(self) -> dict[str, Any]:
        return {"round": 0}

    def step(self, action: Any) -> StepResult:
        self.answers += 1
        return StepResult({"round": self.answers}, done=self.answers >= self.turns)

    def reward(self) -> float:
        return 1.0 if self.answers >= self.turns else 0.0


class CountDomain(Domain):
    """A benchmark domain: every episode takes exactly ``turns`` model calls."""

    name = "bench-count"
    allowed_imports = frozenset({"re"})

    def __init__(self, turns: int, harness_path: Path):
        self.turns, self.harness_path = turns, harness_path

    def split_sizes(self, data: Any) -> dict[str, int]:
        return {}

    def load_split(self, split: str, data: Any, store: Any = None) -> list[dict[str, Any]]:
        return []

    def make_env(self, item: dict[str, Any]) -> Environment:
        return CountEnv(self.turns)

    def h0_path(self) -> Path:
        return self.harness_path

    def skill_path(self) -> Path:
        return self.harness_path


def serve(port: int, latency_ms: float) -> None:
    """The server process: fixed-latency backend behind the OpenAI-compatible app."""
    import uvicorn

    from whale.inference.scripted import FixedLatencyClient
    from whale.inference.server import create_app

    app = create_app(FixedLatencyClient("<n>1</n>", latency_ms / 1000.0), "fixed-latency")
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning", access_log=False)


@contextlib.contextmanager
def fixed_latency_server(latency_ms: float) -> Iterator[str]:
    """The fixed-latency server in its own process (as vLLM would be); yields its ``/v1`` URL."""
    port = free_port()
    server = subprocess.Popen(
        [sys.executable, __file__, "--serve", str(port), "--latency-ms", str(latency_ms)],
        env={
            **os.environ,
            "PYTHONPATH": os.pathsep.join(
                filter(None, [str(Path(__file__).resolve().parents[1]), os.environ.get("PYTHONPATH")])
            ),
        },
    )
    try:
        url = f"http://127.0.0.1:{port}/v1"
        wait_ready(url)
        yield url
    finally:
        server.terminate()
        server.wait(timeout=10)


def burst_shape(spans: list[tuple[float, float]]) -> dict[str, float]:
    """How a burst of model calls filled its time: ``ramp_s`` from the first call sent to the last one,
    ``drain_s`` from the first answer to the last, ``mean_in_flight`` the calls in flight on average over
    the time any was (their summed durations over that union). A replay sends everything at once; a runtime
    whose calls trickle out (harness hooks queueing) shows a longer ramp and fewer in flight."""
    if not spans:
        return {"ramp_s": 0.0, "drain_s": 0.0, "mean_in_flight": 0.0}
    covered, edge = 0.0, float("-inf")
    for start, end in sorted(spans):
        if end > edge:
            covered += end - max(start, edge)
            edge = end
    starts, ends = [s for s, _ in spans], [e for _, e in spans]
    return {
        "ramp_s": max(starts) - min(starts),
        "drain_s": max(ends) - min(ends),
        "mean_in_flight": sum(e - s for s, e in spans) / covered if covered else 0.0,
    }


async def send_all(
    client: OpenAIClient, calls: list[dict[str, Any]]
) -> tuple[list[Any], list[tuple[float, float]], float]:
    """Every recorded call (``messages``, ``sampling``, ``n``, ``tools``) sent at once through ``client``: the
    results in order, each call's in-flight span (for :func:`burst_shape`) and the wall seconds of them all."""
    spans: list[tuple[float, float]] = []

    async def one(c: dict[str, Any]) -> Any:
        start = time.perf_counter()
        result = await client.chat(c["messages"], c["sampling"], c["n"], c["tools"])
        spans.append((start, time.perf_counter()))
        return result

    start = time.perf_counter()
    results = await asyncio.gather(*(one(c) for c in calls))
    return list(results), spans, time.perf_counter() - start


def wait_ready(url: str, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{url}/models", timeout=1.0).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise TimeoutError(f"benchmark server at {url} not ready after {timeout_s} s")


async def _raw_call(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, request: bytes) -> None:
    writer.write(request)
    head = await reader.readuntil(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1])
    length = next(
        int(line.split(b":", 1)[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length:")
    )
    await reader.readexactly(length)
    if status != 200:
        raise RuntimeError(f"benchmark server answered HTTP {status}")


def pool_size(concurrency: int) -> int:
    """The runtime's connection pool at this concurrency (as ``whale.inference.factory`` sizes it)."""
    return max(16, concurrency)


def _chat_body() -> bytes:
    return json.dumps(
        {
            "model": "fixed-latency",
            "messages": [{"role": "user", "content": "Round 0: answer <n>NUMBER</n>."}],
            "max_tokens": 16,
        }
    ).encode()


async def _closed_loop(concurrency: int, seconds: float, call) -> float:  # an async callable
    """Requests/s of ``concurrency`` callers each calling ``call()`` back to back for ``seconds``."""
    done = 0
    deadline = time.perf_counter() + seconds

    async def caller() -> None:
        nonlocal done
        while time.perf_counter() < deadline:
            await call()
            done += 1

    started = time.perf_counter()
    await asyncio.gather(*[caller() for _ in range(concurrency)])
    return done / (time.perf_counter() - started)


async def ceiling(url: str, concurrency: int, seconds: float) -> float:
    """Requests/s through aiohttp (the runtime client's library) with the runtime's pool size."""
    body, target = _chat_body(), f"{url}/chat/completions"
    connector = aiohttp.TCPConnector(limit=pool_size(concurrency), limit_per_host=0)
    async with aiohttp.ClientSession(connector=connector, headers={"Content-Type": "application/json"}) as session:

        async def call() -> None:
            async with session.post(target, data=body) as response:
                json.loads(await response.read())
                if response.status != 200:
                    raise RuntimeError(f"benchmark server answered HTTP {response.status}")

        return await _closed_loop(concurrency, seconds, call)


async def raw_ceiling(url: str, concurrency: int, seconds: float) -> float:
    """Requests/s to ``concurrency`` keep-alive connections of a minimal raw HTTP/1.1 client."""
    host, port = url.split("//", 1)[1].split("/", 1)[0].split(":")
    body = _chat_body()
    request = (
        f"POST /v1/chat/completions HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode() + body
    connections = [await asyncio.open_connection(host, int(port)) for _ in range(concurrency)]

    async def call() -> None:
        reader, writer = connections.pop()
        try:
            await _raw_call(reader, writer, request)
        finally:
            connections.append((reader, writer))

    try:
        return await _closed_loop(concurrency, seconds, call)
    finally:
        for _, writer in connections:
            writer.close()


async def runtime(url: str, domain: CountDomain, concurrency: int, episodes: int) -> tuple[float, int, float, float]:
    """(episodes/s, episodes that ended with an error, runtime-process CPU ms per episode, harness-process
    CPU ms per episode) for ``episodes`` episodes at ``concurrency``. CPU per episode is the headroom
    figure: it says at what rate the runtime would saturate a core, whatever this server's ceiling."""
    items = [{"id": f"e{i}"} for i in range(episodes)]
    traces = Path(tempfile.mkdtemp(prefix="bench-traces-")) / "traces.jsonl"
    async with OpenAIClient(url, model="fixed-latency", max_connections=pool_size(concurrency)) as client:
        started, cpu, children = time.perf_counter(), time.process_time(), _children_cpu()
        result = await run_episodes(
            domain,
            domain.h0_path(),
            client,
            items,
            SamplingParams(max_tokens=16),
            config=RunnerConfig(max_concurrency=concurrency),
            traces=traces,
        )
        elapsed, cpu = time.perf_counter() - started, time.process_time() - cpu
    children = _children_cpu() - children  # the harness processes, reaped when run_episodes returns
    errors = sum(1 for e in result if e.end == "error")
    return episodes / elapsed, errors, cpu * 1000 / episodes, children * 1000 / episodes


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


async def measure(
    url: str, domain: CountDomain, levels: list[int], seconds: float, latency_ms: float
) -> list[dict[str, Any]]:
    rows = []
    for concurrency in levels:
        raw = await raw_ceiling(url, concurrency, seconds)
        cap = await ceiling(url, concurrency, seconds)
        # size the episode count so the run lasts about `seconds` at the ceiling
        episodes = max(concurrency * 2, int(cap * seconds / domain.turns))
        eps, errors, cpu_ms, harness_cpu_ms = await runtime(url, domain, concurrency, episodes)
        rows.append(
            {
                "concurrency": concurrency,
                "raw_ceiling_rps": raw,
                "ceiling_rps": cap,
                "episodes_per_s": eps,
                "runtime_rps": eps * domain.turns,
                "ratio": eps * domain.turns / cap,
                "ratio_raw": eps * domain.turns / raw,
                "episodes": episodes,
                "errors": errors,
                "runtime_cpu_ms_per_episode": cpu_ms,
                "harness_cpu_ms_per_episode": harness_cpu_ms,
                "latency_ms": latency_ms,
                "turns": domain.turns,
                "pool": pool_size(concurrency),
                "cpus": os.cpu_count(),
            }
        )
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--latency-ms", type=float, default=50.0)
    parser.add_argument("--levels", type=int, nargs="+", default=[1, 8, 64])
    parser.add_argument("--seconds", type=float, default=6.0, help="measuring time per level and side")
    parser.add_argument("--turns", type=int, default=2, help="model calls per episode")
    parser.add_argument("--json", type=Path, default=None, metavar="OUT", help="also write the rows as JSON to OUT")
    parser.add_argument("--serve", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve is not None:
        serve(args.serve, args.latency_ms)
        return 0

    with fixed_latency_server(args.latency_ms) as url, tempfile.TemporaryDirectory() as tmp:
        harness = Path(tmp) / "count_harness.py"
        harness.write_text(HARNESS)
        rows = asyncio.run(measure(url, CountDomain(args.turns, harness), args.levels, args.seconds, args.latency_ms))
    print(
        f"runtime throughput vs server ceiling (latency {args.latency_ms:g} ms/request, {args.turns} requests/episode, "
        f"{os.cpu_count()} CPUs; ceiling = aiohttp at the runtime's pool size, raw = raw sockets)"
    )
    print(
        f"{'concurrency':>11} {'raw req/s':>10} {'ceiling req/s':>14} {'episodes/s':>11} {'runtime req/s':>14} "
        f"{'ratio':>6} {'vs raw':>6} {'errors':>6} {'cpu ms/ep':>9} {'harness ms/ep':>13}"
    )
    for row in rows:
        print(
            f"{row['concurrency']:>11} {row['raw_ceiling_rps']:>10.1f} {row['ceiling_rps']:>14.1f} "
            f"{row['episodes_per_s']:>11.1f} {row['runtime_rps']:>14.1f} {row['ratio']:>6.0%} "
            f"{row['ratio_raw']:>6.0%} {row['errors']:>6} {row['runtime_cpu_ms_per_episode']:>9.2f} "
            f"{row['harness_cpu_ms_per_episode']:>13.2f}"
        )
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(rows, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
