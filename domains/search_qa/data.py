"""Raw files -> the three search-QA splits.

D_test = the paper's seven benchmarks, ``testSize`` (100 by default) questions of each, sampled with the
spec's seed. TriviaQA (``eval/triviaqa_test.jsonl``) has no file in the sample data: an optional benchmark
whose file is absent is left out and reported missing (:func:`missing_benchmarks`, surfaced in the eval
result's notes), and the other six are used; a data root that has the file (a full-data preparation) gets
all seven. HotpotQA, 2Wiki and MuSiQue use the
R1-Searcher 500-question dev samples, whose passages the local corpus holds.
D_weight = the training questions (NQ-open train via AmbigQA + the HotpotQA/2Wiki train mix, as in the
paper's NQ + HotpotQA), de-duplicated and with test questions removed; D_harness = ``harnessSize`` of
them (seeded), disjoint from D_weight. Splitting is pure; only the loaders read files.

Which training questions depends on the retrieval corpus (``spec.experiment.domainOptions.corpus``, :func:`resolve_corpus`):

* ``local`` (``whale run``'s default): the shipped corpus holds passages for the test questions only, so
  BM25 finds the answer of just 8 % of the training questions in its top 5. The train pool keeps the
  questions whose gold answer BM25 retrieves in the top :data:`ANSWERABLE_TOPK` passages for the question
  itself (``train="answerable"``; 1,450 of 18,314), so RSFT and the harness search train where retrieval
  can help. The set is computed once per (corpus, train files) and cached on disk.
* ``wiki18`` (a cluster's default, the paper's): e5 over the 21 M passages of wiki-18 covers the train
  questions, so every one is kept (``train="all"``).
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import os
import random
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

from search_qa.verifier import normalize
from whale.domain import DomainError, raw_exists, raw_file, read_raw_jsonl, unpacked_raw_file

log = logging.getLogger(__name__)

SUBDIR = "search_qa"
#: the paper's seven test benchmarks -> their file under eval/
BENCHMARKS: dict[str, str] = {
    "nq": "nq_test.jsonl",
    "triviaqa": "triviaqa_test.jsonl",
    "popqa": "popqa_hipporag1000.jsonl",
    "hotpotqa": "hotpotqa_dev_r1searcher500.jsonl",
    "2wikimultihopqa": "2wikimultihopqa_dev_r1searcher500.jsonl",
    "musique": "musique_dev_r1searcher500.jsonl",
    "bamboogle": "bamboogle_test.jsonl",
}
#: benchmarks whose file may be absent (then left out of D_test and reported missing); the others must exist.
#: TriviaQA has no file in the sample data (whale/data/sample/README.md, Gaps)
OPTIONAL_BENCHMARKS = frozenset({"triviaqa"})


def missing_benchmarks(root: Path) -> tuple[str, ...]:
    """The optional benchmarks whose file the data root lacks, in the paper's order."""
    base = Path(root) / SUBDIR / "eval"
    return tuple(b for b, f in BENCHMARKS.items() if b in OPTIONAL_BENCHMARKS and not raw_exists(base / f))


TRAIN_FILES = ("ambigqa_train_nq_open_proxy.jsonl", "hotpotqa_2wiki_train_r1searcher.jsonl")
CORPUS_FILE = "corpus/wiki_passages.jsonl"
DEFAULT_TEST_PER_BENCHMARK = 100
#: spec.experiment.domainOptions.corpus values; ``auto`` is resolved before the domain sees it on a cluster (the operator
#: makes it wiki18) and means ``local`` everywhere else
CORPORA = ("local", "wiki18")
TrainFilter = Literal["answerable", "all"]
#: a local-corpus training question is kept when BM25 retrieves its answer in this many passages
ANSWERABLE_TOPK = 5
ANSWERABLE_VERSION = "1"
#: gold answers a passage cannot meaningfully contain
NON_SPAN = {"yes", "no"}

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


def resolve_corpus(corpus: str | None) -> str:
    """``spec.experiment.domainOptions.corpus`` as the domain uses it: ``auto`` (or unset) is ``local`` here."""
    value = corpus or "auto"
    if value == "auto":
        return "local"
    if value not in CORPORA:
        raise DataError(f"spec.experiment.domainOptions.corpus={value!r}: use auto, {' or '.join(CORPORA)}")
    return value


def train_filter_for(corpus: str) -> TrainFilter:
    """The local corpus keeps the answerable training questions; wiki-18 keeps them all (the paper)."""
    return "answerable" if resolve_corpus(corpus) == "local" else "all"


def answer_in(text_norm: str, golds: list[str]) -> bool:
    """A normalised gold answer appears as whole words in the normalised ``text_norm`` (yes/no never do)."""
    padded = f" {text_norm} "
    for g in golds:
        n = normalize(g)
        if n and n not in NON_SPAN and f" {n} " in padded:
            return True
    return False


