"""The built-in agent loop, shared by the API backends (``openai``, ``anthropic``).

A backend supplies a :class:`Conversation` — one agent session in its wire format (message shapes,
tool declarations, usage fields) — and :class:`AgentProposer` runs the same loop over it: the model
calls the tools of :class:`~whale.metaharness.proposer.tools.Toolbox` (``list_files`` / ``read_file`` /
``grep`` / ``write_candidate`` / ``finish`` over the archive copy, and the sandboxed ``run_candidate`` and
``run_shell``) until it finishes or a budget runs out: turns, wall time, or tokens counted as the paper
counts them (:class:`~whale.metaharness.proposer.base.TokenMeter`: generated plus read for the first time).

A model that answers in plain text instead of tool calls (small local models do) is nudged once;
fenced ```python blocks in its text are taken as candidates, so whatever it writes still reaches
validation. Tool results longer than ``TOOL_RESULT_CHARS`` are cut; above ``CONTEXT_CHARS`` of
conversation the oldest tool results are elided (the agent can call the tool again).
"""

from __future__ import annotations

import abc
import asyncio
import dataclasses
import json
import os
import re
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from whale.metaharness.proposer.base import (
    ProposalRequest,
    Proposer,
    ProposerError,
    ProposerReport,
    TokenMeter,
    collect_candidates,
    task_prompt,
)
from whale.metaharness.proposer.kit import KIT_DIR, offline_kit
from whale.metaharness.proposer.tools import Toolbox
from whale.metaharness.proposer.workspace import Workspace

SYSTEM_PROMPT = (
    "You are a careful coding agent improving an LLM agent's harness. Work only through the tools: "
    "read the archive (summary.md, candidates' code and traces), "
    "then write your candidates with write_candidate, then call finish."
)
NUDGE = (
    "Use the tools: read files with read_file, write each candidate with write_candidate(name, code, "
    "rationale), then call finish."
)
_CODE_BLOCK_RE = re.compile(r"```(?:python|py)?\s*\n(.*?)```", re.DOTALL)
#: longest tool result put back into the conversation
TOOL_RESULT_CHARS = 20_000
#: above this many characters of conversation, the oldest tool results are elided (re-readable)
CONTEXT_CHARS = 400_000
ELIDED = "[elided to save context; call the tool again if you need it]"
#: the largest reply of one model call (``spec.experiment.harnessSearch.proposer.maxReplyTokens``)
DEFAULT_REPLY_TOKENS = 8192


@dataclasses.dataclass(frozen=True)
class ToolCall:
    """One tool call of a model reply; ``arguments`` is None when they were not a JSON object."""

    id: str
    name: str
    arguments: dict[str, Any] | None


@dataclasses.dataclass(frozen=True)
class ModelTurn:
    """One model reply, backend-neutral."""

    text: str
    calls: list[ToolCall]
    #: the whole prompt as the API counted it (cached parts included); None: not reported
    prompt_tokens: int | None
    completion_tokens: int | None
    #: the part of the prompt the API served from its cache, where it says so (recorded, not charged)
    cached_tokens: int | None = None
    stop_reason: str = ""


class Conversation(abc.ABC):
    """One agent session in a backend's wire format; :meth:`ask` appends the model's reply."""

    @abc.abstractmethod
    async def ask(self, tools: list[dict[str, Any]], max_tokens: int, timeout_s: float) -> ModelTurn:
        """One model call with the conversation so far; raises ProposerError when the API fails."""

    @abc.abstractmethod
    def add_tool_results(self, results: list[tuple[ToolCall, str]]) -> None:
        """Answer every call of the last reply."""

    @abc.abstractmethod
    def add_user(self, text: str) -> None:
        """A user message (the nudge)."""

    @abc.abstractmethod
    def elide(self, budget_chars: int) -> None:
        """Blank the oldest tool results until the conversation is under ``budget_chars``."""

    @abc.abstractmethod
    def chars(self) -> int:
        """Characters the next :meth:`ask` sends (for token estimates when the API reports no usage)."""


def parse_arguments(raw: Any) -> dict[str, Any] | None:
    """Tool-call arguments as a dict (from a JSON string or an object), or None."""
    try:
        value = json.loads(raw) if isinstance(raw, str) else raw
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def place_kit(archive_dir: Path, files: Mapping[str, str]) -> None:
    """The prototyping kit (``proto/...``, :func:`~whale.metaharness.proposer.kit.offline_kit`) in the agent's copy of
    the archive, where its file tools and ``run_shell`` (whose working directory that copy is) see it. Each file
    written whole, atomically; a path that leaves the folder is refused (the kit's paths are ours)."""
    root = Path(archive_dir).resolve()
    for rel, text in files.items():
        dest = (root / rel).resolve()
        if not dest.is_relative_to(root / KIT_DIR):
            raise ValueError(f"kit file {rel!r} is outside {KIT_DIR}/")
        dest.parent.mkdir(parents=True, exist_ok=True)
        tmp = dest.with_name(f".{dest.name}.part")
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, dest)


