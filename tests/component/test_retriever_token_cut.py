"""Passages cut in the policy's tokens by the retriever service (``--tokenizer``), as the reference's server
cuts them; the search tool asks for it when the service can, and falls back to words when it cannot."""

from __future__ import annotations

import subprocess
import sys

import httpx
import pytest
from transformers import AutoTokenizer

from search_qa.env import SearchEnvironment
from tests.fixtures.tools import Service, run_service
from whale import plugins
from whale.tools.client import RetrieverClient

QUESTION = "Teutberga queen of Lotharingia"


@pytest.fixture
def cutting_service(cutting_retriever_service: Service) -> Service:
    return cutting_retriever_service


def retrieve(svc: Service, body: dict) -> httpx.Response:
    return httpx.post(svc.url + "/retrieve", json=body, timeout=30)


def test_contents_cut_to_the_first_tokens_of_the_policys_tokenizer(cutting_service, tiny_qwen3_dir):
    tok = AutoTokenizer.from_pretrained(str(tiny_qwen3_dir))
    whole = retrieve(cutting_service, {"queries": [QUESTION], "topk": 3}).json()["result"][0]
    cut = retrieve(cutting_service, {"queries": [QUESTION], "topk": 3, "max_doc_tokens": 60}).json()["result"][0]
    assert [d["id"] for d in cut] == [d["id"] for d in whole]
    for full, short in zip(whole, cut, strict=True):
        ids = tok.encode(full["contents"], add_special_tokens=False)
        assert len(ids) > 60  # every top passage is longer than the cut, so the cut is seen
        assert short["contents"] == tok.decode(ids[:60])
        assert full["contents"].startswith(short["contents"])
        # the title stays; the text is what the cut leaves after the title line
        assert short["title"] == full["title"] and short["text"] == short["contents"].partition("\n")[2]
        assert short["text"] and full["text"].startswith(short["text"]) and short["text"] != full["text"]
    # the reference's clients name the tokenizer too; the service cuts with its own, never loads that name
    named = {"queries": [QUESTION], "topk": 3, "max_doc_tokens": 60, "tokenizer_name": "Qwen/Qwen3.5-2B"}
    assert retrieve(cutting_service, named).json()["result"][0] == cut


def test_healthz_names_the_tokenizer_and_the_bound_is_enforced(cutting_service, tiny_qwen3_dir):
    about = httpx.get(cutting_service.url + "/healthz", timeout=10).json()
    assert about["tokenizer"] == tiny_qwen3_dir.name
    for bad in (0, 4097):
        resp = retrieve(cutting_service, {"queries": [QUESTION], "max_doc_tokens": bad})
        assert resp.status_code == 422 and "max_doc_tokens" in resp.json()["detail"]


def test_a_service_without_tokenizer_refuses_a_token_cut_by_name(retriever_service):
    resp = retrieve(retriever_service, {"queries": [QUESTION], "max_doc_tokens": 60})
    assert resp.status_code == 422
    assert "max_doc_tokens" in resp.json()["detail"] and "--tokenizer" in resp.json()["detail"]
    assert RetrieverClient(retriever_service.url).cuts_tokens is False


def test_search_tool_cuts_in_tokens_through_a_service_with_a_tokenizer(cutting_service, tiny_qwen3_dir):
    tok = AutoTokenizer.from_pretrained(str(tiny_qwen3_dir))
    client = RetrieverClient(cutting_service.url)
    try:
        assert client.cuts_tokens is True
        env = SearchEnvironment({"id": "q", "question": QUESTION, "golden_answers": ["queen"]}, client)
        reply = env.call_tool("search", {"query_list": [QUESTION], "topk": 1, "max_doc_tokens": 60})
        top = client.search([QUESTION], 1)[0][0].passage
        expected = tok.decode(tok.encode(top.contents, add_special_tokens=False)[:60])
        cut_text = expected.partition("\n")[2]
        assert cut_text and cut_text in reply
        assert " ..." not in reply  # not the word cut's marker
    finally:
        client.close()


def test_the_operators_retriever_pod_cuts_in_the_policys_tokens(tmp_path, search_corpus, tiny_qwen3_dir):
    """The retriever Deployment the operator renders, run here: its init container ``fetch-tokenizer`` places the
    policy model's tokenizer (``spec.experiment.model.name``, a folder here as an image-baked model is) and the service then
    started with the rendered ``--tokenizer`` cuts passages in that tokenizer's tokens."""
    from whale_operator import builders
    from whale_operator.cluster_spec import ClusterRunSpec

    spec = ClusterRunSpec.model_validate(
        {
            "domain": "search_qa",
            "condition": "mh_only",
            "model": {"name": str(tiny_qwen3_dir)},
            "storage": {"uri": "s3://w"},
        }
    )
    [tool] = plugins.load("search_qa").tool_services
    pod = builders.tool_deployment(builders.RunRef("r", "ns", "u"), spec, tool, store_uri="s3://w")["spec"]["template"]
    fetch = {c["name"]: c for c in pod["spec"]["initContainers"]}["fetch-tokenizer"]
    here = {"/tokenizer": str(tmp_path / "tokenizer"), "/data/wiki_passages.jsonl": str(search_corpus)}

    def local(arg: str) -> str:
        for pod_path, path in here.items():
            if arg.startswith(pod_path):
                return path + arg[len(pod_path) :]
        return arg

    assert fetch["command"][:3] == ["python", "-m", "whale.tools.passage_cut"]
    done = subprocess.run(
        [sys.executable, *map(local, fetch["command"][1:])], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert not list((tmp_path / "tokenizer" / "policy").glob("*.safetensors"))  # the tokenizer only, no weights
    command = pod["spec"]["containers"][0]["command"]
    args = [local(a) for a in command[command.index("--port") + 2 :]]
    assert args[-2:] == ["--tokenizer", str(tmp_path / "tokenizer" / "policy")]
    with run_service(
        "whale.tools.retriever_service", args + ["--cache-dir", str(tmp_path / "c")], tmp_path / "l"
    ) as svc:
        assert httpx.get(svc.url + "/healthz", timeout=10).json()["tokenizer"] == "policy"
        tok = AutoTokenizer.from_pretrained(str(tiny_qwen3_dir))
        whole = retrieve(svc, {"queries": [QUESTION], "topk": 1}).json()["result"][0][0]["contents"]
        cut = retrieve(svc, {"queries": [QUESTION], "topk": 1, "max_doc_tokens": 40}).json()["result"][0][0]
        assert cut["contents"] == tok.decode(tok.encode(whole, add_special_tokens=False)[:40]) != whole


def test_a_model_without_a_tokenizer_stops_the_init_container_naming_the_field(tmp_path):
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text("{}")
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "whale.tools.passage_cut",
            "--model",
            str(tmp_path / "model"),
            "--dest",
            str(tmp_path / "t"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 1
    assert (
        "spec.experiment.model.name" in done.stderr
        and "does not load" in done.stderr
        and "Traceback" not in done.stderr
    )