def make_splits(
    tests: dict[str, list[Row]],
    train: list[Row],
    *,
    seed: int,
    harness_size: int,
    weight_size: int | None = None,
    test_size: int | None = None,
    keep: Callable[[Row], bool] | None = None,
) -> dict[str, list[Row]]:
    """Pure split. Test: ``test_size`` per benchmark (seeded, source order kept); train de-duplicated by
    normalised question with every test question removed, restricted to ``keep`` (None: every question),
    shuffled, head = D_harness, rest = D_weight."""
    per = test_size or DEFAULT_TEST_PER_BENCHMARK
    test: list[Row] = []
    for name in sorted(tests):
        rows = tests[name]
        if per < len(rows):
            chosen = set(random.Random(f"{seed}:{name}").sample(range(len(rows)), per))
            rows = [r for i, r in enumerate(rows) if i in chosen]
        test.extend(rows)
    seen = {normalize(r["question"]) for rows in tests.values() for r in rows}
    pool = []
    for row in sorted(train, key=lambda r: r["id"]):
        k = normalize(row["question"])
        if k not in seen:
            seen.add(k)
            if keep is None or keep(row):
                pool.append(row)
    if harness_size >= len(pool):
        raise DataError(
            f"spec.experiment.data.harnessSize={harness_size} leaves nothing for D_weight ({len(pool)} training "
            "questions); lower it, or use spec.experiment.domainOptions.corpus wiki18 (every training question)"
        )
    random.Random(seed).shuffle(pool)
    weight = pool[harness_size:]
    if weight_size is not None:
        weight = weight[:weight_size]
    return {"weight": weight, "harness": pool[:harness_size], "test": test}


def train_rows(root: Path) -> list[Row]:
    base = Path(root) / SUBDIR
    return [to_item(r, f) for f in TRAIN_FILES for r in read_jsonl(base / "train" / f)]


@functools.lru_cache(maxsize=8)
def _load(
    root: str, seed: int, harness_size: int, weight_size: int | None, test_size: int | None, train_filter: TrainFilter
) -> dict[str, list[Row]]:
    base = Path(root) / SUBDIR
    missing = missing_benchmarks(Path(root))
    tests = {
        name: [to_item(r, f, name) for r in read_jsonl(base / "eval" / f)]
        for name, f in BENCHMARKS.items()
        if name not in missing
    }
    keep = None
    if train_filter == "answerable":
        ids = answerable_ids(Path(root))
        keep = lambda row: row["id"] in ids  # noqa: E731
    return make_splits(
        tests,
        train_rows(Path(root)),
        seed=seed,
        harness_size=harness_size,
        weight_size=weight_size,
        test_size=test_size,
        keep=keep,
    )


def load_splits(
    root: Path,
    *,
    seed: int = 0,
    harness_size: int = 256,
    weight_size: int | None = None,
    test_size: int | None = None,
    train: TrainFilter = "answerable",
) -> dict[str, list[Row]]:
    """All three splits (cached per settings, so ``split_sizes`` and the workloads share one parse).
    ``train``: ``answerable`` (the local corpus's default) or ``all`` training questions."""
    if train not in ("answerable", "all"):
        raise DataError(f"train={train!r}: use answerable or all")
    splits = _load(str(Path(root).resolve()), seed, harness_size, weight_size, test_size, train)
    return {name: list(rows) for name, rows in splits.items()}


def corpus_path(root: Path) -> Path:
    """The local corpus as a plain file (the retriever reads rows by offset): the data root's own, or its
    shipped ``.gz`` unpacked once into the cache (:func:`whale.domain.unpacked_raw_file`)."""
    return unpacked_raw_file(Path(root) / SUBDIR / CORPUS_FILE)


def _answerable_cache_dir() -> Path:
    from whale.domain import default_cache_dir

    return default_cache_dir().parent / SUBDIR


def answerable_ids(root: Path, *, topk: int = ANSWERABLE_TOPK, cache_dir: Path | None = None) -> frozenset[str]:
    """Ids of the training questions whose gold answer BM25 retrieves in the top ``topk`` passages of the
    local corpus for the question itself. ~12 s of BM25 for 18 k questions the first time; then read
    from ``$WHALE_CACHE_DIR/search_qa`` (keyed by the SHA-256 of the corpus and the train files)."""
    from whale.domain import retrieval

    corpus = corpus_path(root)
    files = [corpus] + [Path(root) / SUBDIR / "train" / f for f in TRAIN_FILES]
    for f in files:
        if not raw_exists(f):
            raise DataError(
                f"{f}: missing. Point spec.experiment.data.dataDir (or $WHALE_DATA_DIR) at a data root that holds "
                f"{SUBDIR}/ (unset both for the shipped sample data), or use spec.experiment.domainOptions.corpus wiki18"
            )
    parts = [
        ANSWERABLE_VERSION,
        str(topk),
        f"k1={retrieval.BM25_K1},b={retrieval.BM25_B}",
        *(retrieval.file_digest(raw_file(f)) for f in files),
    ]
    key = hashlib.sha256("|".join(parts).encode()).hexdigest()[:16]
    cache = cache_dir or _answerable_cache_dir()
    path = cache / f"answerable-{key}.json"
    if path.is_file():
        return frozenset(json.loads(path.read_text())["ids"])
    rows = train_rows(root)
    retriever = retrieval.build(corpus, "bm25", retrieval.default_cache_dir() if cache_dir is None else cache_dir)
    ids = sorted(r["id"] for r, hit in zip(rows, answer_hits(rows, retriever, topk), strict=True) if hit)
    log.info("%d of %d training questions have their answer in BM25's top %d", len(ids), len(rows), topk)
    cache.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=cache, prefix=".answerable-")
    with os.fdopen(fd, "w") as fh:
        json.dump({"topk": topk, "questions": len(rows), "ids": ids}, fh)
    os.replace(tmp, path)
    return frozenset(ids)


def answer_hits(items: list[Row], retriever: Any, topk: int, batch: int = 256) -> list[bool]:
    """Per item: is a gold answer in the top ``topk`` passages retrieved for its question?"""
    out: list[bool] = []
    for start in range(0, len(items), batch):
        chunk = items[start : start + batch]
        for item, hits in zip(chunk, retriever.search([i["question"] for i in chunk], topk), strict=True):
            out.append(any(answer_in(normalize(h.passage.contents), item["golden_answers"]) for h in hits[:topk]))
    return out
