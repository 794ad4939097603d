"""The paper's search-QA data (``spec.experiment.data.source: full``): Search-R1's NQ + HotpotQA train and the seven test sets.

Sources: FlashRAG's releases on the Hugging Face hub (``RUC-NLPIR/FlashRAG_datasets``), which Search-R1's
``qa_search_train_merge.py`` / ``qa_search_test_merge.py`` read: NQ and HotpotQA ``train`` for training, and
the test split of NQ, TriviaQA, PopQA, Bamboogle and the dev split of HotpotQA, 2WikiMultihopQA and MuSiQue
(the ones Search-R1 evaluates on). Rows are ``{"id", "question", "golden_answers", ...}``.

* **D_weight**: the NQ + HotpotQA train questions (169,615), de-duplicated by normalised question with
  every question of the seven test files removed, then a seeded sample of **18,946** (74 steps of 256
  prompts per epoch): the size of the reference's merged train file (``krafton-ai/WHALE`` docs/data.md),
  whose selection rule is not published; a seeded uniform sample is this project's stand-in for it.
* **D_harness**: ``harnessSize`` (256) NQ questions of D_weight, seeded, as the reference's
  ``build_meta_harness_nq_256.py`` (256 NQ train rows, a subset of the train set).
* **D_test**: ``testSize`` (default 100) questions of each of the seven benchmarks, seeded per benchmark
  (``random.Random(f"{seed}:{benchmark}")``, source order kept): the reference's 700-question
  ``test_100`` set that its runs evaluate mean@8 on.

The hub files are not pinned to a commit here (``resolve/main``): their SHA-256 is recorded in the store at
the first fetch and checked on every re-use; pin them in ``spec.experiment.data.sources`` to refuse any other file.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from whale.domain import FullData, FullDataError, Source

if TYPE_CHECKING:
    from whale.domain import Data

HUB = "https://huggingface.co/datasets/RUC-NLPIR/FlashRAG_datasets/resolve/main"
#: benchmark -> (source name, file in the FlashRAG release, its rows)
TEST_SETS: dict[str, tuple[str, str, int]] = {
    "nq": ("nq-test", "nq/test.jsonl", 3_610),
    "triviaqa": ("triviaqa-test", "triviaqa/test.jsonl", 11_313),
    "popqa": ("popqa-test", "popqa/test.jsonl", 14_267),
    "hotpotqa": ("hotpotqa-dev", "hotpotqa/dev.jsonl", 7_405),
    "2wikimultihopqa": ("2wikimultihopqa-dev", "2wikimultihopqa/dev.jsonl", 12_576),
    "musique": ("musique-dev", "musique/dev.jsonl", 2_417),
    "bamboogle": ("bamboogle-test", "bamboogle/test.jsonl", 125),
}
#: dataset -> (source name, file)
TRAIN_SETS: dict[str, tuple[str, str]] = {
    "nq": ("nq-train", "nq/train.jsonl"),
    "hotpotqa": ("hotpotqa-train", "hotpotqa/train.jsonl"),
}
SOURCES = tuple(
    Source(
        name=name,
        url=f"{HUB}/{path}",
        filename=path.replace("/", "_"),
        max_bytes=2 << 30,
        description=f"FlashRAG {path}",
    )
    for name, path in [*TRAIN_SETS.values(), *((n, p) for n, p, _ in TEST_SETS.values())]
)
PAPER_WEIGHT = 18_946
DEFAULT_TEST_PER_BENCHMARK = 100
HARNESS_DATASET = "nq"
VERSION = 1


def sizes(data: Data) -> dict[str, int]:
    per = data.test_size or DEFAULT_TEST_PER_BENCHMARK
    weight = PAPER_WEIGHT if data.weight_size is None else min(PAPER_WEIGHT, data.weight_size)
    return {
        "weight": weight,
        "harness": data.harness_size,
        "test": sum(min(per, rows) for _, _, rows in TEST_SETS.values()),
    }


def read_jsonl(path: Path) -> Iterator[dict[str, Any]]:
    n = 0
    try:
        with Path(path).open(encoding="utf-8") as fh:
            for n, line in enumerate(fh, 1):  # noqa: B007 - n names the bad line in the error below
                if line.strip():
                    yield json.loads(line)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise FullDataError(
            f"{path}:{n + 1 if isinstance(exc, UnicodeDecodeError) else n}: not JSON lines "
            f"({type(exc).__name__}); is it the FlashRAG file?"
        ) from None


def make_splits(
    tests: dict[str, list[dict[str, Any]]], train: dict[str, list[dict[str, Any]]], data: Data
) -> tuple[dict[str, list[dict[str, Any]]], dict[str, Any]]:
    """Pure: test per benchmark; the train pool de-duplicated without test questions; D_weight a seeded
    sample of it; D_harness seeded NQ questions of D_weight."""
    from search_qa.verifier import normalize

    per = data.test_size or DEFAULT_TEST_PER_BENCHMARK
    test: list[dict[str, Any]] = []
    for name in sorted(tests):
        rows = tests[name]
        if per < len(rows):
            chosen = set(random.Random(f"{data.seed}:{name}").sample(range(len(rows)), per))
            rows = [r for i, r in enumerate(rows) if i in chosen]
        test.extend(rows)
    seen = {normalize(r["question"]) for rows in tests.values() for r in rows}
    pool = []
    dropped = 0
    for dataset in sorted(train):
        for row in train[dataset]:
            key = normalize(row["question"])
            if key in seen:
                dropped += 1
                continue
            seen.add(key)
            pool.append(row)
    target = sizes(data)["weight"]
    if len(pool) < target:
        raise FullDataError(
            f"only {len(pool)} distinct training questions; D_weight needs {target}: lower "
            "spec.experiment.data.weightSize or check the train files"
        )
    weight = random.Random(data.seed).sample(pool, target)
    nq = [r for r in weight if r["id"].startswith(f"{HARNESS_DATASET}/")]
    if data.harness_size > len(nq):
        raise FullDataError(
            f"spec.experiment.data.harnessSize={data.harness_size} is more than the {len(nq)} NQ questions of D_weight"
        )
    harness = random.Random(f"{data.seed}:harness").sample(nq, data.harness_size)
    stats = {
        "trainRows": sum(len(v) for v in train.values()),
        "trainDistinct": len(pool),
        "trainDroppedAsRepeatOrTest": dropped,
    }
    return {"weight": weight, "harness": harness, "test": test}, stats


def build(paths: Mapping[str, Path], data: Data) -> tuple[dict[str, list[dict[str, Any]]], dict[str, Any]]:
    from search_qa.data import to_item

    tests = {}
    for bench, (name, path, _rows) in TEST_SETS.items():
        tests[bench] = [to_item(r, path, bench) for r in read_jsonl(paths[name])]
    train = {}
    for dataset, (name, path) in TRAIN_SETS.items():
        rows = []
        for r in read_jsonl(paths[name]):
            item = to_item(r, path)
            item["id"] = f"{dataset}/{item['id']}"
            rows.append(item)
        train[dataset] = rows
    splits, stats = make_splits(tests, train, data)
    stats["testRows"] = {bench: len(rows) for bench, rows in tests.items()}
    return splits, stats


FULL = FullData(
    domain="search_qa",
    sources=SOURCES,
    version=VERSION,
    sizes=sizes,
    build=build,
)
