"""The prototyping kit's ``tools.call(name, ...)`` answers exactly as the harness's environment does (issue 30), run by
a bare ``python3 -I -S`` with only ``proto/`` on its path, as the agent's shell runs it: ``search`` with the same
``{"result": ...}`` JSON, passage rendering and 200-token cut on the real retriever services (BM25 over the shipped
corpus, with and without the policy's tokenizer); ``code_interpreter`` with the same output, hint and tool errors
on the real code interpreter service; both with the same tool error when their service fails (500, closed port);
chess's ``step`` through the environment service as a local harness phase starts it, on the sample's real D_harness
puzzles, as the episode runner hands a harness each move's answer."""

from __future__ import annotations

import http.server
import json
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

import chess_puzzles
import math_reasoning
import search_qa
from math_reasoning.env import MathEnvironment
from math_reasoning.env import ToolError as CodeToolError
from search_qa.env import SearchEnvironment, ToolError
from tests.fixtures.http_double import DoubleHTTPServer
from tests.fixtures.tools import Service, free_port
from whale.core.spec import Data, Proposer, Verifier
from whale.domain import Domain, env_items_key
from whale.sandbox.process import base_python
from whale.store import open_store
from whale.tools.client import CodeClient, RetrieverClient
from whale.tools.env_replay import EnvReplay
from whale.tools.env_service import load_replay, serve_locally
from whale.workloads.search import needs_local_env_service, prototype_files

RUNNER = r"""
import json, sys
sys.path.insert(0, "proto")
import tools
out = []
for args in json.load(sys.stdin):
    try:
        out.append({"text": tools.call(sys.argv[1], args)})
    except ValueError as exc:
        out.append({"error": str(exc)})
print(json.dumps(out))
"""


def kit_answers(tmp_path: Path, domain: Domain, tool: str, calls: list[dict]) -> list[dict]:
    """Each call of ``tool`` answered by the kit's tools.py in a bare interpreter (no site-packages, no project)."""
    data = Data(harness_size=4, test_size=2, weight_size=4)
    items = domain.load_split("harness", data)
    kit = prototype_files(domain, data, items, domain.h0_path().read_text("utf-8"))
    for rel, text in kit.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    done = subprocess.run(
        [base_python(), "-I", "-S", "-c", RUNNER, tool],
        input=json.dumps(calls),
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def env_answers(service: Service, calls: list[dict]) -> list[dict]:
    client = RetrieverClient(service.url)
    try:
        env = SearchEnvironment({"id": "q", "question": "q", "golden_answers": ["x"]}, client)
        out: list[dict] = []
        for args in calls:
            try:
                out.append({"text": env.call_tool("search", args)})
            except ToolError as exc:
                out.append({"error": str(exc)})
        return out
    finally:
        client.close()


CALLS = [
    {"query_list": ["Teutberga queen of Lotharingia"], "topk": 1, "max_doc_tokens": 200},  # h0's call
    {"query_list": ["Teutberga queen of Lotharingia"], "topk": 3, "max_doc_tokens": 12},
    {"query_list": ["who wrote the iliad", "capital of Lotharingia"], "topk": 2},  # defaults: 200 tokens
    {"query_list": "Lothair II", "max_doc_tokens": "30"},  # as a model may write it
    {"query_list": []},
    {"query_list": ["q"], "topk": 11},
]


@pytest.mark.timeout(300)
@pytest.mark.parametrize("cutting", [False, True], ids=["words", "policy-tokens"])
def test_the_kits_search_answers_as_the_environments(
    cutting, retriever_service, cutting_retriever_service, monkeypatch, tmp_path
):
    service = cutting_retriever_service if cutting else retriever_service
    monkeypatch.setenv("WHALE_RETRIEVER_URL", service.url)
    got = kit_answers(tmp_path, search_qa.SearchQA(), "search", CALLS)
    want = env_answers(service, CALLS)
    assert got == want
    # what was compared is the real tool message: JSON {"result": ...}, passages rendered and cut
    first = json.loads(want[0]["text"])["result"]
    assert first.startswith("Doc 1(Title: ") and "\n" not in first
    short = json.loads(want[1]["text"])["result"].splitlines()
    assert len(short) == 3
    if cutting:  # cut in the tiny Qwen's tokens by the service: no word-cut marker
        assert not any(line.endswith(" ...") for line in short)
    else:  # cut at 12 words here
        assert all(line.endswith(" ...") for line in short)
    assert json.loads(want[2]["text"])["result"].startswith("Query: who wrote the iliad\nDoc 1(Title: ")
    assert want[4] == {"error": "search: `query_list` must be a non-empty list of strings"}
    assert "topk" in want[5]["error"]


CODE_CALLS = [
    {"code": "print(2 + 3)"},
    {"code": "x = 1"},  # no output: the hint
    {"code": "6 * 7"},  # a final bare expression is printed
    {"code": "print('partial')\n1 / 0"},  # the error, with the output before it
    {"code": "```python\nprint('fenced')\n```"},
    {"code": 5},  # not a string
    {},
]


@pytest.mark.timeout(300)
def test_the_kits_code_interpreter_answers_as_the_environments(code_service, monkeypatch, tmp_path):
    monkeypatch.setenv("WHALE_CODE_URL", code_service.url)
    got = kit_answers(tmp_path, math_reasoning.MathReasoning(), "code_interpreter", CODE_CALLS)
    client = CodeClient(code_service.url)
    env = MathEnvironment({"id": "m", "problem": "p", "answer": "1"}, client)
    want: list[dict] = []
    try:
        for args in CODE_CALLS:
            try:
                want.append({"text": env.call_tool("code_interpreter", args)})
            except CodeToolError as exc:
                want.append({"error": str(exc)})
    finally:
        client.close()
    assert got == want
    assert want[0] == {"text": "5\n"} and want[1] == {"text": "(no output: print() the values you need)"}
    assert want[2] == {"text": "42\n"} and want[4] == {"text": "fenced\n"}
    assert "ZeroDivisionError" in want[3]["error"] and want[3]["error"].endswith("Output before the error: partial\n")
    assert want[5]["error"].startswith("code_interpreter needs a string argument `code`") and want[6] == want[5]


class _Failing(http.server.BaseHTTPRequestHandler):
    """Every request answered 500 with a JSON body, as a crashed service behind a proxy answers."""

    def _fail(self) -> None:
        body = b'{"detail": "the index is gone"}'
        self.send_response(500)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        self._fail()

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("content-length") or 0))
        self._fail()

    def log_message(self, *args) -> None:
        pass


