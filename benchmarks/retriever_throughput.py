"""Retriever throughput: queries/s of BM25 and dense (MiniLM + FAISS) over the shipped search corpus,
in-process (batch 1 and batch 64) and through the ``/retrieve`` HTTP service (concurrent clients).

Queries are the real D_test questions (600). Index build time is reported separately (cold = built
into an empty cache, warm = loaded from the cache).

    .venv/bin/python benchmarks/retriever_throughput.py [--methods bm25 dense] [--queries 600] [--json]
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

from search_qa.data import corpus_path, load_splits
from whale.domain import default_data_root
from whale.tools import retrieval_index


def qps_inprocess(r: retrieval_index.Retriever, queries: list[str], batch: int, topk: int) -> float:
    start = time.perf_counter()
    for i in range(0, len(queries), batch):
        r.search(queries[i : i + batch], topk)
    return len(queries) / (time.perf_counter() - start)


def qps_service(url: str, queries: list[str], clients: int, topk: int) -> float:
    def one(q: str) -> None:
        resp = client.post(url + "/retrieve", json={"queries": [q], "topk": topk})
        resp.raise_for_status()

    with httpx.Client(timeout=60, limits=httpx.Limits(max_connections=clients)) as client:
        one(queries[0])
        start = time.perf_counter()
        with ThreadPoolExecutor(clients) as pool:
            list(pool.map(one, queries))
        return len(queries) / (time.perf_counter() - start)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--methods", nargs="+", default=["bm25", "dense"], choices=retrieval_index.METHODS)
    p.add_argument("--queries", type=int, default=600)
    p.add_argument("--topk", type=int, default=3)
    p.add_argument("--clients", type=int, default=8)
    p.add_argument("--cache-dir", type=Path, default=None, help="index cache (default: the user cache)")
    p.add_argument("--threads", type=int, default=1, help="torch/FAISS threads (service and in-process; 0 = default)")
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    from tests.fixtures.tools import run_service

    root = default_data_root()
    corpus = corpus_path(root)
    queries = [i["question"] for i in load_splits(root, seed=0)["test"]][: args.queries]
    if args.threads > 0 and "dense" in args.methods:
        retrieval_index.set_threads(args.threads)
    rows = []
    for method in args.methods:
        row: dict[str, float | str] = {"method": method}
        if method == "bm25":  # cold build is cheap enough to measure every time
            with tempfile.TemporaryDirectory() as d:
                t = time.perf_counter()
                retrieval_index.build(corpus, method, Path(d))
                row["build_cold_s"] = time.perf_counter() - t
        t = time.perf_counter()
        retriever = retrieval_index.build(corpus, method, args.cache_dir)
        row["load_s"] = time.perf_counter() - t
        retriever.search(queries[:4], args.topk)  # warm-up
        row["qps_batch1"] = qps_inprocess(retriever, queries, 1, args.topk)
        row["qps_batch64"] = qps_inprocess(retriever, queries, 64, args.topk)
        with tempfile.TemporaryDirectory() as d:
            extra = ["--cache-dir", str(args.cache_dir)] if args.cache_dir else []
            extra += ["--threads", str(args.threads)]
            with run_service(
                "whale.tools.retriever_service",
                ["--corpus", str(corpus), "--method", method, *extra],
                Path(d) / "log.txt",
            ) as svc:
                row[f"qps_http_{args.clients}clients"] = qps_service(svc.url, queries, args.clients, args.topk)
        rows.append(row)
    if args.json:
        print(json.dumps(rows, indent=2))
        return
    keys = [k for k in rows[0] if k != "method"] if rows else []
    keys = sorted({k for r in rows for k in r if k != "method"}, key=lambda k: keys.index(k) if k in keys else 99)
    print("| method | " + " | ".join(keys) + " |")
    print("|---|" + "---|" * len(keys))
    for r in rows:
        print(f"| {r['method']} | " + " | ".join(f"{r[k]:.2f}" if k in r else "-" for k in keys) + " |")


if __name__ == "__main__":
    main()
