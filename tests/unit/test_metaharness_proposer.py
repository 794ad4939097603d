"""Proposer pieces without a model: workspace confinement and bounds, candidate collection, the CLI
command template, the replay script, building a backend from the spec."""

import json

import pytest

from whale.core.spec import Proposer as ProposerSpec
from whale.metaharness.proposer import ProposerError, collect_candidates, from_spec
from whale.metaharness.proposer.base import MAX_CANDIDATE_BYTES, ProposalRequest, task_prompt
from whale.metaharness.proposer.cli_agent import render_command
from whale.metaharness.proposer.workspace import GREP_LIMIT, READ_LIMIT_CHARS, Workspace


@pytest.fixture
def ws(tmp_path):
    archive = tmp_path / "archive"
    (archive / "candidates" / "i01-incoming").mkdir(parents=True)
    (archive / "summary.md").write_text("# summary\nBest so far: i01-incoming\n")
    (archive / "candidates" / "i01-incoming" / "traces.jsonl").write_text("x" * (READ_LIMIT_CHARS + 10))
    (archive / "many.txt").write_text("hit\n" * (GREP_LIMIT + 5))
    (tmp_path / "secret.txt").write_text("s3cret")
    return Workspace(archive, tmp_path / "scratch", max_candidates=2)


def test_reads_are_confined_to_the_archive(ws):
    assert "Best so far" in ws.call("read_file", {"path": "summary.md"})
    assert "Best so far" in ws.call("read_file", {"path": "/summary.md"})
    for path in ("../secret.txt", "candidates/../../secret.txt"):
        out = ws.call("read_file", {"path": path})
        assert out.startswith("error:") and "outside the archive" in out
    assert "s3cret" not in ws.call("grep", {"pattern": "s3cret", "path": ".."})


def test_reads_and_greps_are_bounded(ws):
    out = ws.call("read_file", {"path": "candidates/i01-incoming/traces.jsonl"})
    assert "read again with offset=20000" in out and len(out) < READ_LIMIT_CHARS + 200
    assert (
        ws.call("read_file", {"path": "candidates/i01-incoming/traces.jsonl", "offset": READ_LIMIT_CHARS}) == "x" * 10
    )
    assert f"[stopped at {GREP_LIMIT} matches]" in ws.call("grep", {"pattern": "hit"})
    assert ws.call("grep", {"pattern": "("}).startswith("error:")
    assert "summary.md" in ws.call("list_files", {})


def test_writes_only_candidates_with_safe_names_and_a_cap(ws, tmp_path):
    out = json.loads(ws.call("write_candidate", {"name": "../../evil name", "code": "x = 1\n", "rationale": "r"}))
    assert out["written"] == "candidates/evil_name.py"
    assert (tmp_path / "scratch" / "candidates" / "evil_name.py").read_text() == "x = 1\n"
    ws.call("write_candidate", {"name": "b", "code": "y = 2\n"})
    assert "call finish" in ws.call("write_candidate", {"name": "c", "code": "z = 3\n"})
    assert "larger than" in ws.call("write_candidate", {"name": "b", "code": "#" * (MAX_CANDIDATE_BYTES + 1)})
    assert ws.call("write_candidate", {"code": "x"}).startswith("error: missing argument")
    assert ws.call("nope", {}).startswith("error: unknown tool")
    assert ws.call("finish", {}) == "ok" and ws.finished


def test_collect_candidates_caps_and_orders(tmp_path):
    root = tmp_path / "candidates"
    root.mkdir()
    for name in ("b", "a", "c"):
        (root / f"{name}.py").write_text(f"# {name}\n")
    (root / "a.md").write_text("because")
    (root / "big.py").write_text("#" * (MAX_CANDIDATE_BYTES + 1))
    props, notes = collect_candidates(tmp_path, 2, order=["c", "a"])
    assert [p.name for p in props] == ["c", "a"] and props[1].rationale == "because"
    assert any("more than 2" in n for n in notes) and any("big.py" in n for n in notes)
    assert collect_candidates(tmp_path / "none", 3) == ([], ["no candidates/ directory was written"])


def test_render_command_fills_fields_and_names_unknown_ones():
    argv = render_command(
        ["agent", "--dir", "{archive}", "write {n} files into {scratch}"], {"archive": "/a", "n": "3", "scratch": "/s"}
    )
    assert argv == ["agent", "--dir", "/a", "write 3 files into /s"]
    with pytest.raises(ProposerError, match=r"unknown field 'model'"):
        render_command(["{model}"], {})


