"""The other proposer paths through the real search workload: the Anthropic Messages backend against a
loopback double of the API that speaks its wire format (testing a candidate with ``run_candidate`` and
looking at the archive with ``run_shell`` before proposing it), the paper's token count and its budget,
an external agent CLI run inside the sandbox (a real program that reads the archive and writes a
candidate), a local chess phase starting the environment service for a cli agent's kit, the examples' Claude Code command end to end with a scripted stand-in for the CLI, a CLI that hangs past its timeout, and an unreachable chat endpoint. Failures are recorded
and the phase still ends with a result."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import socket
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import yaml

import chess_puzzles
from tests.component.test_search_phase import GOOD, PHASE, RUN, SETTINGS, _request, _spec
from tests.fixtures.harness_host import start_harness_host
from tests.fixtures.messages_api_double import MessagesAPIDouble, paper_count, text, tool_use
from tests.fixtures.proposer_double import DigitSayerPolicyDouble, ScriptedProposerServerDouble, assistant, tool_call
from whale.core import layout
from whale.core.spec import Data
from whale.harness.launch import SandboxLimits
from whale.inference.scripted import ScriptedClient
from whale.metaharness.archive import Archive
from whale.metaharness.evaluate import EvalSettings
from whale.metaharness.proposer.base import ProposalRequest, Proposer, ProposerReport
from whale.metaharness.proposer.openai_agent import OpenAIAgentProposer, ProposerClient
from whale.sandbox import process as sandbox_process
from whale.sandbox import run as sandbox_run
from whale.sandbox import worker as sandbox_worker
from whale.sandbox.process import base_python
from whale.store import open_store
from whale.workloads.search import run_search

AGENT_CLI = """
import pathlib, sys
scratch, archive, n = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2]), int(sys.argv[3])
prompt = sys.stdin.read()
assert "Harness search, iteration" in prompt, prompt[:200]
assert "run_candidate" not in prompt  # the built-in agents' tool; a cli agent has its own
traces = (archive / "candidates" / "i01-incoming" / "traces.jsonl").read_text()
assert "The digit is" in traces
out = scratch / "candidates"
(out / "extract.py").write_text((pathlib.Path(sys.argv[0]).parent / "good.py").read_text())
(out / "extract.md").write_text("Traces show the digit without the tag; wrap it.")
print("wrote 1 candidate of", n, "in", scratch)
"""

HANGING_CLI = """
import pathlib, subprocess, sys, time
out = pathlib.Path(sys.argv[1]) / "candidates"
(out / "early.py").write_text((pathlib.Path(sys.argv[0]).parent / "good.py").read_text())
subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True)  # left behind
print("written; now hanging", flush=True)
time.sleep(600)
"""


def _cli_spec(command: list[str], read_paths: list[str], timeout_s: int = 60) -> dict:
    spec = _spec("http://unused/v1")
    spec["harnessSearch"]["proposer"] = {
        "backend": "cli",
        "command": command,
        "timeoutSeconds": timeout_s,
        "readPaths": read_paths,
        "network": "none",
    }
    return spec


def _agent_dir(tmp_path: Path, source: str) -> Path:
    """The agent's "install": its program and the file it proposes, mounted read-only in its sandbox."""
    agent = tmp_path / "agent"
    agent.mkdir()
    (agent / "agent.py").write_text(source)
    (agent / "good.py").write_text(GOOD)
    return agent


