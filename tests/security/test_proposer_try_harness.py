"""The built-in proposers prototype as the reference's skills require (issue 30), with ``try_harness``: a harness's
hooks on real D_harness tasks in the real harness sandbox, model replies scripted by the agent, its search calls
answered by the real retriever (started offline on loopback) exactly as in the episodes — and nothing graded: no
reward, no gold answer, no test item, no rollout (the policy model is never called).

Through the OpenAI-compatible and the Anthropic backends, each against its loopback double of the API
(``ScriptedProposerServerDouble``, ``MessagesAPIDouble``): the agent asks for a try-out, reads the passages that
came back and proposes."""

from __future__ import annotations

import asyncio
import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

import chess_puzzles
import search_qa
from search_qa.env import SearchEnvironment
from synthetic import DOMAIN as SYNTHETIC
from tests.component.test_search_phase import GOOD
from tests.fixtures.harness_host import start_harness_host
from tests.fixtures.messages_api_double import MessagesAPIDouble, text, tool_use
from tests.fixtures.proposer_double import ScriptedProposerServerDouble, assistant, tool_call
from whale.core.spec import Data
from whale.harness.launch import SandboxLimits
from whale.inference.base import ChatResult, InferenceClient, SamplingParams
from whale.metaharness.evaluate import CandidateEvaluator, EvalSettings
from whale.metaharness.proposer.anthropic_agent import AnthropicAgentProposer, AnthropicClient
from whale.metaharness.proposer.base import ProposalRequest
from whale.metaharness.proposer.openai_agent import OpenAIAgentProposer, ProposerClient
from whale.metaharness.proposer.tools import (
    MAX_TRYOUT_ITEMS,
    HarnessTryouts,
    ProposerTools,
    SandboxShell,
    Toolbox,
)
from whale.metaharness.proposer.workspace import ToolError, Workspace
from whale.metaharness.validate import candidate_problems
from whale.sandbox import process as sandbox_process
from whale.sandbox import run as sandbox_run
from whale.sandbox import worker as sandbox_worker
from whale.tools.client import RetrieverClient
from whale.workloads.search import prototype_files

QUERY = "Teutberga queen of Lotharingia"
SEARCH_REPLY = '<tool_call>{"name": "search", "arguments": {"query_list": ["' + QUERY + '"], "topk": 3}}</tool_call>'
ANSWER_REPLY = "<answer>Lothair II</answer>"
#: run in the built-in agent's sandboxed shell (cwd: its archive copy, where the kit is)
HOOKS = (
    "import json, os, sys; sys.path.insert(0, 'proto'); import incoming; "
    "tasks = [json.loads(l) for l in open('proto/tasks.jsonl')]; "
    "d = incoming.Harness().start(tasks[0], {}); "
    "print('tasks', len(tasks)); print('tools.py', os.path.exists('proto/tools.py')); print(json.dumps(d))"
)
SETTINGS = EvalSettings(smoke_hook_timeout_s=10.0, candidate_timeout_s=120, max_concurrency=4)


class UnreachableModelDouble(InferenceClient):
    """The phase's policy model as a test double that fails the test if a try-out ever calls it."""

    model = "unreachable-double"

    async def chat(
        self,
        messages: list[dict[str, Any]],
        sampling: SamplingParams,
        n: int = 1,
        tools: list[dict[str, Any]] | None = None,
    ) -> ChatResult:
        raise AssertionError("a try-out must never call the policy model")


@pytest.fixture
def search_setup(retriever_service, monkeypatch) -> tuple[search_qa.SearchQA, list[dict], list[dict], str]:
    monkeypatch.setenv("WHALE_RETRIEVER_URL", retriever_service.url)
    domain = search_qa.SearchQA()
    data = Data(harness_size=8, test_size=2, weight_size=8)
    return domain, domain.load_split("harness", data), domain.load_split("test", data), retriever_service.url


def _tryouts(domain, items: list[dict], calls: int = 24) -> HarnessTryouts:
    h0 = domain.h0_path().read_text("utf-8")
    evaluator = CandidateEvaluator(domain, UnreachableModelDouble(), items, SETTINGS)

    def gate(code: str) -> list[str]:
        return candidate_problems(code, incoming=h0, allowed_imports=domain.allowed_imports, prompt_only=False)

    return HarnessTryouts(evaluator, check=gate, calls=calls)


