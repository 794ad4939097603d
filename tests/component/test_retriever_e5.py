"""The e5-style dense retriever, exercised end to end on a tiny model: index preparation (chunked,
resumable, manifest last), adoption of a Search-R1 ``e5_Flat.index`` + ``wiki-18.jsonl`` pair, the
service on loopback answering Search-R1's shape, publication through the store and the pod's fetch.

The encoder is a randomly initialised 2-layer BERT with a WordPiece tokenizer trained here on the
passages: e5-base-v2's weights cannot be downloaded on this machine, but every code path (tokenizer,
prefixes, mean pooling over the mask, normalisation, FAISS flat inner product) is the one e5 runs.
"""

from __future__ import annotations

import itertools
import json
import shutil
from pathlib import Path

import httpx
import numpy as np
import pytest

from tests.fixtures.tools import run_service
from whale.store import open_store
from whale.tools import fetch, prepare_index, retrieval_index
from whale.tools.client import RetrieverClient, ToolServiceError
from whale.tools.retrieval_index import PRESETS, Encoder, RetrieverError

ROWS = 120


@pytest.fixture(scope="module")
def corpus(tmp_path_factory, search_corpus) -> Path:
    """120 real passages, in the Search-R1 corpus format (``id`` + ``contents`` only)."""
    path = tmp_path_factory.mktemp("e5-corpus") / "wiki-18.jsonl"
    with search_corpus.open() as src:
        rows = [json.loads(line) for line in itertools.islice(src, ROWS)]
    path.write_text(
        "".join(json.dumps({"id": str(i + 1), "contents": r["contents"]}) + "\n" for i, r in enumerate(rows))
    )
    return path


@pytest.fixture(scope="module")
def tiny_e5(tmp_path_factory, corpus) -> Path:
    """A BERT-architecture encoder folder loadable with AutoModel/AutoTokenizer, like e5-base-v2's."""
    import torch
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors, trainers
    from transformers import BertConfig, BertModel, PreTrainedTokenizerFast

    texts = [json.loads(line)["contents"] for line in corpus.read_text().splitlines()]
    tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    tok.train_from_iterator(
        texts + ["query: passage:"], trainers.WordPieceTrainer(vocab_size=3000, special_tokens=specials)
    )
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]",
        special_tokens=[("[CLS]", tok.token_to_id("[CLS]")), ("[SEP]", tok.token_to_id("[SEP]"))],
    )
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        unk_token="[UNK]",
        pad_token="[PAD]",
        cls_token="[CLS]",
        sep_token="[SEP]",
        mask_token="[MASK]",
        model_max_length=512,
    )
    torch.manual_seed(0)
    model = BertModel(
        BertConfig(
            vocab_size=tok.get_vocab_size(),
            hidden_size=32,
            num_hidden_layers=2,
            num_attention_heads=2,
            intermediate_size=64,
            max_position_embeddings=512,
        )
    )
    out = tmp_path_factory.mktemp("tiny-e5")
    model.save_pretrained(out)
    fast.save_pretrained(out)
    return out


@pytest.fixture(scope="module")
def encoder(tiny_e5) -> Encoder:
    return Encoder.load(tiny_e5, PRESETS["e5"], model_id="tiny/e5-style")


@pytest.fixture(scope="module")
def built(tmp_path_factory, corpus, tiny_e5, encoder) -> Path:
    """An index folder as a cluster publishes it: corpus, model and index side by side."""
    out = tmp_path_factory.mktemp("e5-index")
    shutil.copy(corpus, out / "wiki-18.jsonl")
    shutil.copytree(tiny_e5, out / "model")
    retrieval_index.prepare_dense_index(out / "wiki-18.jsonl", out, encoder, model_path=out / "model", chunk_rows=50)
    return out


def test_e5_conventions_are_search_r1s():
    e5 = PRESETS["e5"]
    assert (e5.pooling, e5.query_prefix, e5.passage_prefix, e5.normalize, e5.max_length) == (
        "mean",
        "query: ",
        "passage: ",
        True,
        256,
    )


