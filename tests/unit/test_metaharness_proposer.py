"""Proposer pieces without a model: workspace confinement and bounds, candidate collection, the CLI
command template, the replay script, building a backend from the spec."""

import json

import pytest

from whale.metaharness.proposer import ProposerError, collect_candidates, from_spec
from whale.metaharness.proposer.base import MAX_CANDIDATE_BYTES, ProposalRequest, task_prompt
from whale.metaharness.proposer.cli_agent import render_command
from whale.metaharness.proposer.workspace import GREP_LIMIT, READ_LIMIT_CHARS, Workspace
from whale.spec import Proposer as ProposerSpec


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
    assert ws.call("read_file", {"path": "candidates/i01-incoming/traces.jsonl", "offset": READ_LIMIT_CHARS}) == "x" * 10
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
    argv = render_command(["agent", "--dir", "{archive}", "write {n} files into {scratch}"],
                          {"archive": "/a", "n": "3", "scratch": "/s"})
    assert argv == ["agent", "--dir", "/a", "write 3 files into /s"]
    with pytest.raises(ProposerError, match=r"unknown field 'model'"):
        render_command(["{model}"], {})


def test_task_prompt_states_the_rules(tmp_path):
    req = ProposalRequest(iteration=3, count=2, archive_dir=tmp_path, scratch_dir=tmp_path, skill="SKILL TEXT",
                          incoming_code="class Harness: pass", incoming_id="i01-incoming", prompt_only=True,
                          allowed_imports=("re",), timeout_s=1, max_turns=1, max_tokens=1)
    text = task_prompt(req)
    assert "iteration 3" in text and "exactly 2" in text and "PROMPT-ONLY" in text and "SKILL TEXT" in text


def test_from_spec_backends_and_key_errors(tmp_path):
    with pytest.raises(ProposerError, match="WHALE_PROPOSER_API_KEY"):
        from_spec(ProposerSpec(backend="openai", base_url="http://x/v1", model="m",
                               api_key_secret={"name": "s", "key": "k"}), environ={})
    p = from_spec(ProposerSpec(backend="openai", base_url="http://x/v1", model="m",
                               api_key_secret={"name": "s", "key": "k", "env": "MY_KEY"}), environ={"MY_KEY": "v"})
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
