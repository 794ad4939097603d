"""Prepare a dense retrieval index: build one, adopt Search-R1's, or get the paper's (e5-base-v2 over wiki-18).

    python -m whale.tools.prepare_index build --corpus C.jsonl --out DIR [--encoder e5|minilm] [--model M]
        [--device cuda] [--fp16] [--batch-size 512] [--chunk-rows 50000]
    python -m whale.tools.prepare_index adopt --dir DIR [--index e5_Flat.index] [--corpus wiki-18.jsonl] [--model M]
        [--store URI --key PREFIX]      # e.g. an index you have: the cluster's prepare Job then downloads nothing
    python -m whale.tools.prepare_index download-model --dest DIR [--model intfloat/e5-base-v2]
    python -m whale.tools.prepare_index wiki18 --dir DIR [--source search-r1|build] [--store URI --key PREFIX]

``wiki18`` is the paper's full-data preparation: it downloads e5-base-v2 and Search-R1's wiki-18 corpus
(21,015,324 passages) from the Hugging Face hub, then adopts Search-R1's released flat e5 index
(``--source search-r1``, the index the paper used) or encodes the corpus itself (``--source build``, a GPU's
hours), checks the pair and writes the manifest. With ``--store`` the finished directory is published under
``--key`` with a ``COMPLETE`` marker written last; a store that already has the marker is left as it is.
Every step is resumable: a finished file is not downloaded or encoded again.
"""

from __future__ import annotations

import argparse
import gzip
import logging
import os
import shutil
import sys
from pathlib import Path
from typing import Any

from whale.store import StoreError
from whale.tools import retrieval
from whale.tools.fetch import COMPLETE
from whale.tools.retrieval import E5_MODEL_ID, PRESETS, RetrieverError

log = logging.getLogger(__name__)

#: Search-R1's releases on the Hugging Face hub (docs/retriever.md and scripts/download.py of Search-R1)
WIKI18_CORPUS_REPO = "PeterJinGo/wiki-18-corpus"
WIKI18_CORPUS_FILE = "wiki-18.jsonl.gz"
WIKI18_INDEX_REPO = "PeterJinGo/wiki-18-e5-index"
WIKI18_INDEX_PARTS = ("part_aa", "part_ab")
WIKI18_ROWS = 21_015_324
CORPUS_NAME = "wiki-18.jsonl"
INDEX_NAME = "e5_Flat.index"
MODEL_DIR = "model"
MODEL_FILES = ("*.json", "*.txt", "model.safetensors")


def _hub() -> Any:
    try:
        import huggingface_hub
    except ImportError as exc:  # pragma: no cover - a dependency of transformers
        raise RetrieverError("downloads need huggingface_hub (pip install huggingface_hub)") from exc
    return huggingface_hub


def download_model(dest: Path, model_id: str = E5_MODEL_ID, revision: str | None = None) -> Path:
    """The encoder's weights and tokenizer into ``dest`` (skipped when already there)."""
    dest = Path(dest)
    if (dest / "config.json").is_file() and any(dest.glob("*.safetensors")):
        return dest
    _hub().snapshot_download(model_id, revision=revision, local_dir=str(dest), allow_patterns=list(MODEL_FILES))
    if not (dest / "config.json").is_file():
        raise RetrieverError(f"{model_id}: no config.json after the download into {dest}")
    return dest


def _concatenate(parts: list[Path], dest: Path) -> None:
    tmp = dest.with_name(f".{dest.name}.part")
    with tmp.open("wb") as out:
        for p in parts:
            with p.open("rb") as src:
                shutil.copyfileobj(src, out, 1 << 24)
    os.replace(tmp, dest)


def _gunzip(src: Path, dest: Path) -> None:
    tmp = dest.with_name(f".{dest.name}.part")
    with gzip.open(src, "rb") as fin, tmp.open("wb") as out:
        shutil.copyfileobj(fin, out, 1 << 24)
    os.replace(tmp, dest)


