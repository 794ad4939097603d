"""The in-process retriever: BM25 and dense indexes built once, cached, and reloaded."""

from __future__ import annotations

import itertools
import json

import pytest

from whale.tools import retrieval_index


@pytest.fixture(scope="module")
def small_corpus(tmp_path_factory, search_corpus):
    """300 real passages (PopQA support paragraphs first, so questions have answers in it)."""
    path = tmp_path_factory.mktemp("corpus") / "small.jsonl"
    with search_corpus.open() as src:
        rows = [json.loads(line) for line in itertools.islice(src, 300)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_bm25_is_built_once_then_loaded(tmp_path, small_corpus):
    first = retrieval_index.build(small_corpus, "bm25", tmp_path)
    dirs = [p for p in tmp_path.iterdir() if p.name.startswith("bm25-")]
    assert len(dirs) == 1 and (dirs[0] / "done").is_file()
    mtime = (dirs[0] / "done").stat().st_mtime_ns
    second = retrieval_index.build(small_corpus, "bm25", tmp_path)
    assert (dirs[0] / "done").stat().st_mtime_ns == mtime  # loaded, not rebuilt
    q = [first.passages[5].title, first.passages[17].title]
    a, b = first.search(q, 3), second.search(q, 3)
    assert [[h.passage.id for h in row] for row in a] == [[h.passage.id for h in row] for row in b]
    assert a[0][0].passage.id == first.passages[5].id


def test_changed_corpus_gets_a_new_index(tmp_path, small_corpus):
    retrieval_index.build(small_corpus, "bm25", tmp_path)
    other = tmp_path / "other.jsonl"
    other.write_text(small_corpus.read_text().replace("Teutberga", "Teutbergo"))
    r = retrieval_index.build(other, "bm25", tmp_path)
    assert len([p for p in tmp_path.iterdir() if p.name.startswith("bm25-")]) == 2
    assert r.search(["Teutbergo"], 1)[0][0].passage.title == "Teutbergo"


def test_bad_corpus_and_method_are_named(tmp_path):
    with pytest.raises(retrieval_index.RetrieverError, match="not found"):
        retrieval_index.build(tmp_path / "missing.jsonl")
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": "1", "contents": "ok"}\n{"title": "no id"}\n')
    with pytest.raises(retrieval_index.RetrieverError, match=r"bad.jsonl:2"):
        retrieval_index.build(bad, "bm25", tmp_path)
    with pytest.raises(retrieval_index.RetrieverError, match="unknown retrieval method 'tfidf'"):
        retrieval_index.build(bad, "tfidf", tmp_path)


@pytest.mark.slow
def test_dense_minilm_faiss(tmp_path, small_corpus, one_torch_thread):
    corpus = tmp_path / "tiny.jsonl"
    corpus.write_text("".join(small_corpus.read_text().splitlines(keepends=True)[:100]))
    dense = retrieval_index.build(corpus, "dense", tmp_path)
    p = dense.passages[42]
    hits = dense.search([p.text[:200], "completely unrelated cooking recipe"], 5)
    assert hits[0][0].passage.id == p.id
    assert 0.5 < hits[0][0].score <= 1.0001  # cosine similarity of normalised embeddings
    assert len(hits[1]) == 5
    again = retrieval_index.build(corpus, "dense", tmp_path)  # cached FAISS index
    assert again.search([p.text[:200]], 1)[0][0].passage.id == p.id