def _environment_answer(url: str, arguments: dict) -> str:
    client = RetrieverClient(url)
    try:
        env = SearchEnvironment({"id": "x", "question": "x", "golden_answers": ["x"]}, client)
        return env.call_tool("search", arguments)
    finally:
        client.close()


@pytest.mark.timeout(300)
def test_try_harness_runs_h0s_search_on_real_tasks_and_grades_nothing(search_setup, tmp_path: Path):
    domain, items, test_items, url = search_setup
    h0 = domain.h0_path().read_text("utf-8")
    tryouts = _tryouts(domain, items)
    box = Toolbox(Workspace(tmp_path, tmp_path / "scratch", 1), ProposerTools(tryouts=tryouts))
    ids = [i["id"] for i in items[:3]]
    out = asyncio.run(box.call("try_harness", {"code": h0, "items": ids, "replies": [SEARCH_REPLY, ANSWER_REPLY]}))
    answer = json.loads(out)
    assert answer["valid"] and answer["error"] is None and answer["calls_left"] == 23
    # h0 forces its search to the first query, top 1, 200 tokens: what came back is the environment's own answer
    expected = _environment_answer(url, {"query_list": [QUERY], "topk": 1, "max_doc_tokens": 200})
    assert json.loads(expected)["result"].startswith("Doc 1(Title: ")
    questions = {i["id"]: i["question"] for i in items}
    assert [e["item_id"] for e in answer["episodes"]] == ids
    for episode in answer["episodes"]:
        tool_steps = [a for a in episode["actions"] if a["action"]["kind"] == "tool"]
        [search] = tool_steps
        assert search["action"]["arguments"] == {"query_list": [QUERY], "topk": 1, "max_doc_tokens": 200}
        assert search["result"]["content"] == expected and search["result"]["error"] is None
        # the harness's prompt held the real task; the scripted replies were the model's turns
        assert any(questions[episode["item_id"]] in str(m.get("content")) for m in episode["messages"])
        assert next(m for m in episode["messages"] if m["role"] == "assistant")["tool_calls"]
        # the submission ended the episode ungraded
        assert episode["actions"][-1]["action"]["kind"] == "env"
        assert episode["actions"][-1]["result"]["observation"] == {"submitted": True, "graded": False}
    # no grade and no gold anywhere in what the agent reads
    assert "reward" not in out and "golden" not in out and '"graded": ["' not in out
    golds = {g for i in items for g in i["golden_answers"]} - {"Lothair II"}
    assert not any(f'"{g}"' in out for g in golds)
    assert tryouts.log[0]["items"] == ids and tryouts.log[0]["errors"] == 0

    # bounds: never a test item, at most MAX_TRYOUT_ITEMS tasks, the replies a short list, the calls counted
    refused = asyncio.run(box.call("try_harness", {"code": h0, "items": [test_items[0]["id"]], "replies": ["x"]}))
    assert refused.startswith("error: not training (D_harness) items") and "try_harness" in refused
    many = asyncio.run(box.call("try_harness", {"code": h0, "items": [i["id"] for i in items[:6]], "replies": ["x"]}))
    assert many == f"error: 6 items asked for; at most {MAX_TRYOUT_ITEMS} per call"
    assert asyncio.run(box.call("try_harness", {"code": h0, "replies": []})).startswith("error: `replies` must be")
    assert asyncio.run(box.call("try_harness", {"code": h0, "replies": ["x"] * 9})).startswith("error: `replies`")
    assert len(tryouts.log) == 1  # refused calls run nothing and spend nothing


@pytest.mark.timeout(120)
def test_a_harness_the_gate_refuses_is_not_run_and_the_calls_run_out(search_setup, tmp_path: Path):
    domain, items, _, _ = search_setup
    tryouts = _tryouts(domain, items, calls=1)
    bad = "import os\n" + domain.h0_path().read_text("utf-8")
    answer = json.loads(asyncio.run(tryouts.run(bad, name="bad", replies=[ANSWER_REPLY], k=1)))
    assert answer["valid"] is False and any("os" in p for p in answer["problems"]) and tryouts.log == []
    h0 = domain.h0_path().read_text("utf-8")
    asyncio.run(tryouts.run(h0, name="h0", replies=[ANSWER_REPLY], k=1))
    with pytest.raises(ToolError, match="all 1 try_harness calls of this iteration are spent"):
        asyncio.run(tryouts.run(h0, name="h0", replies=[ANSWER_REPLY], k=1))