def download_wiki18(work: Path, *, with_index: bool) -> None:
    """Search-R1's corpus (and its e5 flat index, in two parts) into ``work``; finished files are kept."""
    hub = _hub()
    work.mkdir(parents=True, exist_ok=True)
    if not (work / CORPUS_NAME).is_file():
        gz = hub.hf_hub_download(WIKI18_CORPUS_REPO, WIKI18_CORPUS_FILE, repo_type="dataset", local_dir=str(work))
        _gunzip(Path(gz), work / CORPUS_NAME)
        Path(gz).unlink()
    if with_index and not (work / INDEX_NAME).is_file():
        parts = [
            Path(hub.hf_hub_download(WIKI18_INDEX_REPO, p, repo_type="dataset", local_dir=str(work)))
            for p in WIKI18_INDEX_PARTS
        ]
        _concatenate(parts, work / INDEX_NAME)
        for p in parts:
            p.unlink()


def prepare_wiki18(
    index_dir: Path,
    *,
    source: str = "search-r1",
    device: str = "cpu",
    fp16: bool = False,
    batch_size: int = 512,
    expect_rows: int | None = WIKI18_ROWS,
    expect_corpus_sha256: str | None = None,
) -> retrieval.IndexManifest:
    """The paper's retriever: e5-base-v2 over wiki-18 in ``index_dir`` (downloads, then adopt or build)."""
    index_dir = Path(index_dir)
    if (index_dir / retrieval.MANIFEST).is_file():
        return retrieval.IndexManifest.read(index_dir)
    if source not in ("search-r1", "build"):
        raise RetrieverError(f"--source {source!r}: use search-r1 (adopt the released index) or build")
    model = download_model(index_dir / MODEL_DIR)
    download_wiki18(index_dir, with_index=source == "search-r1")
    if source == "search-r1":
        manifest = retrieval.adopt_search_r1(
            index_dir, index_file=INDEX_NAME, corpus_file=CORPUS_NAME, model_path=model
        )
    else:
        encoder = retrieval.Encoder.load(
            model, PRESETS["e5"], device=device, fp16=fp16, batch_size=batch_size, model_id=E5_MODEL_ID
        )
        manifest = retrieval.prepare_dense_index(index_dir / CORPUS_NAME, index_dir, encoder, model_path=model)
    problems = []
    if expect_rows is not None and manifest.corpus_rows != expect_rows:
        problems.append(f"{manifest.corpus_rows} passages, expected {expect_rows}")
    if expect_corpus_sha256 and manifest.corpus_sha256 != expect_corpus_sha256:
        problems.append(f"corpus SHA-256 {manifest.corpus_sha256}, expected {expect_corpus_sha256}")
    if problems:
        (index_dir / retrieval.MANIFEST).unlink()
        raise RetrieverError(f"{index_dir}: not the wiki-18 the paper used ({'; '.join(problems)})")
    return manifest


def publish(store: Any, index_dir: Path, key: str) -> None:
    """Upload a complete, self-contained index directory under ``key``; the ``COMPLETE`` marker goes last.
    A pod fetches the folder elsewhere, so the corpus and the model must be inside it."""
    m = retrieval.IndexManifest.read(index_dir)  # refuses an incomplete directory
    for what, rel in (("corpus", m.corpus_path), ("model", m.model_path)):
        if rel is not None and (Path(rel).is_absolute() or rel.startswith("..")):
            raise RetrieverError(
                f"{index_dir}: the {what} ({rel}) is outside the folder; copy it in and prepare again before publishing"
            )
    if m.model_path is None:
        log.warning("%s: no model folder in the index; the service will need %s from the hub", index_dir, m.model_id)
    store.upload_dir(index_dir, key, marker=COMPLETE)


def published(store: Any, key: str) -> bool:
    return bool(store.exists(f"{key.rstrip('/')}/{COMPLETE}"))


