"""The proposer prototypes as the reference's search skill requires (issue 30): in its sandboxed workspace the
harness API imports and the run's retriever answers, on D_harness questions, with no gold and no test item.

A stand-in for Claude Code (a Python program, same protocol as the ``cli`` backend: it runs in the agent's
sandbox and writes candidates/) loads the incoming harness from ``proto/``, lets its ``parse`` hook turn a
model's search call on a real D_harness question into a tool action, and runs that action against the
retriever service (started for real on loopback, offline) through ``proto/tools.py`` — from behind the egress
proxy (``network: proxy``, the default: its CONNECT tunnel is the kit's only way to the services it lists)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

import chess_puzzles
import search_qa
from search_qa.verifier import normalize
from whale.core.spec import Data, Verifier
from whale.metaharness.proposer.base import ProposalRequest
from whale.metaharness.proposer.cli_agent import CLIAgentProposer
from whale.sandbox.process import base_python
from whale.tools.env_service import serve_locally
from whale.workloads.search import prototype_files

AGENT = r"""
import json, os, sys
os.chdir("proto")
sys.path.insert(0, os.getcwd())
from whale.harness.api import BaseHarness
import incoming, tools
harness = incoming.Harness()
assert isinstance(harness, BaseHarness)
tasks = [json.loads(line) for line in open("tasks.jsonl")]
report = {"tasks": len(tasks), "keys": sorted({k for t in tasks for k in t}), "searches": []}
for task in tasks:
    state = {}
    harness.start(task, state)
    call = {"id": "c1", "type": "function",
            "function": {"name": "search", "arguments": json.dumps({"query_list": [task["question"], "more"]})}}
    decision = harness.parse({"role": "assistant", "content": "", "tool_calls": [call], "finish_reason": "tool_calls"},
                             state)
    action = decision["actions"][0]
    reply = tools.call("search", action["arguments"])  # the tool message the model would read
    report["searches"].append({"question": task["question"], "arguments": action["arguments"], "reply": reply})
os.makedirs("../candidates", exist_ok=True)
open("../candidates/noop.py", "w").write("# a candidate\n")
print("REPORT " + json.dumps(report), flush=True)
"""


@pytest.mark.timeout(300)
def test_the_agent_calls_the_harness_search_on_real_questions_against_the_retriever(
    retriever_service, monkeypatch, tmp_path: Path
):
    monkeypatch.setenv("WHALE_RETRIEVER_URL", retriever_service.url)
    domain = search_qa.SearchQA()
    data = Data(harness_size=8, test_size=2, weight_size=8)
    items = domain.load_split("harness", data)
    test_questions = {i["question"] for i in domain.load_split("test", data)}
    h0 = domain.h0_path().read_text("utf-8")
    kit = prototype_files(domain, data, items, h0)

    # what the workspace holds: the API, h0, the tasks as harnesses see them, the service URL; no gold, no test item
    assert json.loads(kit["proto/services.json"]) == {"retriever": retriever_service.url}
    tasks = [json.loads(line) for line in kit["proto/tasks.jsonl"].splitlines()]
    assert [t["question"] for t in tasks] == [i["question"] for i in items]
    golds = {i["question"]: [normalize(g) for g in i["golden_answers"]] for i in items}
    assert not any("golden" in text for text in kit.values())
    assert not test_questions & {t["question"] for t in tasks}

    archive = tmp_path / "archive"
    archive.mkdir()
    agent = tmp_path / "agent"
    agent.mkdir()
    (agent / "agent.py").write_text(AGENT)
    request = ProposalRequest(
        iteration=1,
        count=1,
        archive_dir=archive,
        scratch_dir=tmp_path / "scratch",
        skill="skill",
        incoming_code=h0,
        incoming_id="i01-incoming",
        prompt_only=False,
        allowed_imports=(),
        timeout_s=120,
        max_turns=5,
        max_tokens=1000,
        workspace=kit,
    )
    proposer = CLIAgentProposer([base_python(), str(agent / "agent.py")], read_paths=[str(agent)])
    report = asyncio.run(proposer.propose(request))
    tail = report.transcript[0]["output_tail"]
    assert report.stopped_by == "exit" and [p.name for p in report.proposals] == ["noop"], tail
    # its own network namespace: every search went through the egress proxy, to the one service the kit lists
    isolation = report.transcript[0]["isolation"]
    host = retriever_service.url.removeprefix("http://").rstrip("/").rsplit(":", 1)[0]
    assert isolation["network"] == "egress" and isolation["egress"]
    assert all(d.startswith(f"allowed: {host}:") for d in isolation["egress"]), isolation["egress"]
    got = json.loads(next(line for line in tail.splitlines() if line.startswith("REPORT ")).removeprefix("REPORT "))
    assert got["tasks"] == len(items) and got["keys"] == ["id", "question"]
    assert len(got["searches"]) == len(items)
    for search in got["searches"]:
        # h0's parse forced the call to its first query, top-1, 200 tokens, and the retriever answered it
        assert search["arguments"] == {"query_list": [search["question"]], "topk": 1, "max_doc_tokens": 200}
        passage = json.loads(search["reply"])["result"]
        assert passage.startswith("Doc 1(Title: ") and "\n" not in passage and len(passage) > 40
    # real retrieval: some passage holds its own question's gold answer (the corpus keeps answerable ones)
    assert any(g in normalize(json.loads(s["reply"])["result"]) for s in got["searches"] for g in golds[s["question"]])


CHESS_AGENT = r"""
import json, os, sys
os.chdir("proto")
sys.path.insert(0, os.getcwd())
import incoming, tools
from whale.tools.service_call import ToolServiceError
harness = incoming.Harness()
tasks = [json.loads(line) for line in open("tasks.jsonl")]
attacks = json.load(open(sys.argv[1]))
report = {"tasks": len(tasks), "keys": sorted({k for t in tasks for k in t}), "played": [], "refused": []}
for task in tasks:
    state = {}
    harness.start(task, state)
    move = task["legal_moves"][0]["uci"]
    decision = harness.parse({"role": "assistant", "content": f"<move>{move}</move>", "finish_reason": "stop"}, state)
    action = decision["actions"][0]
    report["played"].append({"task": task, "action": action["action"], "results": tools.step(task, [action["action"]])})