@pytest.fixture
def failing_url() -> Iterator[str]:
    server = DoubleHTTPServer(("127.0.0.1", 0), _Failing)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("failure", ["500", "closed-port"])
def test_a_failing_service_gives_the_kit_the_environments_tool_error(failure, failing_url, monkeypatch, tmp_path):
    """A service that answers 500, or a port nobody listens on: the kit's ``tools.call`` raises the tool error the
    environment's model reads (the same text), not a urllib traceback."""
    url = failing_url if failure == "500" else f"http://127.0.0.1:{free_port()}"
    monkeypatch.setenv("WHALE_RETRIEVER_URL", url)
    monkeypatch.setenv("WHALE_CODE_URL", url)
    search_call = {"query_list": ["Teutberga"], "topk": 1}
    retriever = RetrieverClient(url)  # given, so building the kit waits for no retriever to become ready
    code = CodeClient(url)
    try:
        got_search = kit_answers(tmp_path / "search", search_qa.SearchQA(retriever), "search", [search_call])
        got_code = kit_answers(
            tmp_path / "code", math_reasoning.MathReasoning(code), "code_interpreter", [{"code": "1"}]
        )
        with pytest.raises(ToolError) as search_error:
            SearchEnvironment({"id": "q", "question": "q", "golden_answers": ["x"]}, retriever).call_tool(
                "search", search_call
            )
        with pytest.raises(CodeToolError) as code_error:
            MathEnvironment({"id": "m", "problem": "p", "answer": "1"}, code).call_tool(
                "code_interpreter", {"code": "1"}
            )
    finally:
        retriever.close()
        code.close()
    assert got_search == [{"error": str(search_error.value)}]
    assert got_code == [{"error": str(code_error.value)}]
    # what was compared is the environment's wording of a service failure, naming the URL and why
    assert str(search_error.value).startswith(f"search failed: {url}/retrieve unreachable after 3 attempts: ")
    assert str(code_error.value).startswith(f"The code interpreter service failed: {url}/run unreachable after 3 ")
    why = "failed (500): " if failure == "500" else "Connection refused"
    assert why in str(search_error.value) and why in str(code_error.value)


def chess_lines(item: dict) -> list[list]:
    """Action sequences a prototype might try on one puzzle: the stored line (and moves after its end), a wrong
    move after the first right one, the forgiven retries and what ends them, answers that are not moves."""
    solver = item["Moves"].split()[1::2]
    env = chess_puzzles.DOMAIN.make_env(item)
    legal = [m["uci"] for m in env.reset()["legal_moves"]]
    wrong = next(m for m in legal if m != solver[0])
    return [
        solver,
        [*solver, "e2e4", "a7a8q"],  # after the end: unplayed, as the runner stops there
        [solver[0], "0000", wrong] if len(solver) > 1 else [wrong],
        [wrong],
        ["hello", "e2e5" if "e2e5" not in legal else "a1a1", solver[0]],  # malformed, illegal: both forgiven
        ["a1a1", "h8h8"],  # a second illegal move ends the puzzle
        [None, 42, {"move": solver[0]}],
        [],
    ]


