"""The retriever service, started for real over the shared corpus: Search-R1 shape, bounds, 4xx."""

from __future__ import annotations

import httpx
import pytest

from search_qa.verifier import normalize
from whale.tools.client import RetrieverClient, ToolServiceError


def post(svc, body) -> httpx.Response:
    kw = {"content": body} if isinstance(body, bytes) else {"json": body}
    return httpx.post(svc.url + "/retrieve", timeout=30, headers={"content-type": "application/json"}, **kw)


def test_batch_topk_and_search_r1_shape(retriever_service):
    resp = post(
        retriever_service,
        {"queries": ["Teutberga queen of Lotharingia", "Bosonid Boso the Elder"], "topk": 3, "return_scores": True},
    )
    assert resp.status_code == 200
    result = resp.json()["result"]
    assert len(result) == 2 and all(len(row) == 3 for row in result)
    top = result[0][0]
    assert set(top) == {"document", "score"}
    assert top["document"]["title"] == "Teutberga"
    assert set(top["document"]) >= {"id", "title", "text", "contents"}
    scores = [h["score"] for h in result[0]]
    assert scores == sorted(scores, reverse=True)


def test_defaults_are_search_r1s_documents_only_and_topk_3(retriever_service):
    """Search-R1's QueryRequest: return_scores defaults to false (the rows are the documents
    themselves) and a missing topk takes the server's --topk (3)."""
    resp = post(retriever_service, {"queries": ["Teutberga queen of Lotharingia"]})
    assert resp.status_code == 200
    row = resp.json()["result"][0]
    assert len(row) == 3
    assert row[0]["title"] == "Teutberga" and set(row[0]) == {"id", "title", "text", "contents"}


def test_return_scores_false_and_unknown_words(retriever_service):
    resp = post(retriever_service, {"queries": ["zzqxv wvvqz"], "topk": 2, "return_scores": False})
    assert resp.status_code == 200
    assert resp.json()["result"] == [[]]  # no known word: nothing, not an error
    plain = post(retriever_service, {"queries": ["Lothair II"], "topk": 2, "return_scores": False}).json()
    assert len(plain["result"][0]) == 2 and all("contents" in d and "document" not in d for d in plain["result"][0])


def test_healthz_describes_the_index(retriever_service):
    about = httpx.get(retriever_service.url + "/healthz", timeout=10).json()
    assert about == {"ok": True, "method": "bm25", "passages": 19695}


def test_client_finds_answer_passage_for_a_popqa_question(retriever_service):
    client = RetrieverClient(retriever_service.url)
    try:
        hits = client.search(["What is Teutberga's occupation?"], 5)
        assert any("queen" in normalize(h.passage.contents) for h in hits[0])
        with pytest.raises(ToolServiceError, match="422"):
            client.search(["q"] * 9, 1)
    finally:
        client.close()


@pytest.mark.parametrize(
    ("body", "status", "field"),
    [
        (b"{not json", 422, "body"),
        ({"topk": 3}, 422, "queries"),
        ({"queries": [], "topk": 3}, 422, "queries"),
        ({"queries": ["a"] * 9, "topk": 3}, 422, "queries"),
        ({"queries": ["a"], "topk": 0}, 422, "topk"),
        ({"queries": ["a"], "topk": 11}, 422, "topk"),
        ({"queries": ["a" * 1001], "topk": 1}, 422, "queries.0"),
        ({"queries": [3], "topk": 1}, 422, "queries.0"),
        (b'{"queries": ["' + b"a" * 300_000 + b'"]}', 413, "bytes"),
    ],
)
def test_bad_requests_get_4xx_and_service_keeps_serving(retriever_service, body, status, field):
    resp = post(retriever_service, body)
    assert resp.status_code == status
    assert field in resp.json()["detail"]
    assert post(retriever_service, {"queries": ["Lothair II"], "topk": 1}).status_code == 200