@pytest.mark.timeout(180)
def test_cli_agent_in_its_sandbox_writes_a_candidate_that_is_accepted(tmp_path: Path):
    agent = _agent_dir(tmp_path, AGENT_CLI)
    store = open_store(str(tmp_path / "store"))
    command = [base_python(), str(agent / "agent.py"), "{scratch}", "{archive}", "{n}"]
    _request(store, _cli_spec(command, [str(agent)]), iterations=2)
    result = run_search(store, RUN, PHASE, client=DigitSayerPolicyDouble(), settings=SETTINGS)
    assert result.accepted_candidate == "i02-c1" and result.accepted_score == 1.0
    archive = Archive(store, layout.archive_prefix(RUN, 1))
    record = store.read_json(archive.iteration_key(2))
    assert record["backend"] == "cli" and record["proposals"] == ["extract"] and record["notes"] == []
    transcript = [
        json.loads(line) for line in store.read_text(archive.key("iterations", "02-transcript.jsonl")).splitlines()
    ]
    assert "wrote 1 candidate of 3 in /scratch" in transcript[0]["output_tail"]  # its workspace is the sandbox's
    assert transcript[0]["isolation"]["network"] == "netns" and transcript[0]["isolation"]["root"] == "pivot_root"
    assert store.read_text(archive.candidate_key("i02-c1", "rationale.md")).startswith("Traces show")


def test_on_a_cluster_the_search_hands_the_agent_to_its_own_container_and_fails_without_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    """The search workload as the operator's search container runs it (``$WHALE_PROPOSER_AGENT_EXCHANGE`` set): the
    agent's sessions go to the proposer-agent runner (a real process here, as that container runs it), the archive
    copy is read at the same path there, and the candidate comes back and is accepted. Without the runner the phase
    fails naming the container (fail closed), it never starts the agent itself."""
    import subprocess
    import sys

    from tests.fixtures.kube import wait_for
    from whale.metaharness.loop import SearchError
    from whale.metaharness.proposer import agent_exchange

    agent = _agent_dir(tmp_path, AGENT_CLI)
    command = [base_python(), str(agent / "agent.py"), "{scratch}", "{archive}", "{n}"]
    exchange = tmp_path / "whale-agent"
    exchange.mkdir()
    monkeypatch.setenv(agent_exchange.AGENT_EXCHANGE_ENV, str(exchange))

    absent = open_store(str(tmp_path / "absent"))
    _request(absent, _cli_spec(command, [str(agent)]), iterations=2)
    with pytest.raises(SearchError, match="iteration 2: the proposer-agent container is not running"):
        run_search(absent, RUN, PHASE, client=DigitSayerPolicyDouble(), settings=SETTINGS)

    runner_argv = ["--exchange", str(exchange), "--network", "none", "--read-path", str(agent)]
    runner = subprocess.Popen(
        [sys.executable, "-m", agent_exchange.RUNNER_MODULE, *runner_argv], env={"PATH": "/usr/bin:/bin"}
    )
    try:
        wait_for((exchange / agent_exchange.READY).exists, 30, what="the runner's ready mark")
        store = open_store(str(tmp_path / "store"))
        _request(store, _cli_spec(command, [str(agent)]), iterations=2)
        result = run_search(store, RUN, PHASE, client=DigitSayerPolicyDouble(), settings=SETTINGS)
    finally:
        runner.terminate()
        runner.wait(timeout=10)
    assert result.accepted_candidate == "i02-c1" and result.accepted_score == 1.0
    archive = Archive(store, layout.archive_prefix(RUN, 1))
    record = store.read_json(archive.iteration_key(2))
    assert record["backend"] == "cli" and record["proposals"] == ["extract"] and record["notes"] == []
    assert sorted(p.name for p in exchange.iterdir()) == sorted([agent_exchange.READY, *agent_exchange.SUBDIRS])


REPO = Path(__file__).resolve().parents[2]
HARNESS_SEARCH_EXAMPLES = sorted(
    p for p in (REPO / "manifests" / "examples").glob("*.yaml") if "rsft" not in p.name and p.name != "tiny-cpu.yaml"
)


def _example_proposer() -> dict:
    """The proposer of the paper's examples: the same block in each of the 9 that search harnesses."""
    blocks = [
        yaml.safe_load(p.read_text())["spec"]["experiment"]["harnessSearch"]["proposer"]
        for p in HARNESS_SEARCH_EXAMPLES
    ]
    assert len(blocks) == 9 and all(b == blocks[0] for b in blocks)
    return blocks[0]