def episode_results(item: dict, actions: list) -> list[dict]:
    """What the episode runner hands a harness's ``observe`` for each action, in-process."""
    env = chess_puzzles.ChessPuzzles().make_env(item)
    env.reset()
    out = []
    for action in actions:
        out.append(env.step(action).harness_result())
        if out[-1]["done"]:
            break
    return out


@pytest.mark.timeout(300)
def test_the_kits_chess_steps_answer_as_the_episodes(monkeypatch, tmp_path):
    """The environment service, started as a local harness phase starts it (``serve_locally``), answers the kit's
    ``tools.step`` on the sample's real D_harness puzzles exactly as the episodes' environment answers a harness."""
    domain = chess_puzzles.ChessPuzzles()
    data = Data(harness_size=4, test_size=2, weight_size=4)
    items = domain.load_split("harness", data)
    calls = [
        {"task": domain.make_env(item).reset(), "actions": actions} for item in items for actions in chess_lines(item)
    ]
    (tmp_path / "svc").mkdir()
    with serve_locally("chess_puzzles", items, Verifier().to_wire(), tmp_path / "svc") as url:
        monkeypatch.setenv("WHALE_ENV_URL", url)
        got = kit_answers(tmp_path / "kit", domain, "env", calls)
    want = [{"text": episode_results(item, actions)} for item in items for actions in chess_lines(item)]
    assert got == want
    # what was compared is the episodes' answers: a solved line, the opponent's replies, a lost puzzle, retries
    solved = want[0]["text"]
    assert (
        solved[-1]["done"] and solved[-1]["observation"]["solved"] and solved[-1]["observation"]["verdict"] == "solved"
    )
    assert len(want[1]["text"]) == len(solved)  # nothing played after the end
    assert want[3]["text"][0]["observation"]["verdict"] == "wrong" and want[3]["text"][0]["done"]
    retries = [r["observation"]["verdict"] for r in want[4]["text"]]
    assert retries[:2] == ["malformed", "illegal"] and not want[4]["text"][1]["done"]
    assert [r["done"] for r in want[5]["text"]] == [False, True]
    assert want[7]["text"] == []
    many = json.loads(json.dumps(want))
    assert not any("reward" in r or "info" in r for line in many for r in line["text"])


def test_the_prepared_store_holds_the_d_harness_the_env_service_fetches(tmp_path):
    """A cluster's environment service serves what the run's prepare put in the store (``Domain.prepare_store``, the
    key its init container fetches): the D_harness items and no other, loaded as ``python -m whale.tools.env_service``
    loads them, judging by the run's verifier. Which local phase starts one itself: a chess ``cli`` agent's with a
    network, in a run that deployed none."""
    domain = chess_puzzles.ChessPuzzles()
    data = Data(harness_size=4, test_size=2, weight_size=4)
    store = open_store(str(tmp_path / "store"))
    domain.prepare_store(data, store)
    [tool] = domain.tool_services_for(data)
    [(key, flag)] = tool.fetch
    assert flag == "--items" and key == env_items_key(data)
    path = tmp_path / "harness.jsonl"
    path.write_bytes(store.read_bytes(f"data/chess_puzzles/{key}"))
    replay = load_replay("chess_puzzles", path, json.dumps(Verifier().to_wire()), json.dumps({"chessMove": "anyMate"}))
    harness = domain.load_split("harness", data)
    assert list(replay.items.values()) == harness and replay.domain.accept_any_mate
    assert not {i["id"] for i in domain.load_split("test", data)} & {i["id"] for i in replay.items.values()}
    assert env_items_key(Data(harness_size=8, test_size=2, weight_size=4)) != key  # other settings, other items
    with pytest.raises(ValueError, match="prototype_steps is False"):
        EnvReplay(search_qa.SearchQA(), [])  # a domain whose step is the graded answer is never served

    cli = Proposer(backend="cli", command=["agent"])  # behind the egress proxy: it reaches the services its kit lists
    assert needs_local_env_service(domain, cli, {})
    assert needs_local_env_service(domain, Proposer(backend="cli", command=["agent"], network="host"), {})
    assert not needs_local_env_service(domain, cli, {"WHALE_ENV_URL": "http://env:8080"})  # the cluster's
    assert not needs_local_env_service(domain, Proposer(backend="cli", command=["agent"], network="none"), {})
    assert not needs_local_env_service(domain, Proposer(backend="openai"), {})  # try_harness plays the steps
    assert not needs_local_env_service(search_qa.SearchQA(), cli, {})