def ensure_published_wiki18(store: Any, key: str, work: Path, **kwargs: Any) -> bool:
    """Prepare wiki-18 into ``work`` and publish it under ``key`` unless the store has it already.
    True when this call published it."""
    if published(store, key):
        log.info("%s: the wiki-18 index is in the store already", store.uri_for(key))
        return False
    prepare_wiki18(work, **kwargs)
    publish(store, work, key)
    return True


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m whale.tools.prepare_index", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="command", required=True)

    b = sub.add_parser("build", help="encode a corpus into a flat inner-product index")
    b.add_argument("--corpus", type=Path, required=True)
    b.add_argument("--out", type=Path, required=True)
    b.add_argument("--encoder", choices=sorted(PRESETS), default="e5", help="the encoder's conventions")
    b.add_argument("--model", default=None, help="weights: a local folder or a hub id (default: the preset's model)")
    b.add_argument("--device", default="cpu")
    b.add_argument("--fp16", action="store_true")
    b.add_argument("--batch-size", type=int, default=retrieval.DEFAULT_BATCH)
    b.add_argument("--chunk-rows", type=int, default=retrieval.DEFAULT_CHUNK_ROWS)

    a = sub.add_parser("adopt", help="adopt Search-R1's e5_Flat.index + wiki-18.jsonl pair in a directory")
    a.add_argument("--dir", type=Path, required=True)
    a.add_argument("--index", default=INDEX_NAME)
    a.add_argument("--corpus", default=CORPUS_NAME)
    a.add_argument("--model", type=Path, default=None, help="local copy of e5-base-v2 served with the index")
    for sp in (b, a):
        sp.add_argument("--store", default=None, help="then publish the folder to this store (file:// or s3://) ...")
        sp.add_argument(
            "--key",
            default=None,
            help="... under this prefix (a cluster's search_qa run fetches data/search_qa/retriever/wiki18-e5)",
        )

    d = sub.add_parser("download-model", help="an encoder's weights from the Hugging Face hub")
    d.add_argument("--dest", type=Path, required=True)
    d.add_argument("--model", default=E5_MODEL_ID)

    w = sub.add_parser("wiki18", help="the paper's index: e5-base-v2 over wiki-18 (downloads ~80 GB)")
    w.add_argument("--dir", type=Path, required=True)
    w.add_argument("--source", choices=("search-r1", "build"), default="search-r1")
    w.add_argument("--device", default="cpu")
    w.add_argument("--fp16", action="store_true")
    w.add_argument("--batch-size", type=int, default=512)
    w.add_argument("--expect-corpus-sha256", default=None)
    w.add_argument("--store", default=None, help="publish to this store (file:// or s3://) ...")
    w.add_argument("--key", default=None, help="... under this prefix")
    return p


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        if args.command == "build":
            conv = PRESETS[args.encoder]
            model = args.model or (str(retrieval.minilm_path()) if args.encoder == "minilm" else E5_MODEL_ID)
            model_id = retrieval.MINILM_MODEL_ID if args.encoder == "minilm" and not args.model else str(model)
            encoder = retrieval.Encoder.load(
                model,
                conv,
                device=args.device,
                fp16=args.fp16,
                batch_size=args.batch_size,
                model_id=model_id,
                allow_download=True,
            )
            local = Path(model) if Path(model).is_dir() else None
            m = retrieval.prepare_dense_index(
                args.corpus, args.out, encoder, model_path=local, chunk_rows=args.chunk_rows
            )
        elif args.command == "adopt":
            m = retrieval.adopt_search_r1(
                args.dir, index_file=args.index, corpus_file=args.corpus, model_path=args.model
            )
        if args.command in ("build", "adopt") and args.store:
            from whale.store import open_store

            if not args.key:
                raise RetrieverError("--store and --key go together")
            publish(open_store(args.store), args.out if args.command == "build" else args.dir, args.key)
        if args.command == "download-model":
            print(download_model(args.dest, args.model))
            return 0
        if args.command == "wiki18":
            if bool(args.store) != bool(args.key):
                raise RetrieverError("--store and --key go together")
            kwargs = {
                "source": args.source,
                "device": args.device,
                "fp16": args.fp16,
                "batch_size": args.batch_size,
                "expect_corpus_sha256": args.expect_corpus_sha256,
            }
            if args.store:
                from whale.store import open_store

                ensure_published_wiki18(open_store(args.store), args.key, args.dir, **kwargs)
                return 0
            m = prepare_wiki18(args.dir, **kwargs)
    except (RetrieverError, StoreError) as exc:
        print(f"prepare_index: {exc}", file=sys.stderr)
        return 2
    print(
        f"{m.origin} index: {m.ntotal} passages x {m.dim} ({m.model_id}, {m.conventions.name}), "
        f"corpus sha256 {m.corpus_sha256}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