@pytest.mark.timeout(180)
def test_examples_claude_code_command_runs_end_to_end_with_a_scripted_cli(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    """The examples' proposer as they run it — Claude Code headless, claude-opus-4-7 at effort max, 2400 s,
    Read/Glob/Grep/Edit/Write/Bash, the skill in the system prompt, stream-json — with the binary swapped for
    a stand-in that speaks the same protocol (tests/fixtures/claude_code_double.py: it refuses any other
    setting). Its candidate is gated, scored and accepted; its usage is counted as the paper counts it."""
    record, result = _search_with_example_cli(tmp_path, monkeypatch, {})
    assert record["notes"] == [], record  # the stand-in found nothing to refuse
    assert record["backend"] == "cli" and record["proposals"] == ["tagged"]
    assert result.accepted_candidate == "i02-c1" and result.accepted_score == 1.0
    # the result event's usage, the paper's count: generated + read for the first time (cache reads not)
    assert (record["generated_tokens"], record["read_tokens"], record["turns"]) == (1400, 2400 + 6000, 3)
    store = open_store(str(tmp_path / "store"))
    rationale = store.read_text(Archive(store, layout.archive_prefix(RUN, 1)).candidate_key("i02-c1", "rationale.md"))
    assert rationale.strip().endswith("extracts it.")


@pytest.mark.timeout(180)
def test_the_scripted_cli_refuses_what_the_paper_did_not_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """The stand-in is strict: another effort is reported as the agent's error and nothing is proposed."""
    record, result = _search_with_example_cli(tmp_path, monkeypatch, {"effort": "high"})
    assert record["proposals"] == [] and result.accepted_candidate == "i01-incoming"
    assert any("--effort='high', expected 'max'" in n for n in record["notes"]), record["notes"]


def _search_with_example_cli(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, change: dict) -> tuple[dict, Any]:
    proposer = _example_proposer()
    assert (proposer["backend"], proposer["model"], proposer["effort"], proposer["timeoutSeconds"]) == (
        "cli",
        "claude-opus-4-7",
        "max",
        2400,
    )
    assert proposer["command"][0] == "/opt/claude-code/bin/claude" and proposer["readPaths"] == ["/opt/claude-code"]
    agent = tmp_path / "agent"
    agent.mkdir()
    (agent / "claude_code_double.py").write_text((REPO / "tests" / "fixtures" / "claude_code_double.py").read_text())
    (agent / "good.py").write_text(GOOD)
    proposer = {
        **proposer,
        "command": [base_python(), str(agent / "claude_code_double.py"), *proposer["command"][1:]],
        "readPaths": [str(agent)],
        "network": "none",  # no API here; the examples' host network is the only difference
        "timeoutSeconds": 60,
        **change,
    }
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-double")
    monkeypatch.setenv("WHALE_TEST_CANARY", "must not reach the agent")
    store = open_store(str(tmp_path / "store"))
    spec = _spec("http://unused/v1")
    spec["harnessSearch"]["proposer"] = proposer
    _request(store, spec, iterations=2)
    result = run_search(store, RUN, PHASE, client=DigitSayerPolicyDouble(), settings=SETTINGS)
    return store.read_json(Archive(store, layout.archive_prefix(RUN, 1)).iteration_key(2)), result


@pytest.mark.timeout(180)
def test_hanging_cli_is_killed_at_its_timeout_and_what_it_wrote_comes_back(tmp_path: Path):
    agent = _agent_dir(tmp_path, HANGING_CLI)
    store = open_store(str(tmp_path / "store"))
    command = [base_python(), str(agent / "agent.py"), "{scratch}"]
    _request(store, _cli_spec(command, [str(agent)], timeout_s=3), iterations=2)
    t0 = time.monotonic()
    result = run_search(store, RUN, PHASE, client=DigitSayerPolicyDouble(), settings=SETTINGS)
    assert time.monotonic() - t0 < 90
    record = store.read_json(Archive(store, layout.archive_prefix(RUN, 1)).iteration_key(2))
    assert record["stopped_by"] == "timeout" and any("timeout" in n for n in record["notes"])
    assert record["proposals"] == ["early"]  # written before the deadline: handed back, then judged
    assert result.accepted_candidate == "i02-c1" and result.iterations == 2


@pytest.mark.timeout(120)
def test_unreachable_chat_endpoint_is_recorded_not_fatal(tmp_path: Path):
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    store = open_store(str(tmp_path / "store"))
    _request(store, _spec(f"http://127.0.0.1:{port}/v1"), iterations=2)
    result = run_search(store, RUN, PHASE, client=DigitSayerPolicyDouble(), settings=SETTINGS)
    assert result.iterations == 2 and result.accepted_candidate == "i01-incoming"
    record = store.read_json(Archive(store, layout.archive_prefix(RUN, 1)).iteration_key(2))
    assert record["stopped_by"] == "error" and "cannot reach" in record["notes"][0]


def _anthropic_script() -> list:
    return [
        # look: the summary through the file tools, the traces through the sandboxed shell
        [
            text("Let me look at the archive."),
            tool_use("read_file", "toolu_01", path="summary.md"),
            tool_use("run_shell", "toolu_02", command="grep -c 'The digit is' candidates/i01-incoming/traces.jsonl"),
        ],
        # test an idea on three training items before proposing it
        [tool_use("run_candidate", "toolu_03", code=GOOD, k=3)],
        # propose it, and check it once more on two chosen items
        [
            tool_use(
                "write_candidate",
                "toolu_04",
                name="extract",
                code=GOOD,
                rationale="Replies name the digit without the tag; extract it and wrap it.",
            ),
            tool_use("run_candidate", "toolu_05", name="extract", items=["harness-00004", "harness-00005"]),
        ],
        [tool_use("finish", "toolu_06", summary="one candidate, tested")],
    ]


def _no_sandbox_here(*args: object, **kwargs: object) -> None:
    raise AssertionError("at sandbox.isolation pod the search pod starts no sandbox itself")


@pytest.mark.timeout(240)
@pytest.mark.parametrize("where", ["local", "pod"])
def test_anthropic_backend_tests_a_candidate_then_proposes_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, where: str
):
    """``pod``: the search phase as it runs at spec.execution.sandbox.isolation pod: every harness process and every run_shell
    command on a real harness host at level pod (this process may start no sandbox at all)."""
    settings = SETTINGS
    with contextlib.ExitStack() as stack:
        if where == "pod":
            host, _ = stack.enter_context(start_harness_host("pod"))
            settings = dataclasses.replace(SETTINGS, limits=SandboxLimits(isolation="pod", host=host))
            for module in (sandbox_process, sandbox_run, sandbox_worker):
                monkeypatch.setattr(module, "launch", _no_sandbox_here)
        api, result, store = _anthropic_search(tmp_path, monkeypatch, settings)
    _check_anthropic_search(api, result, store)