def test_task_prompt_states_the_rules(tmp_path):
    req = ProposalRequest(
        iteration=3,
        count=2,
        archive_dir=tmp_path,
        scratch_dir=tmp_path,
        skill="SKILL TEXT",
        incoming_code="class Harness: pass",
        incoming_id="i01-incoming",
        prompt_only=True,
        allowed_imports=("re",),
        timeout_s=1,
        max_turns=1,
        max_tokens=1,
    )
    text = task_prompt(req)
    assert "iteration 3" in text and "exactly 2" in text and "PROMPT-ONLY" in text and "SKILL TEXT" in text


def test_from_spec_backends_and_key_errors(tmp_path):
    with pytest.raises(ProposerError, match="WHALE_PROPOSER_API_KEY"):
        from_spec(
            ProposerSpec(backend="openai", base_url="http://x/v1", model="m", api_key_secret={"name": "s", "key": "k"}),
            environ={},
        )
    p = from_spec(
        ProposerSpec(
            backend="openai",
            base_url="http://x/v1",
            model="m",
            api_key_secret={"name": "s", "key": "k", "env": "MY_KEY"},
        ),
        environ={"MY_KEY": "v"},
    )
    assert p.backend == "openai" and p.client._http.headers["Authorization"] == "Bearer v"
    with pytest.raises(ProposerError, match="baseUrl"):
        from_spec(ProposerSpec(backend="openai"), environ={})
    assert from_spec(ProposerSpec(backend="cli", command=["true"]), environ={}).backend == "cli"
    script = tmp_path / "script.json"
    (tmp_path / "cand.py").write_text("# replayed\n")
    script.write_text(json.dumps({"iterations": {"2": [{"name": "x", "file": "cand.py", "rationale": "r"}]}}))
    assert from_spec(ProposerSpec(backend="replay", script=str(script)), environ={}).backend == "replay"
    script.write_text("{")
    with pytest.raises(ProposerError, match="not valid JSON"):
        from_spec(ProposerSpec(backend="replay", script=str(script)), environ={})


def test_old_tool_results_are_elided_over_the_context_budget():
    from whale.metaharness.proposer.openai_agent import ELIDED, _elide_old_tool_results

    messages = [{"role": "user", "content": "task"}] + [
        {"role": "tool", "content": "x" * 100, "tool_call_id": str(i)} for i in range(5)
    ]
    _elide_old_tool_results(messages, budget=400)
    assert [m["content"] == ELIDED for m in messages[1:]] == [True, True, True, False, False]
    assert messages[0]["content"] == "task"


# ----- the paper's token count ------------------------------------------------------------------------------


def test_token_meter_charges_generated_plus_newly_read_tokens():
    from whale.metaharness.proposer.base import TokenMeter

    meter = TokenMeter()
    assert meter.charge(1000, 100) == 1100  # the first call reads its whole prompt
    assert meter.charge(1300, 50) == 200 + 50  # 1100 of its prompt were the last call's prompt and reply
    assert meter.charge(900, 40) == 40  # older tool results elided: nothing new was read
    assert meter.charge(1000, 10) == (1000 - 940) + 10
    assert (meter.generated, meter.read, meter.total) == (200, 1260, 1460)
    assert meter.charge(-5, -1) == 0  # nonsense usage is charged nothing, never negative


# ----- the Anthropic wire format --------------------------------------------------------------------------


def test_anthropic_tools_and_conversation_speak_the_messages_format(tmp_path):
    from whale.metaharness.proposer.agent import ELIDED, ToolCall
    from whale.metaharness.proposer.anthropic_agent import AnthropicClient, AnthropicConversation, anthropic_tools
    from whale.metaharness.proposer.workspace import TOOL_SPECS

    tools = anthropic_tools(TOOL_SPECS)
    assert tools[1] == {
        "name": "read_file",
        "description": TOOL_SPECS[1]["function"]["description"],
        "input_schema": TOOL_SPECS[1]["function"]["parameters"],
    }
    client = AnthropicClient("https://api.anthropic.com/v1/", "claude-x", "sk-test")
    assert client.base_url == "https://api.anthropic.com"  # the /v1 of an OpenAI-style URL is not doubled
    assert client._http.headers["x-api-key"] == "sk-test" and client._http.headers["anthropic-version"]
    conv = AnthropicConversation(client, "system", "task")
    conv.messages.append(
        {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "grep", "input": {}}]}
    )
    conv.add_tool_results(
        [
            (ToolCall("t1", "grep", {}), "x" * 500),
        ]
    )
    conv.add_user("nudge")  # joins the user turn: roles alternate
    assert [m["role"] for m in conv.messages] == ["user", "assistant", "user"]
    assert conv.messages[-1]["content"][0] == {"type": "tool_result", "tool_use_id": "t1", "content": "x" * 500}
    assert conv.messages[-1]["content"][1] == {"type": "text", "text": "nudge"}
    sent = conv._with_cache_breakpoint()
    assert sent[-1]["content"][-1]["cache_control"] == {"type": "ephemeral"}
    assert "cache_control" not in conv.messages[-1]["content"][-1]  # only what is sent carries it
    conv.elide(conv.chars() - 100)
    assert conv.messages[-1]["content"][0]["content"] == ELIDED
    conv.add_tool_results([(ToolCall("t2", "grep", {}), "error: bad pattern")])
    assert conv.messages[-1]["content"][-1]["is_error"] is True
    with pytest.raises(ProposerError, match="needs an API key"):
        AnthropicClient(None, "claude-x", "")