def test_encoder_prefixes_pools_over_the_mask_and_normalises(encoder):
    q = encoder.encode(["Teutberga", "Teutberga queen of Lotharingia"], "query")
    p = encoder.encode(["Teutberga"], "passage")
    assert q.dtype == np.float32 and q.shape == (2, 32)
    assert np.allclose(np.linalg.norm(q, axis=1), 1.0, atol=1e-5)
    assert not np.allclose(q[0], p[0])  # "query: " vs "passage: " prefix
    # mean pooling ignores padding: a text encodes the same alone and beside a longer one
    alone = encoder.encode(["Teutberga"], "query")[0]
    assert np.allclose(alone, q[0], atol=1e-5)
    cls = Encoder(
        encoder.model, encoder.tokenizer, retrieval_index.EncoderConventions("cls", pooling="cls", normalize=False)
    )
    raw = cls.encode(["Teutberga"], "query")[0]
    assert not np.isclose(np.linalg.norm(raw), 1.0)


def test_prepared_index_manifest_and_files(built, corpus):
    m = retrieval_index.IndexManifest.read(built)
    assert (m.origin, m.index_file, m.index_type, m.ntotal, m.dim) == (
        "built",
        "e5_Flat.index",
        "IndexFlatIP",
        ROWS,
        32,
    )
    assert (m.corpus_path, m.corpus_rows, m.model_path) == ("wiki-18.jsonl", ROWS, "model")
    assert m.corpus_sha256 == retrieval_index.file_digest(corpus) and m.conventions == PRESETS["e5"]
    assert not (built / ".work").exists()  # shards are removed once the index is written
    assert retrieval_index.IndexManifest.from_dict(m.to_dict()) == m


def test_service_serves_the_e5_index_in_search_r1_shape(tmp_path, built, corpus):
    texts = [json.loads(line)["contents"] for line in corpus.read_text().splitlines()]
    with run_service(
        "whale.tools.retriever_service", ["--index-dir", str(built), "--max-topk", "10"], tmp_path / "log"
    ) as svc:
        about = httpx.get(svc.url + "/healthz", timeout=10).json()
        assert about["method"] == "dense:e5" and about["passages"] == ROWS and about["origin"] == "built"
        picks = [0, 17, 63, 119]
        resp = httpx.post(
            svc.url + "/retrieve",
            timeout=60,
            json={"queries": [texts[i] for i in picks], "topk": 5, "return_scores": True},
        )
        assert resp.status_code == 200
        result = resp.json()["result"]
        assert len(result) == 4 and all(len(row) == 5 for row in result)
        for i, row in zip(picks, result, strict=True):
            assert set(row[0]) == {"document", "score"}
            assert row[0]["document"]["id"] == str(i + 1)  # a passage is retrieved for its own text
            assert row[0]["document"]["contents"] == texts[i]
            assert [h["score"] for h in row] == sorted((h["score"] for h in row), reverse=True)
            assert row[0]["score"] <= 1.0001
        plain = httpx.post(svc.url + "/retrieve", timeout=60, json={"queries": [texts[17]]}).json()["result"][0]
        assert len(plain) == 3 and plain[0]["id"] == "18" and "score" not in plain[0]
        client = RetrieverClient(svc.url)
        try:
            assert client.wait_ready(5)["method"] == "dense:e5"
            assert client.search([texts[63]], 2)[0][0].passage.id == "64"
        finally:
            client.close()


def test_interrupted_build_resumes_from_its_shards(tmp_path, corpus, encoder, built):
    class Crash(Exception):
        pass

    class Flaky:
        """The real encoder, failing on its third chunk (a pod killed mid-build)."""

        def __init__(self, fail_on: int | None):
            self.calls, self.fail_on = 0, fail_on
            self.conventions, self.model_id, self.dim = encoder.conventions, "tiny/e5-style", encoder.dim

        def encode(self, texts, kind):
            self.calls += 1
            if self.calls == self.fail_on:
                raise Crash
            return encoder.encode(texts, kind)

    out = tmp_path / "index"
    with pytest.raises(Crash):
        retrieval_index.prepare_dense_index(corpus, out, Flaky(3), chunk_rows=25)
    assert sorted(p.name for p in (out / ".work").glob("emb-*.npy")) == ["emb-000000.npy", "emb-000001.npy"]
    assert not (out / retrieval_index.MANIFEST).exists()
    again = Flaky(None)
    m = retrieval_index.prepare_dense_index(corpus, out, again, chunk_rows=25)
    assert again.calls == 3  # rows 50..119 only
    assert m.ntotal == ROWS
    import faiss

    a = faiss.read_index(str(out / "e5_Flat.index")).reconstruct_n(0, ROWS)
    b = faiss.read_index(str(built / "e5_Flat.index")).reconstruct_n(0, ROWS)
    assert np.allclose(a, b, atol=1e-5)  # the same vectors as an uninterrupted build
    assert (
        retrieval_index.prepare_dense_index(corpus, out, again, chunk_rows=25) == m and again.calls == 3
    )  # done: no work
    with pytest.raises(RetrieverError, match="another corpus/model"):
        retrieval_index.prepare_dense_index(corpus, out, load_other(encoder), chunk_rows=25)