def _anthropic_search(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, settings: EvalSettings) -> tuple:
    store = open_store(str(tmp_path / "store"))
    with MessagesAPIDouble(_anthropic_script(), key="sk-ant-double", fail_first=1) as api:  # 529 first: retried
        monkeypatch.setenv("TEST_ANTHROPIC_API_KEY", "sk-ant-double")
        spec = _spec("unused")
        spec["harnessSearch"]["proposer"] = {
            "backend": "anthropic",
            "baseUrl": api.base_url,
            "model": "claude-double",
            "timeoutSeconds": 120,
            "apiKeySecret": {"name": "proposer", "key": "api-key", "env": "TEST_ANTHROPIC_API_KEY"},
            "runCandidateRollouts": 64,  # an option (the paper's proposer runs no benchmarks): on here
        }
        _request(store, spec, iterations=2)
        result = run_search(store, RUN, PHASE, client=DigitSayerPolicyDouble(), settings=settings)
    return api, result, store


def _check_anthropic_search(api: MessagesAPIDouble, result: Any, store: Any) -> None:
    assert api.refusals == []  # every request was well-formed for the real API
    assert result.accepted_candidate == "i02-c1" and result.accepted_score == 1.0
    request = api.requests[0]
    assert request["model"] == "claude-double" and "improving an LLM agent's harness" in request["system"]
    prompt = json.dumps(request["messages"][0])
    assert "run_candidate" in prompt and "Test before you propose" not in prompt  # offered, not prescribed
    assert {t["name"] for t in request["tools"]} >= {"read_file", "write_candidate", "run_candidate", "run_shell"}
    results = api.tool_results()
    assert any("Best so far: i01-incoming" in r for r in results)
    assert "exit: 0\n6\n" in results  # the shell counted the six failing episodes of the incoming harness
    trials = [json.loads(r) for r in results if r.startswith('{"candidate"')]
    assert [t["score"] for t in trials] == [1.0, 1.0] and [t["rollouts_spent"] for t in trials] == [3, 2]
    assert trials[1]["rollouts_left"] == 64 - 5
    assert all(e["item_id"].startswith("harness-") for t in trials for e in t["episodes"])

    archive = Archive(store, layout.archive_prefix(RUN, 1))
    record = store.read_json(archive.iteration_key(2))
    assert record["backend"] == "anthropic" and record["stopped_by"] == "finish"
    assert record["trial_rollouts"] == 5
    assert [t["items"] for t in record["trials"]] == [
        ["harness-00000", "harness-00001", "harness-00002"],
        ["harness-00004", "harness-00005"],
    ]
    # the budget as the paper counts it: generated + read for the first time, not the context per call
    assert record["tokens"] == paper_count(api.usage) == record["generated_tokens"] + record["read_tokens"]
    assert record["tokens"] < sum(p + o for p, o in api.usage)
    # run_candidate's rollouts are the iteration's: 2 smoke + 6 full for the candidate, 5 for the trials
    lines = store.read_jsonl(layout.metrics_key(RUN, PHASE))
    assert [m["rollouts"] for m in lines] == [6, 2 + 6 + 5] and result.rollouts == 19