def _request(tmp_path: Path, domain, tryouts: HarnessTryouts, kit: dict[str, str] | None = None) -> ProposalRequest:
    """``kit``: the workspace files (the prototyping kit); with it the agent has run_shell too."""
    archive = tmp_path / "archive"
    archive.mkdir()
    shell = SandboxShell(archive, tmp_path / "scratch" / "candidates") if kit is not None else None
    (archive / "summary.md").write_text("# summary\nBest so far: i01-incoming (0.25)\n")
    h0 = domain.h0_path().read_text("utf-8")
    return ProposalRequest(
        iteration=2,
        count=1,
        archive_dir=archive,
        scratch_dir=tmp_path / "scratch",
        skill="Answer factual questions.",
        incoming_code=h0,
        incoming_id="i01-incoming",
        prompt_only=False,
        allowed_imports=tuple(sorted(domain.allowed_imports)),
        timeout_s=240,
        max_turns=10,
        max_tokens=1_000_000,
        tools=ProposerTools(tryouts=tryouts, shell=shell),
        workspace=kit or {},
    )


def _passages_seen(results: list[str]) -> list[str]:
    """The search results inside the try_harness answers the model was sent."""
    seen = []
    for r in results:
        if r.startswith('{"harness"'):
            for e in json.loads(r)["episodes"]:
                seen += [a["result"]["content"] for a in e["actions"] if a["action"]["kind"] == "tool"]
    return seen


@pytest.mark.timeout(300)
def test_the_openai_backend_prototypes_with_try_harness_then_proposes(search_setup, tmp_path: Path):
    domain, items, _, url = search_setup
    h0 = domain.h0_path().read_text("utf-8")
    kit = prototype_files(domain, Data(harness_size=8, test_size=2, weight_size=8), items, h0)
    turns = [
        # offline first: the kit's API, incoming harness and tasks in the sandboxed shell (no network there)
        assistant(tool_call("run_shell", "c0", command=f"python3 -I -c {HOOKS!r}")),
        assistant(tool_call("try_harness", "c1", code=h0, k=2, replies=[SEARCH_REPLY, ANSWER_REPLY])),
        assistant(tool_call("write_candidate", "c2", name="h0again", code=h0, rationale="a revert, prototyped")),
        assistant(tool_call("finish", "c3", summary="done")),
    ]
    with ScriptedProposerServerDouble(turns) as srv:
        proposer = OpenAIAgentProposer(ProposerClient(srv.base_url, "double"))
        report = asyncio.run(proposer.propose(_request(tmp_path, domain, _tryouts(domain, items), kit)))
        asyncio.run(proposer.aclose())
    shell_out = srv.tool_results()[0]
    assert shell_out.startswith("exit: 0\n"), shell_out
    # h0's start on the first real task, run offline: its prompt holds the question; no gold, no service client
    assert f"Question: {items[0]['question']}" in shell_out and "tasks 8" in shell_out
    assert "tools.py False" in shell_out and "golden" not in shell_out
    assert [p.name for p in report.proposals] == ["h0again"] and report.stopped_by == "finish"
    first = srv.requests[0]
    assert "try_harness" in {t["function"]["name"] for t in first["tools"]}
    assert "`try_harness` prototypes a harness" in first["messages"][-1]["content"]
    assert "`proto/` in the archive holds the harness API" in first["messages"][-1]["content"]
    expected = _environment_answer(url, {"query_list": [QUERY], "topk": 1, "max_doc_tokens": 200})
    assert _passages_seen(srv.tool_results()) == [expected, expected]


@pytest.mark.timeout(300)
def test_the_anthropic_backend_prototypes_with_try_harness_then_proposes(search_setup, tmp_path: Path):
    domain, items, _, url = search_setup
    h0 = domain.h0_path().read_text("utf-8")
    script = [
        [
            text("Let me try h0's search first."),
            tool_use("try_harness", "toolu_1", code=h0, k=1, replies=[SEARCH_REPLY]),
        ],
        [tool_use("write_candidate", "toolu_2", name="h0again", code=h0, rationale="a revert, prototyped")],
        [tool_use("finish", "toolu_3", summary="done")],
    ]
    with MessagesAPIDouble(script, key="sk-ant-double") as api:
        proposer = AnthropicAgentProposer(AnthropicClient(api.base_url, "claude-double", "sk-ant-double"))
        report = asyncio.run(proposer.propose(_request(tmp_path, domain, _tryouts(domain, items))))
        asyncio.run(proposer.aclose())
    assert api.refusals == [] and [p.name for p in report.proposals] == ["h0again"]
    assert "try_harness" in {t["name"] for t in api.requests[0]["tools"]}
    expected = _environment_answer(url, {"query_list": [QUERY], "topk": 1, "max_doc_tokens": 200})
    # one scripted reply: the search ran, then the script ran out (empty replies) and h0 ended the episode
    assert _passages_seen(api.tool_results()) == [expected]