for task in attacks:
    try:
        report["refused"].append({"answer": tools.call("env", {"task": task, "actions": ["e2e4"]})})
    except ToolServiceError as exc:
        report["refused"].append({"error": str(exc)})
os.makedirs("../candidates", exist_ok=True)
open("../candidates/noop.py", "w").write("# a candidate\n")
print("REPORT " + json.dumps(report), flush=True)
"""


@pytest.mark.timeout(300)
def test_the_agent_plays_moves_on_d_harness_puzzles_and_no_test_puzzle(tmp_path: Path):
    """chess: in the ``cli`` agent's sandbox the kit's ``step`` plays a harness's move on each real D_harness puzzle
    through the environment service (started as a local harness phase starts it, offline), answered as in the
    episodes; the kit holds no solution; a test-split puzzle, or a D_harness one with its position doctored, is
    refused (the attack: an agent that knows test positions asks the service to judge moves on them)."""
    domain = chess_puzzles.ChessPuzzles()
    data = Data(harness_size=6, test_size=4, weight_size=4)
    items = domain.load_split("harness", data)
    test_items = domain.load_split("test", data)
    h0 = domain.h0_path().read_text("utf-8")
    test_tasks = [domain.make_env(i).reset() for i in test_items]
    doctored = {**domain.make_env(items[0]).reset(), "fen": test_tasks[0]["fen"]}
    (tmp_path / "svc").mkdir()
    with serve_locally("chess_puzzles", items, Verifier().to_wire(), tmp_path / "svc") as url:
        kit = prototype_files(domain, data, items, h0, {"env": url})
        assert json.loads(kit["proto/services.json"]) == {"env": url}
        # no solution in the workspace: no puzzle id, no stored line, no item column
        text = "".join(kit.values())
        assert not any(i["id"] in text or i["Moves"] in text for i in items + test_items)
        assert '"Moves"' not in text and '"PuzzleId"' not in text
        agent = tmp_path / "agent"
        agent.mkdir()
        (agent / "agent.py").write_text(CHESS_AGENT)
        (agent / "attacks.json").write_text(json.dumps([*test_tasks, doctored]))
        request = ProposalRequest(
            iteration=1,
            count=1,
            archive_dir=tmp_path / "archive",
            scratch_dir=tmp_path / "scratch",
            skill="skill",
            incoming_code=h0,
            incoming_id="i01-incoming",
            prompt_only=False,
            allowed_imports=(),
            timeout_s=120,
            max_turns=5,
            max_tokens=1000,
            workspace=kit,
        )
        (tmp_path / "archive").mkdir()
        argv = [base_python(), str(agent / "agent.py"), str(agent / "attacks.json")]
        report = asyncio.run(CLIAgentProposer(argv, read_paths=[str(agent)]).propose(request))
    tail = report.transcript[0]["output_tail"]
    assert report.stopped_by == "exit" and [p.name for p in report.proposals] == ["noop"], tail
    got = json.loads(next(line for line in tail.splitlines() if line.startswith("REPORT ")).removeprefix("REPORT "))
    assert got["tasks"] == len(items) and "fen" in got["keys"] and "id" not in got["keys"]
    for played, item in zip(got["played"], items, strict=True):
        # h0 turned the reply into its move; the service answered as the episode's environment does
        env = domain.make_env(item)
        assert played["task"] == env.reset()
        assert played["results"] == [env.step(played["action"]).harness_result()]
        observation = played["results"][0]["observation"]
        assert observation["verdict"] in ("correct", "solved", "wrong")
        assert not {"reward", "info", "puzzle_id", "Moves"} & (set(played["results"][0]) | set(observation))
    assert len(got["refused"]) == len(test_tasks) + 1
    for refused in got["refused"]:
        assert "error" in refused and "refused the request (404)" in refused["error"]
        assert "not one of this run's D_harness tasks" in refused["error"]
