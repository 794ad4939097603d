"""Raw files -> the three math splits.

D_test is AIME 2024 + AIME 2025 (60 problems, their ids kept). D_harness (256 by default) and D_weight
come from one shuffled pool, the MATH train problems with numeric answers (``math_train_numeric.jsonl``),
so they are disjoint by construction; GSM8K can be added to the pool as an easier curriculum.
Splitting is pure (rows in, rows out); only :func:`read_jsonl` and :func:`load_splits` touch files.
"""

from __future__ import annotations

import functools
import random
from pathlib import Path
from typing import Any

from whale.domain import DomainError, read_raw_jsonl

SUBDIR = "math_reasoning"
TEST_FILES = ("aime_2024.jsonl", "aime_2025.jsonl")
POOL_FILE = "math_train_numeric.jsonl"
GSM8K_FILE = "gsm8k_train.jsonl"

Row = dict[str, Any]


class DataError(DomainError):
    """A raw data file is missing or malformed; the message names the file and the fix."""


def read_jsonl(path: Path) -> list[Row]:
    return read_raw_jsonl(path, SUBDIR, DataError)


def to_item(row: Row, source: str) -> Row:
    """The raw row format replay and the environment use: {"id", "problem", "answer"} (+ provenance)."""
    problem = row.get("problem", row.get("question"))
    answer = row.get("answer")
    if not isinstance(problem, str) or not problem.strip() or answer is None or not str(answer).strip():
        raise DataError(f"{source}: row {row.get('id')!r} needs a non-empty 'problem' and 'answer'")
    return {"id": str(row["id"]), "problem": problem, "answer": str(answer).strip(), "source": source}


def _key(problem: str) -> str:
    return " ".join(problem.split()).lower()


def dedup(rows: list[Row], exclude: set[str] = frozenset()) -> list[Row]:
    """Drop repeated problems (first wins) and any problem that is also a test problem."""
    seen = set(exclude)
    out = []
    for row in rows:
        k = _key(row["problem"])
        if k not in seen:
            seen.add(k)
            out.append(row)
    return out


def make_splits(
    test: list[Row],
    pool: list[Row],
    *,
    seed: int,
    harness_size: int,
    weight_size: int | None = None,
    test_size: int | None = None,
) -> dict[str, list[Row]]:
    """Pure split: a seeded shuffle of the de-duplicated pool; its head is D_harness, the rest D_weight."""
    pool = dedup(sorted(pool, key=lambda r: r["id"]), {_key(r["problem"]) for r in test})
    if harness_size >= len(pool):
        raise DataError(
            f"spec.data.harnessSize={harness_size} leaves nothing for D_weight (pool has {len(pool)} problems)"
        )
    order = list(pool)
    random.Random(seed).shuffle(order)
    harness = order[:harness_size]
    weight = order[harness_size:]
    if weight_size is not None:
        weight = weight[:weight_size]
    if test_size is not None and test_size < len(test):
        keep = set(random.Random(seed).sample(range(len(test)), test_size))
        test = [r for i, r in enumerate(test) if i in keep]
    return {"weight": weight, "harness": harness, "test": list(test)}


@functools.lru_cache(maxsize=8)
def _load(root: str, seed: int, harness_size: int, weight_size: int | None, test_size: int | None,
          gsm8k: bool) -> dict[str, list[Row]]:
    base = Path(root) / SUBDIR
    test = [to_item(r, name) for name in TEST_FILES for r in read_jsonl(base / name)]
    pool = [to_item(r, POOL_FILE) for r in read_jsonl(base / POOL_FILE)]
    if gsm8k:
        pool += [to_item(r, GSM8K_FILE) for r in read_jsonl(base / GSM8K_FILE)]
    return make_splits(test, pool, seed=seed, harness_size=harness_size, weight_size=weight_size,
                       test_size=test_size)


def load_splits(root: Path, *, seed: int = 0, harness_size: int = 256, weight_size: int | None = None,
                test_size: int | None = None, gsm8k: bool = False) -> dict[str, list[Row]]:
    """All three splits (cached per settings: ``split_sizes`` and the workloads share one parse)."""
    splits = _load(str(Path(root).resolve()), seed, harness_size, weight_size, test_size, gsm8k)
    return {name: list(rows) for name, rows in splits.items()}