def _request_for(tmp_path: Path, max_tokens: int) -> ProposalRequest:
    archive = tmp_path / "archive"
    archive.mkdir(exist_ok=True)
    (archive / "summary.md").write_text("# summary\nBest so far: i01-incoming (0.0)\n")
    return ProposalRequest(
        iteration=2,
        count=1,
        archive_dir=archive,
        scratch_dir=tmp_path / f"scratch{max_tokens}",
        skill="Repeat the digit.",
        incoming_code="class Harness: pass",
        incoming_id="i01-incoming",
        prompt_only=False,
        allowed_imports=("re",),
        timeout_s=60,
        max_turns=20,
        max_tokens=max_tokens,
    )


async def test_the_budget_counts_each_context_token_once_and_max_tokens_applies_to_that(tmp_path: Path):
    reads = [assistant(tool_call("read_file", f"r{i}", path="summary.md")) for i in range(6)]
    with ScriptedProposerServerDouble(reads, counted_usage=True) as srv:
        free = OpenAIAgentProposer(ProposerClient(srv.base_url, "double"))
        report = await free.propose(_request_for(tmp_path, 1_000_000))
        await free.aclose()
    usage = srv.usage
    assert report.turns == 7 and report.stopped_by == "finish"
    assert report.tokens == paper_count(usage) == report.generated_tokens + report.read_tokens
    assert report.generated_tokens == sum(c for _, c in usage)
    # each call's prompt repeats the whole conversation: counting it per call would charge far more
    assert sum(p + c for p, c in usage) > 3 * report.tokens

    budget = paper_count(usage[:3])
    assert sum(p + c for p, c in usage[:2]) >= budget  # the old per-call count would have stopped after 2 calls
    with ScriptedProposerServerDouble(reads, counted_usage=True) as srv2:
        capped = OpenAIAgentProposer(ProposerClient(srv2.base_url, "double"))
        report2 = await capped.propose(_request_for(tmp_path, budget))
        await capped.aclose()
    assert report2.turns == 3 and report2.stopped_by == "max_tokens" and report2.tokens == budget
    assert "proposer stopped by its max_tokens budget" in report2.notes


