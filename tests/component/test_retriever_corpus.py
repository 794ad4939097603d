"""spec.experiment.domainOptions.corpus end to end on the shipped data: the prepare workload puts the local corpus where the
cluster's retriever pod fetches it, and workloads wait for the deployed retriever before their first
episode (the operator's side: tests/operator/test_retriever_corpus.py)."""

from __future__ import annotations

import pytest

import search_qa
from search_qa.env import SearchEnvironment
from tests.component.test_prepare_workload import write_spec
from whale.core import layout
from whale.core.spec import Data
from whale.store import open_store
from whale.tools.client import RetrieverClient
from whale.tools.retrieval_index import RetrieverError
from whale.workloads import prepare


def test_prepare_puts_the_local_corpus_in_the_store_once(tmp_path, search_corpus):
    store = open_store(f"file://{tmp_path / 'store'}")
    spec = write_spec(store, "sq", "search_qa", harnessSize=8, testSize=2, corpus="local")
    sizes = prepare.main(store, "sq", "prepare")
    key = f"{layout.data_prefix('search_qa')}/corpus/wiki_passages.jsonl"
    assert store.read_bytes(key) == search_corpus.read_bytes()
    assert sizes == search_qa.DOMAIN.split_sizes(spec.experiment.data) and sizes["harness"] == 8
    mtime = store.local_path(key).stat().st_mtime_ns
    prepare.main(store, "sq", "prepare")
    assert store.local_path(key).stat().st_mtime_ns == mtime  # there already: not written again


def test_workload_waits_for_the_deployed_retriever_then_searches_through_it(retriever_service, monkeypatch):
    monkeypatch.setenv("WHALE_RETRIEVER_URL", retriever_service.url)
    domain = search_qa.SearchQA()
    items = domain.load_split("harness", Data(harness_size=4, test_size=1, weight_size=4))
    assert len(items) == 4
    assert isinstance(domain._retriever, RetrieverClient)  # resolved (health-checked) before any episode
    env = SearchEnvironment({"id": "q", "question": "x", "golden_answers": ["queen"]}, domain.retriever)
    assert "Teutberga" in env.call_tool("search", {"query_list": ["Teutberga queen of Lotharingia"], "topk": 1})


def test_the_papers_corpus_without_a_retriever_is_a_clear_error(monkeypatch):
    monkeypatch.delenv("WHALE_RETRIEVER_URL", raising=False)
    monkeypatch.delenv("WHALE_SEARCH_INDEX", raising=False)
    domain = search_qa.SearchQA().with_options({"corpus": "wiki18"})
    domain.load_split("test", Data(test_size=1))
    with pytest.raises(
        RetrieverError, match="spec.experiment.domainOptions.corpus wiki18 has no in-process index.*WHALE_RETRIEVER_URL"
    ):
        domain.retriever()
