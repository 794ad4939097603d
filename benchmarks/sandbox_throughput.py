"""Code-sandbox throughput: executions/s of the math tool's sandbox (one fresh sandboxed process per
run), in-process and through the ``/run`` HTTP service, sequential and with concurrent callers.

Snippets: ``trivial`` (print a sum: the fixed cost of a sandbox) and ``sympy`` (import sympy and
factor a number: a typical model-written math snippet).

    .venv/bin/python benchmarks/sandbox_throughput.py [--runs 40] [--concurrency 1 2 4] [--json]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # for tests.fixtures.tools (the service launcher)

import httpx

from whale.tools.code import CodeLimits, execute

SNIPPETS = {
    "trivial": "print(sum(range(1000)))",
    "sympy": "import sympy\nprint(sympy.factorint(2**32 + 1))",
}


def rate(fn, runs: int, concurrency: int) -> float:
    def one(_: int) -> None:
        fn()

    start = time.perf_counter()
    with ThreadPoolExecutor(concurrency) as pool:
        list(pool.map(one, range(runs)))
    return runs / (time.perf_counter() - start)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", type=int, default=40)
    p.add_argument("--concurrency", type=int, nargs="+", default=[1, 2, 4])
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    from tests.fixtures.tools import run_service

    limits = CodeLimits()
    rows = []

    def check(result) -> None:
        if not result.ok:
            raise RuntimeError(f"benchmark snippet failed: {result.error}")

    for name, code in SNIPPETS.items():
        for c in args.concurrency:
            rows.append(
                {
                    "path": "in-process",
                    "snippet": name,
                    "concurrency": c,
                    "runs_per_s": rate(lambda code=code: check(execute(code, limits)), args.runs, c),
                }
            )
    with tempfile.TemporaryDirectory() as d:
        with (
            run_service(
                "whale.tools.code_interpreter", ["--concurrency", str(max(args.concurrency))], Path(d) / "log.txt"
            ) as svc,
            httpx.Client(timeout=120) as client,
        ):

            def via_http(code: str) -> None:
                resp = client.post(svc.url + "/run", json={"code": code})
                resp.raise_for_status()
                if resp.json()["error"] is not None:
                    raise RuntimeError(resp.json()["error"])

            for name, code in SNIPPETS.items():
                for c in args.concurrency:
                    rows.append(
                        {
                            "path": "http /run",
                            "snippet": name,
                            "concurrency": c,
                            "runs_per_s": rate(lambda code=code: via_http(code), args.runs, c),
                        }
                    )
    if args.json:
        print(json.dumps(rows, indent=2))
        return
    print("| path | snippet | concurrency | executions/s |")
    print("|---|---|---|---|")
    for r in rows:
        print(f"| {r['path']} | {r['snippet']} | {r['concurrency']} | {r['runs_per_s']:.1f} |")


if __name__ == "__main__":
    main()