def _no_sandbox_here(*args: object, **kwargs: object) -> None:
    raise AssertionError("at sandbox.isolation pod the search pod starts no sandbox itself")


@pytest.mark.timeout(180)
def test_at_pod_isolation_the_try_out_runs_on_the_harness_host(monkeypatch, tmp_path: Path):
    """spec.execution.sandbox.isolation pod: the harness runs on the run's harness host (this process starts no sandbox)."""
    items = SYNTHETIC.load_split("harness", Data(harness_size=4))
    with start_harness_host("pod") as (host, _):
        for module in (sandbox_process, sandbox_run, sandbox_worker):
            monkeypatch.setattr(module, "launch", _no_sandbox_here)
        settings = dataclasses.replace(SETTINGS, limits=SandboxLimits(isolation="pod", host=host))
        evaluator = CandidateEvaluator(SYNTHETIC, UnreachableModelDouble(), items, settings)
        tryouts = HarnessTryouts(evaluator, check=lambda code: [], calls=2)
        answer = json.loads(asyncio.run(tryouts.run(GOOD, name="good", replies=["The digit is 3."], k=2)))
    assert answer["valid"] and answer["error"] is None
    assert [e["item_id"] for e in answer["episodes"]] == [i["id"] for i in items[:2]]
    for episode in answer["episodes"]:
        # GOOD's parse_action wrapped the scripted reply's digit; the submission ended the episode ungraded
        assert episode["actions"] == [
            {
                "action": {"kind": "env", "action": "<answer>3</answer>"},
                "result": {"kind": "env", "observation": {"submitted": True, "graded": False}, "done": True},
            }
        ]


@pytest.mark.timeout(300)
def test_try_harness_plays_chess_moves_as_the_episodes_and_grades_nothing(tmp_path: Path):
    """chess (a ``prototype_steps`` domain): a try-out's moves are answered by the real environment, turn by turn as
    in an episode (the verdict, the opponent's reply; what the environment service answers the ``cli`` agent's kit),
    and still nothing is graded: no reward, no ``info``, no graded answer, no policy model."""
    domain = chess_puzzles.ChessPuzzles()
    items = domain.load_split("harness", Data(harness_size=8, test_size=2, weight_size=4))
    h0 = domain.h0_path().read_text("utf-8")
    tryouts = _tryouts(domain, items)
    box = Toolbox(Workspace(tmp_path, tmp_path / "scratch", 1), ProposerTools(tryouts=tryouts))
    longer = next(i for i in items if len(i["Moves"].split()) >= 4)  # the opponent replies at least once
    for item, solves in ((longer, True), (items[0], False)):
        solver = item["Moves"].split()[1::2]
        if not solves:  # a legal move that is not the stored one: the puzzle is lost
            legal = [m["uci"] for m in domain.make_env(item).reset()["legal_moves"]]
            solver = [next(m for m in legal if m != solver[0])]
        replies = [f"<move>{move}</move>" for move in solver]
        out = asyncio.run(box.call("try_harness", {"code": h0, "items": [item["id"]], "replies": replies}))
        answer = json.loads(out)
        assert answer["valid"] and answer["error"] is None
        [episode] = answer["episodes"]
        played = [a for a in episode["actions"] if a["action"]["kind"] == "env"]
        assert [a["action"]["action"] for a in played] == solver
        env = domain.make_env(item)
        env.reset()
        assert [a["result"] for a in played] == [env.step(move).harness_result() for move in solver]
        last = played[-1]["result"]["observation"]
        assert last["done"] and last["solved"] is solves and last["verdict"] == ("solved" if solves else "wrong")
        if solves:  # the opponent's reply came back after the first right move, as the model reads it
            assert played[0]["result"]["observation"]["last_reply"] == item["Moves"].split()[2]
        assert "reward" not in out and '"info"' not in out and '"graded": ["' not in out
