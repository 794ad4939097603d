"""Raw files -> the three search-QA splits.

D_test = the paper's seven benchmarks, ``testSize`` (100 by default) questions of each, sampled with the
spec's seed. TriviaQA has no file in the shared data: it is reported missing (``MISSING_BENCHMARKS``,
surfaced in the eval result's notes) and the other six are used. HotpotQA, 2Wiki and MuSiQue use the
R1-Searcher 500-question dev samples, whose passages the local corpus holds.
D_weight = the training questions (NQ-open train via AmbigQA + the HotpotQA/2Wiki train mix, as in the
paper's NQ + HotpotQA), de-duplicated and with test questions removed; D_harness = ``harnessSize`` of
them (seeded), disjoint from D_weight. Splitting is pure; only the loaders read files.
"""

from __future__ import annotations

import functools
import random
from pathlib import Path
from typing import Any

from search_qa.verifier import normalize
from whale.domain import DomainError, read_raw_jsonl

SUBDIR = "search_qa"
#: benchmark -> file under eval/ (None: not available on this machine)
BENCHMARKS: dict[str, str | None] = {
    "nq": "nq_test.jsonl",
    "triviaqa": None,
    "popqa": "popqa_hipporag1000.jsonl",
    "hotpotqa": "hotpotqa_dev_r1searcher500.jsonl",
    "2wikimultihopqa": "2wikimultihopqa_dev_r1searcher500.jsonl",
    "musique": "musique_dev_r1searcher500.jsonl",
    "bamboogle": "bamboogle_test.jsonl",
}
MISSING_BENCHMARKS = tuple(b for b, f in BENCHMARKS.items() if f is None)
TRAIN_FILES = ("ambigqa_train_nq_open_proxy.jsonl", "hotpotqa_2wiki_train_r1searcher.jsonl")
CORPUS_FILE = "corpus/wiki_passages.jsonl"
DEFAULT_TEST_PER_BENCHMARK = 100

Row = dict[str, Any]


class DataError(DomainError):
    """A raw data file is missing or malformed; the message names the file and the fix."""


def read_jsonl(path: Path) -> list[Row]:
    return read_raw_jsonl(path, SUBDIR, DataError)


def to_item(row: Row, source: str, subset: str | None = None) -> Row:
    """The raw row format: {"id", "question", "golden_answers"} (+ the benchmark as ``subset``)."""
    q, golds = row.get("question"), row.get("golden_answers")
    if isinstance(golds, str):
        golds = [golds]
    if not isinstance(q, str) or not q.strip() or not golds or not all(isinstance(g, str) for g in golds):
        raise DataError(f"{source}: row {row.get('id')!r} needs a 'question' and a list of 'golden_answers'")
    item = {"id": str(row["id"]), "question": q.strip(), "golden_answers": list(golds)}
    if subset:
        item["id"] = f"{subset}/{item['id']}"
        item["subset"] = subset
    return item


def make_splits(
    tests: dict[str, list[Row]],
    train: list[Row],
    *,
    seed: int,
    harness_size: int,
    weight_size: int | None = None,
    test_size: int | None = None,
) -> dict[str, list[Row]]:
    """Pure split. Test: ``test_size`` per benchmark (seeded, source order kept); train de-duplicated by
    normalised question with every test question removed, shuffled, head = D_harness, rest = D_weight."""
    per = test_size or DEFAULT_TEST_PER_BENCHMARK
    test: list[Row] = []
    for name in sorted(tests):
        rows = tests[name]
        if per < len(rows):
            keep = set(random.Random(f"{seed}:{name}").sample(range(len(rows)), per))
            rows = [r for i, r in enumerate(rows) if i in keep]
        test.extend(rows)
    seen = {normalize(r["question"]) for rows in tests.values() for r in rows}
    pool = []
    for row in sorted(train, key=lambda r: r["id"]):
        k = normalize(row["question"])
        if k not in seen:
            seen.add(k)
            pool.append(row)
    if harness_size >= len(pool):
        raise DataError(f"spec.data.harnessSize={harness_size} leaves nothing for D_weight ({len(pool)} questions)")
    random.Random(seed).shuffle(pool)
    weight = pool[harness_size:]
    if weight_size is not None:
        weight = weight[:weight_size]
    return {"weight": weight, "harness": pool[:harness_size], "test": test}


@functools.lru_cache(maxsize=8)
def _load(root: str, seed: int, harness_size: int, weight_size: int | None,
          test_size: int | None) -> dict[str, list[Row]]:
    base = Path(root) / SUBDIR
    tests = {
        name: [to_item(r, f, name) for r in read_jsonl(base / "eval" / f)]
        for name, f in BENCHMARKS.items()
        if f is not None
    }
    train = [to_item(r, f) for f in TRAIN_FILES for r in read_jsonl(base / "train" / f)]
    return make_splits(tests, train, seed=seed, harness_size=harness_size, weight_size=weight_size,
                       test_size=test_size)


def load_splits(root: Path, *, seed: int = 0, harness_size: int = 256, weight_size: int | None = None,
                test_size: int | None = None) -> dict[str, list[Row]]:
    """All three splits (cached per settings, so ``split_sizes`` and the workloads share one parse)."""
    splits = _load(str(Path(root).resolve()), seed, harness_size, weight_size, test_size)
    return {name: list(rows) for name, rows in splits.items()}


def corpus_path(root: Path) -> Path:
    return Path(root) / SUBDIR / CORPUS_FILE