def load_other(encoder: Encoder) -> Encoder:
    return Encoder(encoder.model, encoder.tokenizer, PRESETS["minilm"], model_id="other")


def search_r1_pair(where: Path, corpus: Path, encoder: Encoder, *, rows: int = ROWS, metric: int | None = None) -> Path:
    """Files as Search-R1's index_builder.py writes them: index_factory(dim, "Flat", inner product) over
    the "passage: " embeddings of the corpus rows, in row order."""
    import faiss

    where.mkdir(parents=True, exist_ok=True)
    shutil.copy(corpus, where / "wiki-18.jsonl")
    texts = [json.loads(line)["contents"] for line in corpus.read_text().splitlines()][:rows]
    index = faiss.index_factory(encoder.dim, "Flat", faiss.METRIC_INNER_PRODUCT if metric is None else metric)
    index.add(encoder.encode(texts, "passage"))
    faiss.write_index(index, str(where / "e5_Flat.index"))
    return where


def test_adopted_search_r1_index_is_served(tmp_path, corpus, encoder, tiny_e5):
    d = search_r1_pair(tmp_path / "sr1", corpus, encoder)
    m = retrieval_index.adopt_search_r1(d, model_path=tiny_e5)
    assert (m.origin, m.ntotal, m.corpus_rows, m.corpus_path, m.conventions) == (
        "search-r1",
        ROWS,
        ROWS,
        "wiki-18.jsonl",
        PRESETS["e5"],
    )
    r = retrieval_index.open_dense(d)  # the model from the manifest's model_path
    texts = [json.loads(line)["contents"] for line in corpus.read_text().splitlines()]
    hits = r.search([texts[5], texts[99]], 3)
    assert [row[0].passage.id for row in hits] == ["6", "100"]
    assert hits[0][0].passage.title == texts[5].split("\n")[0].strip('"')


def test_adoption_refuses_what_is_not_the_pair(tmp_path, corpus, encoder, tiny_e5):
    import faiss

    short = search_r1_pair(tmp_path / "short", corpus, encoder, rows=ROWS - 1)
    with pytest.raises(RetrieverError, match=f"{ROWS - 1} vectors but .* has {ROWS} rows: not the pair"):
        retrieval_index.adopt_search_r1(short)
    l2 = search_r1_pair(tmp_path / "l2", corpus, encoder, metric=faiss.METRIC_L2)
    with pytest.raises(RetrieverError, match="not inner product"):
        retrieval_index.adopt_search_r1(l2)
    with pytest.raises(RetrieverError, match="e5_Flat.index: the FAISS index is missing"):
        retrieval_index.adopt_search_r1(tmp_path / "empty")
    other_width = tmp_path / "wide-model"
    shutil.copytree(tiny_e5, other_width)
    cfg = json.loads((other_width / "config.json").read_text())
    (other_width / "config.json").write_text(json.dumps({**cfg, "hidden_size": 768}))
    with pytest.raises(RetrieverError, match="32-dimensional vectors but .* encodes 768"):
        retrieval_index.adopt_search_r1(search_r1_pair(tmp_path / "ok", corpus, encoder), model_path=other_width)


def test_a_changed_corpus_or_other_conventions_are_refused(tmp_path, corpus, encoder, tiny_e5):
    d = search_r1_pair(tmp_path / "sr1", corpus, encoder)
    retrieval_index.adopt_search_r1(d, model_path=tiny_e5)
    with pytest.raises(RetrieverError, match="built with conventions"):
        retrieval_index.open_dense(d, encoder=load_other(encoder))
    text = (d / "wiki-18.jsonl").read_text()
    (d / "wiki-18.jsonl").write_text(text.replace("Teutberga", "Teutbergo"))  # same size, other content
    with pytest.raises(RetrieverError, match="SHA-256 differs"):
        retrieval_index.open_dense(d)
    (d / retrieval_index.MANIFEST).write_text("{}")
    with pytest.raises(RetrieverError, match="format None"):
        retrieval_index.open_dense(d)
    with pytest.raises(RetrieverError, match="not a prepared index"):
        retrieval_index.open_dense(tmp_path)


