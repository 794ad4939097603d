"""Answer-in-top-k hit rate of the retriever per split: how answerable D_weight, D_harness and each
benchmark of D_test are with the corpus, whatever the model does.

    python -m search_qa.hitrate [--method bm25|dense] [--corpus local|wiki18] [--train answerable|all]
        [--k 1 3 5] [--per-benchmark 100] [--sample N] [--seed 0] [--retriever-url URL | --index-dir DIR]

A question is a hit at k when a normalised gold answer appears (as a whole-word span) in the
normalised text of one of the top-k passages retrieved for the question itself. yes/no gold answers
count as misses (a passage cannot contain them meaningfully). ``--sample N`` measures a seeded sample
of N questions of D_weight and of D_harness (D_test is measured whole).
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path
from typing import Any

from search_qa.data import answer_in, corpus_path, load_splits, missing_benchmarks, resolve_corpus, train_filter_for
from search_qa.verifier import normalize
from whale.domain import default_data_root, retrieval

__all__ = ["answer_in", "hit_rates", "main", "split_rates"]


def hit_rates(
    items: list[dict], retriever: retrieval.Retriever, ks: list[int], batch: int = 64
) -> dict[str, dict[int, float]]:
    """{subset: {k: hit rate}} (pure given the retriever); items without a subset count as "all"."""
    kmax = max(ks)
    hits: dict[str, dict[int, int]] = {}
    counts: dict[str, int] = {}
    for start in range(0, len(items), batch):
        chunk = items[start : start + batch]
        results = retriever.search([i["question"] for i in chunk], kmax)
        for item, row in zip(chunk, results, strict=True):
            sub = item.get("subset", "all")
            counts[sub] = counts.get(sub, 0) + 1
            norms = [normalize(h.passage.contents) for h in row]
            for k in ks:
                hit = any(answer_in(t, item["golden_answers"]) for t in norms[:k])
                hits.setdefault(sub, {}).setdefault(k, 0)
                hits[sub][k] += int(hit)
    return {s: {k: hits[s][k] / counts[s] for k in ks} for s in sorted(counts)}


def sample(items: list[dict], n: int | None, seed: int) -> list[dict]:
    """A seeded sample of ``n`` items (order kept); all of them when ``n`` is None or not smaller."""
    if n is None or n >= len(items):
        return items
    keep = set(random.Random(f"hitrate:{seed}").sample(range(len(items)), n))
    return [it for i, it in enumerate(items) if i in keep]


def split_rates(
    splits: dict[str, list[dict]],
    retriever: retrieval.Retriever,
    ks: list[int],
    *,
    sample_size: int | None = None,
    seed: int = 0,
) -> dict[str, dict[str, Any]]:
    """{row: {"n": questions measured, "rates": {k: rate}}} for ``weight``, ``harness`` and
    ``test/<benchmark>`` (+ ``test mean``, the unweighted mean over benchmarks)."""
    out: dict[str, dict[str, Any]] = {}
    for split in ("weight", "harness"):
        items = [{**it, "subset": split} for it in sample(splits[split], sample_size, seed)]
        if items:
            out[split] = {"n": len(items), "rates": hit_rates(items, retriever, ks)[split]}
    test = splits["test"]
    per = hit_rates(test, retriever, ks)
    counts: dict[str, int] = {}
    for it in test:
        counts[it.get("subset", "all")] = counts.get(it.get("subset", "all"), 0) + 1
    for sub, rates in per.items():
        out[f"test/{sub}"] = {"n": counts[sub], "rates": rates}
    if per:
        out["test mean"] = {"n": len(test), "rates": {k: sum(r[k] for r in per.values()) / len(per) for k in ks}}
    return out


def _retriever(args: argparse.Namespace, root: Path) -> Any:
    if args.retriever_url:
        from whale.domain import RetrieverClient

        client = RetrieverClient(args.retriever_url, timeout_s=300)
        client.wait_ready(60)
        return client
    if args.index_dir:
        return retrieval.open_dense(args.index_dir)
    if resolve_corpus(args.corpus) == "wiki18":
        raise SystemExit("hitrate: --corpus wiki18 needs its retriever: --retriever-url or --index-dir")
    return retrieval.shared(corpus_path(root), args.method)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m search_qa.hitrate", description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--method", choices=retrieval.METHODS, default="bm25", help="in-process retriever of the local corpus"
    )
    p.add_argument(
        "--corpus",
        choices=("local", "wiki18"),
        default="local",
        help="the spec.experiment.domainOptions.corpus whose splits are measured",
    )
    p.add_argument(
        "--train",
        choices=("answerable", "all"),
        default=None,
        help="training questions (default: the corpus's, answerable for local)",
    )
    p.add_argument("--retriever-url", default=None, help="measure a retriever service instead")
    p.add_argument("--index-dir", type=Path, default=None, help="measure a prepared dense index instead")
    p.add_argument("--k", type=int, nargs="+", default=[1, 3, 5])
    p.add_argument("--per-benchmark", type=int, default=100)
    p.add_argument("--sample", type=int, default=None, help="questions of D_weight and D_harness measured")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--data-dir", type=Path, default=None)
    p.add_argument("--json", action="store_true", help="print JSON instead of a Markdown table")
    args = p.parse_args(argv)
    root = args.data_dir or default_data_root()
    train = args.train or train_filter_for(args.corpus)
    splits = load_splits(root, seed=args.seed, test_size=args.per_benchmark, train=train)
    retriever = _retriever(args, root)
    rows = split_rates(splits, retriever, args.k, sample_size=args.sample, seed=args.seed)
    label = args.retriever_url or (str(args.index_dir) if args.index_dir else args.method)
    if args.json:
        print(
            json.dumps(
                {
                    "retriever": label,
                    "corpus": args.corpus,
                    "train": train,
                    "rows": rows,
                    "missing": list(missing_benchmarks(root)),
                }
            )
        )
        return
    print(
        f"| split ({label}, corpus {args.corpus}, train {train}) | questions | "
        + " | ".join(f"top-{k}" for k in args.k)
        + " |"
    )
    print("|---|---|" + "---|" * len(args.k))
    for name, row in rows.items():
        print(f"| {name} | {row['n']} | " + " | ".join(f"{100 * row['rates'][k]:.1f} %" for k in args.k) + " |")
    for b in missing_benchmarks(root):
        print(f"| test/{b} | 0 | " + " | ".join("missing" for _ in args.k) + " |")


if __name__ == "__main__":
    main()