async def test_the_openai_proposer_seeds_each_request_from_the_search_seed(tmp_path: Path):
    reads = [assistant(tool_call("read_file", f"r{i}", path="summary.md")) for i in range(2)]
    with ScriptedProposerServerDouble(reads) as srv:
        seeded = OpenAIAgentProposer(ProposerClient(srv.base_url, "double", seed=7))
        await seeded.propose(_request_for(tmp_path, 1_000_000))
        await seeded.aclose()
    assert [body["seed"] for body in srv.requests] == [7, 8, 9]  # one draw per request, replayed by the seed
    with ScriptedProposerServerDouble(reads) as srv2:
        unseeded = OpenAIAgentProposer(ProposerClient(srv2.base_url, "double"))
        await unseeded.propose(_request_for(tmp_path, 1_000_000))
        await unseeded.aclose()
    assert len(srv2.requests) == 3 and all("seed" not in body for body in srv2.requests)


class EnvProbingAgentDouble(Proposer):
    """A test double of the ``cli`` agent (no CLI runs): it reads the kit it was handed, as the agent's
    ``proto/tools.py`` would, and plays a move on a D_harness puzzle through the environment service it lists."""

    backend = "cli"

    def __init__(self) -> None:
        self.asked: list[tuple[dict, str, dict, str]] = []

    async def propose(self, request: ProposalRequest) -> ProposerReport:
        kit = request.workspace
        url = json.loads(kit["proto/services.json"])["env"]
        task = json.loads(kit["proto/tasks.jsonl"].splitlines()[0])
        move = task["legal_moves"][0]["uci"]
        body = json.dumps({"task": task, "actions": [move]}).encode()
        req = urllib.request.Request(url + "/step", body, {"content-type": "application/json"})

        def ask() -> dict:
            with urllib.request.urlopen(req, timeout=30) as resp:
                return json.loads(resp.read())

        self.asked.append((task, move, await asyncio.to_thread(ask), url))
        return ProposerReport(stopped_by="exit")


@pytest.mark.timeout(300)
def test_a_local_chess_phase_starts_the_environment_service_for_a_cli_agent(tmp_path: Path):
    """The real search workload on chess with a ``cli`` proposer and no deployed service (a local run): the phase
    starts the environment service on the loopback, lists it in the kit's services.json, it answers the agent's move
    as the episode's environment does, and it is gone when the phase ends."""
    spec = {
        "domain": "chess_puzzles",
        "condition": "mh_only",
        "model": {"name": "unused-policy-is-a-double"},
        "data": {"harnessSize": 4, "testSize": 2, "weightSize": 4},
        "harnessSearch": {
            "proposalsPerIteration": 1,
            "smokeTestItems": 1,
            "proposer": {"backend": "cli", "command": ["an-agent-cli"], "timeoutSeconds": 60},
        },
    }
    store = open_store(str(tmp_path / "store"))
    _request(store, spec, iterations=2)
    agent = EnvProbingAgentDouble()
    run_search(store, RUN, PHASE, client=ScriptedClient([]), proposer=agent, settings=SETTINGS)
    [(task, move, answer, url)] = agent.asked
    domain = chess_puzzles.ChessPuzzles()
    [item] = [
        i
        for i in domain.load_split("harness", Data(harness_size=4, test_size=2, weight_size=4))
        if domain.make_env(i).reset() == task
    ]
    env = domain.make_env(item)
    env.reset()
    assert answer == {"results": [env.step(move).harness_result()], "unplayed": 0}
    assert url.startswith("http://127.0.0.1:")
    with pytest.raises(OSError):  # stopped with the phase
        urllib.request.urlopen(url + "/healthz", timeout=5)