def test_cli_usage_of_a_claude_code_json_result_is_counted_like_the_paper():
    from whale.metaharness.proposer.base import ProposerReport
    from whale.metaharness.proposer.cli_agent import _usage

    report = ProposerReport()
    _usage(
        'working...\n{"type": "result", "num_turns": 7, "is_error": false, "result": "done", "usage": '
        '{"input_tokens": 12, "cache_creation_input_tokens": 3000, "cache_read_input_tokens": 90000, '
        '"output_tokens": 800}}\n',
        report,
    )
    assert (report.tokens, report.generated_tokens, report.read_tokens, report.turns) == (3812, 800, 3012, 7)
    quiet = ProposerReport()
    _usage("no json here {not json}", quiet)
    assert quiet.tokens == 0 and quiet.notes == []


def test_render_command_knows_the_budget_fields():
    argv = render_command(
        ["agent", "--max-turns", "{max_turns}", "--timeout", "{timeout}"], {"max_turns": "40", "timeout": "2400"}
    )
    assert argv == ["agent", "--max-turns", "40", "--timeout", "2400"]


# ----- refusing a proposer that cannot run ---------------------------------------------------------------


def _spec(proposer: dict, condition: str = "mh_only"):
    from whale.core.spec import WhaleRunSpec

    raw = {
        "domain": "synthetic",
        "condition": condition,
        "model": {"name": "m"},
        "harnessSearch": {"proposer": proposer},
    }
    if condition == "rsft_only":
        raw["schedule"] = {"totalSteps": 4}
    return WhaleRunSpec.model_validate(raw)


@pytest.mark.parametrize(
    ("proposer", "fields"),
    [
        ({}, ["model", "baseUrl", "apiKeySecret"]),
        ({"backend": "openai", "model": "m", "baseUrl": "https://api.openai.com/v1"}, ["apiKeySecret"]),
        ({"backend": "openai", "model": "m", "baseUrl": "http://127.0.0.1:8000/v1"}, []),  # a local server: no key
        ({"backend": "openai", "model": "m", "baseUrl": "http://localhost:8000/v1"}, []),
        (
            {
                "backend": "openai",
                "model": "m",
                "baseUrl": "http://vllm:8000/v1",
                "apiKeySecret": {"name": "s", "key": "k"},
            },
            [],
        ),
        ({"backend": "anthropic"}, ["model", "apiKeySecret"]),
        ({"backend": "anthropic", "model": "claude-opus-4-1", "apiKeySecret": {"name": "s", "key": "k"}}, []),
        ({"backend": "cli", "command": ["agent"]}, []),
        ({"backend": "replay", "script": "s.json"}, []),
    ],
)
def test_spec_problems_name_each_missing_field(proposer, fields):
    from whale.metaharness.proposer import spec_problems

    problems = spec_problems(_spec(proposer))
    assert [p.field for p in problems] == [f"spec.experiment.harnessSearch.proposer.{f}" for f in fields]
    assert all(str(p).startswith(p.field + ": ") for p in problems)
    assert spec_problems(_spec(proposer, "rsft_only")) == []  # no harness phase, no proposer needed