class AgentProposer(Proposer):
    """The agent loop over a backend's :class:`Conversation`."""

    def __init__(self, *, reply_tokens: int = DEFAULT_REPLY_TOKENS):
        self.reply_tokens = reply_tokens

    @abc.abstractmethod
    def conversation(self, system: str, task: str) -> Conversation:
        """A fresh session with the system prompt and the task."""

    async def propose(self, request: ProposalRequest) -> ProposerReport:
        report = ProposerReport()
        started = time.monotonic()
        deadline = started + request.timeout_s
        place_kit(request.archive_dir, offline_kit(request.workspace))
        workspace = Workspace(request.archive_dir, request.scratch_dir, request.count)
        toolbox = Toolbox(workspace, request.tools, deadline)
        task = task_prompt(request)
        conv = self.conversation(SYSTEM_PROMPT, task)
        report.transcript.extend(
            [{"turn": 0, "role": "system", "content": SYSTEM_PROMPT}, {"turn": 0, "role": "user", "content": task}]
        )
        meter = TokenMeter()
        nudged = False
        report.stopped_by = "max_turns"
        while report.turns < request.max_turns:
            left_s = deadline - time.monotonic()
            if left_s <= 0:
                report.stopped_by = "timeout"
                break
            if meter.total >= request.max_tokens:
                report.stopped_by = "max_tokens"
                break
            sent_chars = conv.chars()
            try:
                turn = await asyncio.wait_for(
                    conv.ask(toolbox.specs, min(self.reply_tokens, request.max_tokens - meter.total), left_s),
                    timeout=left_s,
                )
            except TimeoutError:
                report.stopped_by = "timeout"
                break
            except ProposerError as exc:
                report.notes.append(str(exc))
                report.stopped_by = "error"
                break
            report.turns += 1
            prompt = turn.prompt_tokens if turn.prompt_tokens is not None else sent_chars // 4
            completion = turn.completion_tokens if turn.completion_tokens is not None else _reply_chars(turn) // 4
            charged = meter.charge(prompt, completion)
            report.transcript.append(
                {
                    "turn": report.turns,
                    "role": "assistant",
                    "content": turn.text,
                    "tool_calls": [{"id": c.id, "name": c.name, "arguments": c.arguments} for c in turn.calls],
                    "stop_reason": turn.stop_reason,
                    "usage": {
                        "prompt_tokens": turn.prompt_tokens,
                        "completion_tokens": turn.completion_tokens,
                        "cached_tokens": turn.cached_tokens,
                        "charged": charged,
                    },
                }
            )
            if not turn.calls:
                _take_code_blocks(turn.text, workspace, report)
                if nudged or workspace.written:
                    report.stopped_by = "no_tool_calls"
                    break
                nudged = True
                conv.add_user(NUDGE)
                continue
            results = []
            for call in turn.calls:
                if call.arguments is None:
                    result = f"error: the arguments of {call.name} are not a JSON object"
                else:
                    # every tool call is bounded; several in one reply are bounded by the deadline too
                    result = await toolbox.call(call.name, call.arguments)
                result = result[:TOOL_RESULT_CHARS]
                results.append((call, result))
                report.transcript.append(
                    {
                        "turn": report.turns,
                        "role": "tool",
                        "name": call.name,
                        "tool_call_id": call.id,
                        "content": result,
                    }
                )
            conv.add_tool_results(results)
            if toolbox.finished:
                report.stopped_by = "finish"
                break
            conv.elide(CONTEXT_CHARS)
        if report.stopped_by in ("max_turns", "max_tokens", "timeout"):
            report.notes.append(f"proposer stopped by its {report.stopped_by} budget")
        report.tokens, report.generated_tokens, report.read_tokens = meter.total, meter.generated, meter.read
        trials = toolbox.tools.trials
        report.trial_rollouts = trials.rollouts if trials is not None else 0
        report.seconds = time.monotonic() - started
        proposals, notes = collect_candidates(request.scratch_dir, request.count, workspace.written)
        report.proposals = proposals
        report.notes.extend(notes)
        return report


def _reply_chars(turn: ModelTurn) -> int:
    return len(turn.text) + sum(len(c.name) + len(json.dumps(c.arguments)) for c in turn.calls)


def _take_code_blocks(text: str, workspace: Workspace, report: ProposerReport) -> None:
    """Plain-text answers: fenced python blocks become candidates (they still face validation)."""
    for block in _CODE_BLOCK_RE.findall(text):
        if len(workspace.written) >= workspace.max_candidates:
            break
        name = f"text{len(workspace.written) + 1}"
        result = workspace.call(
            "write_candidate", {"name": name, "code": block, "rationale": "taken from a plain-text reply"}
        )
        report.notes.append(f"took a code block from a plain-text reply as {name}: {result[:120]}")
