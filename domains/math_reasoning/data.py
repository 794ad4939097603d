"""Raw files -> the three math splits.

Two problem sets (``spec.experiment.domainOptions.mathSet``):

* ``aime`` (the paper's): D_test is AIME 2024 + AIME 2025 (60 problems, their ids kept). D_harness (256 by
  default) and D_weight come from one shuffled pool, the MATH train problems with numeric answers
  (``math_train_numeric.jsonl``), so they are disjoint by construction; GSM8K train can be added to the pool
  as an easier curriculum (``gsm8k=True``, library only).
* ``gsm8k`` (grade-school word problems, for small models on a CPU): D_harness and D_weight come from the
  GSM8K train problems, D_test from the GSM8K test problems (1,319), so a model whose AIME score can only be
  0 has a task whose score can move. The same caps apply (``harnessSize``, ``weightSize``, ``testSize``).

Splitting is pure (rows in, rows out); only :func:`read_jsonl` and :func:`load_splits` touch files.
"""

from __future__ import annotations

import functools
import random
from collections.abc import Set
from pathlib import Path
from typing import Any

from whale.domain import DomainError, read_raw_jsonl

SUBDIR = "math_reasoning"
TEST_FILES = ("aime_2024.jsonl", "aime_2025.jsonl")
POOL_FILE = "math_train_numeric.jsonl"
GSM8K_FILE = "gsm8k_train.jsonl"
GSM8K_TEST_FILE = "gsm8k_test.jsonl"
#: the problem sets ``spec.experiment.domainOptions.mathSet`` names: (D_test files, pool files)
MATH_SETS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "aime": (TEST_FILES, (POOL_FILE,)),
    "gsm8k": ((GSM8K_TEST_FILE,), (GSM8K_FILE,)),
}

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


def dedup(rows: list[Row], exclude: Set[str] = frozenset()) -> list[Row]:
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
            f"spec.experiment.data.harnessSize={harness_size} leaves nothing for D_weight (pool has {len(pool)} problems)"
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
def _load(
    root: str, seed: int, harness_size: int, weight_size: int | None, test_size: int | None, gsm8k: bool, math_set: str
) -> dict[str, list[Row]]:
    base = Path(root) / SUBDIR
    test_files, pool_files = MATH_SETS[math_set]
    test = [to_item(r, name) for name in test_files for r in read_jsonl(base / name)]
    pool = [to_item(r, name) for name in pool_files for r in read_jsonl(base / name)]
    if gsm8k and GSM8K_FILE not in pool_files:
        pool += [to_item(r, GSM8K_FILE) for r in read_jsonl(base / GSM8K_FILE)]
    return make_splits(test, pool, seed=seed, harness_size=harness_size, weight_size=weight_size, test_size=test_size)


def load_splits(
    root: Path,
    *,
    seed: int = 0,
    harness_size: int = 256,
    weight_size: int | None = None,
    test_size: int | None = None,
    gsm8k: bool = False,
    math_set: str = "aime",
) -> dict[str, list[Row]]:
    """All three splits (cached per settings: ``split_sizes`` and the workloads share one parse).

    ``math_set``: ``aime`` (the paper's: AIME test, MATH pool) or ``gsm8k`` (GSM8K test, GSM8K train pool);
    ``gsm8k``: also add GSM8K train to the ``aime`` pool (a curriculum)."""
    if math_set not in MATH_SETS:
        raise DataError(
            f"spec.experiment.domainOptions.mathSet={math_set!r} is not a math problem set; use one of {', '.join(MATH_SETS)}"
        )
    splits = _load(str(Path(root).resolve()), seed, harness_size, weight_size, test_size, gsm8k, math_set)
    return {name: list(rows) for name, rows in splits.items()}
