"""The paper's math data (``spec.experiment.data.source: full``): DAPO-Math-17k, de-duplicated to 17,917 problems.

As the reference (``krafton-ai/WHALE`` docs/data.md): **D_weight** = the de-duplicated DAPO-Math-17k pool,
17,917 problems (70 steps of 256 prompts per epoch); **D_harness** = ``harnessSize`` (256) problems drawn
from the same pool with ``random.Random(seed)`` (the paper's seed is 42), so D_harness is a subset of
D_weight as in the paper; **D_test** = AIME 2024 + AIME 2025, the 60 problems shipped under the data root
(``aime_2024.jsonl``, ``aime_2025.jsonl``: the paper's test set, hand-checked, see whale/data/sample/README.md).

The upstream parquet repeats every prompt about 100 times (1,791,700 rows). De-duplication keeps the first
row of each distinct prompt text, in file order. Each prompt wraps the problem in DAPO's instruction
("Solve the following math problem step by step. ... $Answer is the answer to the problem.\\n\\n" before,
"\\n\\nRemember to put your answer on its own line after \\"Answer:\\"." after); the item's ``problem`` is
the text between them, its ``answer`` the row's ``reward_model.ground_truth``. The file is pinned to a
dataset commit and its SHA-256, so the counts are fixed; a different file fails the preparation.
"""

from __future__ import annotations

import random
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from whale.domain import FullData, FullDataError, Source

if TYPE_CHECKING:
    from whale.domain import Data

DAPO_REVISION = "65877096c24ffa7abc4e4fa5edb95cf3413a5674"
DAPO = Source(
    name="dapo-math-17k",
    url=f"https://huggingface.co/datasets/BytedTsinghua-SIA/DAPO-Math-17k/resolve/{DAPO_REVISION}/data/dapo-math-17k.parquet",
    filename="dapo-math-17k.parquet",
    sha256="534375d6bb8630d22ab46a56e11f2ffec1d288d8f7d04099bc82d68948705941",
    revision=DAPO_REVISION,
    max_bytes=400 << 20,
    description="DAPO-Math-17k (Apache-2.0), 1,791,700 rows = 17,917 distinct prompts repeated",
)
#: |D_weight| of the paper: the de-duplicated pool
PAPER_WEIGHT = 17_917
DEFAULT_TEST = 60
PROMPT_HEAD_END = "is the answer to the problem.\n\n"
PROMPT_TAIL = 'Remember to put your answer on its own line after "Answer:".'
VERSION = 1
BATCH_ROWS = 8192


def problem_text(prompt: str) -> str:
    """The problem inside DAPO's instruction wrapper (the whole text when there is no wrapper)."""
    text = prompt.split(PROMPT_HEAD_END, 1)[-1]
    if PROMPT_TAIL in text:
        text = text.rsplit(PROMPT_TAIL, 1)[0]
    return text.strip()


def dedup_rows(rows: Iterator[dict[str, Any]]) -> tuple[list[dict[str, Any]], int]:
    """DAPO rows (``prompt``: [{role, content}], ``reward_model``: {ground_truth}) -> distinct items in file
    order, and the number of rows read. Pure over the rows."""
    seen: set[str] = set()
    items: list[dict[str, Any]] = []
    n = 0
    for row in rows:
        n += 1
        prompt = row.get("prompt") or []
        content = prompt[0].get("content") if prompt and isinstance(prompt[0], dict) else None
        answer = (row.get("reward_model") or {}).get("ground_truth")
        if not isinstance(content, str) or answer is None or not str(answer).strip():
            raise FullDataError(
                f"dapo-math-17k row {n}: no prompt content or no reward_model.ground_truth; "
                "is it the DAPO-Math-17k parquet?"
            )
        if content in seen:
            continue
        seen.add(content)
        items.append(
            {
                "id": f"dapo-{len(items)}",
                "problem": problem_text(content),
                "answer": str(answer).strip(),
                "source": "dapo-math-17k",
            }
        )
    return items, n


def read_parquet_rows(path: Path) -> Iterator[dict[str, Any]]:
    """The rows' ``prompt`` and ``reward_model``, a batch at a time; a file that is not such a parquet is a
    FullDataError naming it."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        handle = pq.ParquetFile(path)
        for batch in handle.iter_batches(batch_size=BATCH_ROWS, columns=["prompt", "reward_model"]):
            yield from batch.to_pylist()
    except (pa.ArrowException, KeyError, ValueError) as exc:
        raise FullDataError(
            f"{path}: not the DAPO-Math-17k parquet (columns prompt, reward_model): {type(exc).__name__}: {exc}"
        ) from None


def make_splits(pool: list[dict[str, Any]], test: list[dict[str, Any]], data: Data) -> dict[str, list[dict[str, Any]]]:
    """D_weight = the pool (capped by weightSize), D_harness = a seeded sample of it, D_test = AIME."""
    if data.harness_size > len(pool):
        raise FullDataError(
            f"spec.experiment.data.harnessSize={data.harness_size} is more than the {len(pool)} DAPO problems"
        )
    harness = random.Random(data.seed).sample(pool, data.harness_size)
    weight = pool if data.weight_size is None else pool[: data.weight_size]
    if data.test_size is not None and data.test_size < len(test):
        keep = set(random.Random(data.seed).sample(range(len(test)), data.test_size))
        test = [r for i, r in enumerate(test) if i in keep]
    return {"weight": list(weight), "harness": harness, "test": list(test)}


def sizes(data: Data) -> dict[str, int]:
    weight = PAPER_WEIGHT if data.weight_size is None else min(PAPER_WEIGHT, data.weight_size)
    test = DEFAULT_TEST if data.test_size is None else min(DEFAULT_TEST, data.test_size)
    return {"weight": weight, "harness": data.harness_size, "test": test}


def build(paths: Mapping[str, Path], data: Data) -> tuple[dict[str, list[dict[str, Any]]], dict[str, Any]]:
    from math_reasoning.data import SUBDIR, TEST_FILES, read_jsonl, to_item
    from whale.domain import data_root

    pool, rows = dedup_rows(read_parquet_rows(paths[DAPO.name]))
    base = data_root(data) / SUBDIR
    test = [to_item(r, name) for name in TEST_FILES for r in read_jsonl(base / name)]
    test_keys = {" ".join(r["problem"].split()).lower() for r in test}
    overlap = sum(" ".join(r["problem"].split()).lower() in test_keys for r in pool)
    stats = {"dapoRows": rows, "dapoDistinct": len(pool), "poolProblemsAlsoInTest": overlap}
    return make_splits(pool, test, data), stats


FULL = FullData(
    domain="math_reasoning",
    sources=(DAPO,),
    version=VERSION,
    sizes=sizes,
    build=build,
)
