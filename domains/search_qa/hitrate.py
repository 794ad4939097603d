"""Answer-in-top-k hit rate of the retriever on D_test, per benchmark: how answerable the questions
are with the local corpus, whatever the model does.

    python -m search_qa.hitrate [--method bm25|dense] [--k 1 3 5] [--per-benchmark 100] [--seed 0]

A question is a hit at k when a normalised gold answer appears (as a whole-word span) in the
normalised text of one of the top-k passages retrieved for the question itself. yes/no gold answers
count as misses (a passage cannot contain them meaningfully).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from search_qa.data import MISSING_BENCHMARKS, corpus_path, load_splits
from search_qa.verifier import normalize
from whale.domain import default_data_root
from whale.tools import retrieval

NON_SPAN = {"yes", "no"}


def answer_in(text_norm: str, golds: list[str]) -> bool:
    padded = f" {text_norm} "
    for g in golds:
        n = normalize(g)
        if n and n not in NON_SPAN and f" {n} " in padded:
            return True
    return False


def hit_rates(items: list[dict], retriever: retrieval.Retriever, ks: list[int], batch: int = 64) -> dict[str, dict[int, float]]:
    """{benchmark: {k: hit rate}} (pure given the retriever)."""
    kmax = max(ks)
    hits: dict[str, dict[int, int]] = {}
    counts: dict[str, int] = {}
    for start in range(0, len(items), batch):
        chunk = items[start:start + batch]
        results = retriever.search([i["question"] for i in chunk], kmax)
        for item, row in zip(chunk, results):
            sub = item.get("subset", "all")
            counts[sub] = counts.get(sub, 0) + 1
            norms = [normalize(h.passage.contents) for h in row]
            for k in ks:
                hit = any(answer_in(t, item["golden_answers"]) for t in norms[:k])
                hits.setdefault(sub, {}).setdefault(k, 0)
                hits[sub][k] += int(hit)
    return {s: {k: hits[s][k] / counts[s] for k in ks} for s in sorted(counts)}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m search_qa.hitrate", description=__doc__.split("\n\n")[0])
    p.add_argument("--method", choices=retrieval.METHODS, default="bm25")
    p.add_argument("--k", type=int, nargs="+", default=[1, 3, 5])
    p.add_argument("--per-benchmark", type=int, default=100)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--data-dir", type=Path, default=None)
    p.add_argument("--json", action="store_true", help="print JSON instead of a Markdown table")
    args = p.parse_args(argv)
    root = args.data_dir or default_data_root()
    test = load_splits(root, seed=args.seed, test_size=args.per_benchmark)["test"]
    rates = hit_rates(test, retrieval.shared(corpus_path(root), args.method), args.k)
    if args.json:
        print(json.dumps({"method": args.method, "rates": rates, "missing": list(MISSING_BENCHMARKS)}))
        return
    print(f"| benchmark ({args.method}) | " + " | ".join(f"top-{k}" for k in args.k) + " |")
    print("|---|" + "---|" * len(args.k))
    for sub, r in rates.items():
        print(f"| {sub} | " + " | ".join(f"{100 * r[k]:.0f} %" for k in args.k) + " |")
    mean = {k: sum(r[k] for r in rates.values()) / len(rates) for k in args.k}
    print("| mean | " + " | ".join(f"{100 * mean[k]:.1f} %" for k in args.k) + " |")
    for b in MISSING_BENCHMARKS:
        print(f"| {b} | " + " | ".join("missing" for _ in args.k) + " |")


if __name__ == "__main__":
    main()
