"""The real Claude Code binary (the worker image's pinned install) starts in the agent's sandbox with the examples'
exact command and settings. No network here, so no model answers: the session is killed at its timeout and what
is checked is the init event Claude Code prints first — the model, the tool set and the permission mode it took
from the flags, and the sandbox's workspace as its cwd.

Skipped where the binary is absent: ``/opt/claude-code/bin/claude`` (the worker image) or ``$WHALE_TEST_CLAUDE_CODE``
(``python images/worker/install_claude_code.py --prefix DIR`` installs it; then point the variable at
``DIR/bin/claude``)."""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path

import pytest
import yaml

from whale.metaharness.proposer.base import ProposalRequest
from whale.metaharness.proposer.cli_agent import CLIAgentProposer

REPO = Path(__file__).resolve().parents[2]
BINARY = Path(os.environ.get("WHALE_TEST_CLAUDE_CODE", "/opt/claude-code/bin/claude"))


@pytest.mark.timeout(120)
@pytest.mark.skipif(not BINARY.is_file(), reason=f"{BINARY}: no Claude Code install here")
def test_claude_code_starts_in_its_sandbox_with_the_examples_settings(tmp_path: Path):
    spec = yaml.safe_load((REPO / "manifests" / "examples" / "chess-mh.yaml").read_text())
    proposer = spec["spec"]["experiment"]["harnessSearch"]["proposer"]
    install = BINARY.parent.parent
    agent = CLIAgentProposer(
        [str(BINARY), *proposer["command"][1:]],
        {"ANTHROPIC_API_KEY": "sk-ant-not-a-key"},
        read_paths=[str(install)],
        network="none",  # nothing leaves this machine
        model=proposer["model"],
        effort=proposer["effort"],
    )
    (tmp_path / "archive").mkdir()
    request = ProposalRequest(
        iteration=2,
        count=3,
        archive_dir=tmp_path / "archive",
        scratch_dir=tmp_path / "scratch",
        skill="# Skill\nWrite harness files.",
        incoming_code="",
        incoming_id="i01-incoming",
        prompt_only=False,
        allowed_imports=("re",),
        timeout_s=45,  # its start-up (and an API retry or two) fits well inside
        max_turns=40,
        max_tokens=200_000,
    )
    report = asyncio.run(agent.propose(request))
    assert report.stopped_by == "timeout" and report.proposals == []  # no API to answer: killed at its deadline
    tail = report.transcript[0].get("output_tail", "")
    assert tail, report.transcript
    init = json.loads(tail.splitlines()[0])
    assert (init["type"], init["subtype"], init["model"], init["permissionMode"], init["cwd"]) == (
        "system",
        "init",
        "claude-opus-4-7",
        "bypassPermissions",
        "/scratch",
    )
    assert sorted(init["tools"]) == ["Bash", "Edit", "Glob", "Grep", "Read", "Write"]