def test_environment_problems_name_the_unset_key_and_missing_install(tmp_path):
    from whale.metaharness.proposer import environment_problems

    secret = {"name": "proposer", "key": "api-key", "env": "ANTHROPIC_API_KEY"}
    spec = _spec({"backend": "anthropic", "model": "claude-opus-4-1", "apiKeySecret": secret})
    (problem,) = environment_problems(spec, environ={})
    assert problem.field == "spec.experiment.harnessSearch.proposer.apiKeySecret.env"
    assert "ANTHROPIC_API_KEY is not set" in problem.message and "proposer/api-key" in problem.message
    assert environment_problems(spec, environ={"ANTHROPIC_API_KEY": ""})  # empty is unset
    assert environment_problems(spec, environ={"ANTHROPIC_API_KEY": "sk"}) == []
    cli = _spec({"backend": "cli", "command": ["claude"], "readPaths": [str(tmp_path), "/nonexistent/agent"]})
    assert [p.field for p in environment_problems(cli, environ={})] == [
        "spec.experiment.harnessSearch.proposer.readPaths[1]"
    ]
    assert environment_problems(_spec({"backend": "replay", "script": "x"}), environ={}) == []


def test_from_spec_builds_the_anthropic_and_sandboxed_cli_backends():
    p = from_spec(
        ProposerSpec(
            backend="anthropic",
            model="claude-opus-4-1",
            api_key_secret={"name": "s", "key": "k", "env": "ANTHROPIC_API_KEY"},
        ),
        environ={"ANTHROPIC_API_KEY": "sk-ant"},
    )
    assert p.backend == "anthropic" and p.client.base_url == "https://api.anthropic.com"
    assert p.client._http.headers["x-api-key"] == "sk-ant"
    with pytest.raises(ProposerError, match="ANTHROPIC_API_KEY"):
        from_spec(
            ProposerSpec(
                backend="anthropic", model="m", api_key_secret={"name": "s", "key": "k", "env": "ANTHROPIC_API_KEY"}
            ),
            environ={},
        )
    cli = from_spec(
        ProposerSpec(
            backend="cli",
            command=["claude"],
            read_paths=["/opt/claude"],
            network="none",
            api_key_secret={"name": "s", "key": "k", "env": "ANTHROPIC_API_KEY"},
        ),
        environ={"ANTHROPIC_API_KEY": "sk-ant", "OTHER": "x"},
    )
    walls = cli.launcher.walls  # whale run: the search process starts the agent's sandbox itself
    assert (walls.read_paths, walls.network, dict(walls.env)) == (
        ("/opt/claude",),
        "none",
        {"ANTHROPIC_API_KEY": "sk-ant"},  # nothing else of the environment (IS_SANDBOX is added with the sandbox)
    )
    # on a cluster: the proposer-agent container starts it and holds the key; the search side needs none
    from whale.metaharness.proposer.agent_exchange import ExchangeLauncher

    keyed = ProposerSpec(backend="cli", command=["claude"], api_key_secret={"name": "s", "key": "k", "env": "K"})
    remote = from_spec(keyed, environ={"WHALE_PROPOSER_AGENT_EXCHANGE": "/whale-agent"})
    assert isinstance(remote.launcher, ExchangeLauncher) and str(remote.launcher.root) == "/whale-agent"
    with pytest.raises(ProposerError, match="K"):
        from_spec(keyed, environ={})  # without the exchange, the key is still needed here
    with pytest.raises(ValueError, match="uses \\{effort\\}: set `effort`"):
        ProposerSpec(backend="cli", command=["claude", "--effort", "{effort}"])
    with pytest.raises(ValueError, match="uses \\{model\\}: set `model`"):
        ProposerSpec(backend="cli", command=["claude", "--model", "{model}"], effort="max")
    with pytest.raises(ValueError, match="readPaths|read_paths"):
        ProposerSpec(backend="cli", command=["x"], read_paths=["relative/path"])


def test_what_a_cli_agent_hands_back_lands_only_as_plain_candidate_files(tmp_path):
    from whale.metaharness.proposer.cli_agent import _write_back

    _write_back(
        tmp_path,
        {
            "good.py": "x = 1\n",
            "good.md": "why",
            "../escape.py": "x",
            ".hidden.py": "x",
            "bad\x00.py": "x",
            "notes.txt": "x",
            "big.md": "m" * 100_000,
            "n.py": 5,
        },
    )
    assert sorted(p.name for p in (tmp_path / "candidates").iterdir()) == ["big.md", "good.md", "good.py"]
    assert not (tmp_path / "escape.py").exists()
    assert len((tmp_path / "candidates" / "big.md").read_text()) == 8_000  # a rationale's cap
    _write_back(tmp_path / "other", ["not", "a", "mapping"])
    assert list((tmp_path / "other" / "candidates").iterdir()) == []