def test_published_index_is_fetched_whole_and_served_from_the_copy(tmp_path, built, corpus):
    store = open_store(str(tmp_path / "store"))
    key = "data/search_qa/retriever/wiki18-e5"
    assert not prepare_index.published(store, key)
    with pytest.raises(Exception, match="COMPLETE"):
        fetch.fetch(store, key + "/", tmp_path / "too-early")  # refused until the marker is there
    prepare_index.publish(store, built, key)
    assert prepare_index.published(store, key)
    assert fetch.main([store.uri, key + "/", str(tmp_path / "pod" / "wiki18-e5")]) == 0
    r = retrieval_index.open_dense(tmp_path / "pod" / "wiki18-e5")  # relative corpus and model paths
    text = json.loads(corpus.read_text().splitlines()[42])["contents"]
    assert r.search([text], 1)[0][0].passage.id == "43"
    assert not prepare_index.ensure_published_wiki18(store, key, tmp_path / "unused")
    assert not (tmp_path / "unused").exists()  # published already: nothing downloaded


def test_cli_builds_or_adopts_and_publishes_only_self_contained_folders(tmp_path, corpus, encoder, tiny_e5, capsys):
    store = f"file://{tmp_path / 'store'}"
    out = tmp_path / "built"
    out.mkdir()
    shutil.copy(corpus, out / "wiki-18.jsonl")
    shutil.copytree(tiny_e5, out / "model")
    assert (
        prepare_index.main(
            [
                "build",
                "--corpus",
                str(out / "wiki-18.jsonl"),
                "--out",
                str(out),
                "--encoder",
                "e5",
                "--model",
                str(out / "model"),
                "--chunk-rows",
                "60",
                "--store",
                store,
                "--key",
                "data/search_qa/retriever/mine",
            ]
        )
        == 0
    )
    assert "built index: 120 passages x 32" in capsys.readouterr().out
    assert prepare_index.published(open_store(store), "data/search_qa/retriever/mine")
    d = search_r1_pair(tmp_path / "sr1", corpus, encoder)  # the model stays outside the folder
    assert (
        prepare_index.main(
            [
                "adopt",
                "--dir",
                str(d),
                "--model",
                str(tiny_e5),
                "--store",
                store,
                "--key",
                "data/search_qa/retriever/wiki18-e5",
            ]
        )
        == 2
    )
    err = capsys.readouterr().err
    assert "the model" in err and "outside the folder" in err
    assert not prepare_index.published(open_store(store), "data/search_qa/retriever/wiki18-e5")


def test_client_gives_up_on_a_service_that_never_answers():
    now = [0.0]
    client = RetrieverClient("http://127.0.0.1:9")  # discard port: nothing listens
    try:
        with pytest.raises(ToolServiceError, match="not ready within 30 s"):
            client.wait_ready(30, poll_s=10, clock=lambda: now[0], sleep=lambda s: now.__setitem__(0, now[0] + s))
        assert now[0] == 30
    finally:
        client.close()


@pytest.mark.e2e
@pytest.mark.timeout(6 * 3600)
def test_full_wiki18_preparation(tmp_path):
    """The paper's retriever from the hub: e5-base-v2 + Search-R1's wiki-18 corpus and flat e5 index
    (~80 GB), adopted and checked (21,015,324 rows = vectors, 768 dimensions), then served."""
    d = tmp_path / "wiki18"
    m = prepare_index.prepare_wiki18(d)
    assert (m.corpus_rows, m.ntotal, m.dim, m.model_id) == (prepare_index.WIKI18_ROWS,) * 2 + (
        768,
        retrieval_index.E5_MODEL_ID,
    )
    r = retrieval_index.open_dense(d)
    top = r.search(["who wrote the play hamlet"], 5)[0]
    assert any("shakespeare" in h.passage.contents.lower() for h in top)
