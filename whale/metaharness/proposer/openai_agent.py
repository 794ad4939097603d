"""Built-in proposer: an agent loop over any OpenAI-compatible chat-completions API with tool calls.

:class:`ProposerClient` is the only code that talks to the proposer's endpoint (httpx): one POST
per turn, retries on connection errors and 5xx, a deadline per request, errors that name the
endpoint and what to check. :class:`OpenAIAgentProposer` runs the loop: the model calls
``list_files`` / ``read_file`` / ``grep`` / ``write_candidate`` / ``finish``
(:mod:`whale.metaharness.proposer.workspace`) until it finishes or a budget (turns, tokens, wall
time) runs out. A model that answers in plain text instead of tool calls (small local models do)
is nudged once; fenced ```python blocks in its text are taken as candidates, so whatever it writes
still reaches validation.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import time
from typing import Any

import httpx

from whale.metaharness.proposer.base import (
    ProposalRequest,
    Proposer,
    ProposerError,
    ProposerReport,
    collect_candidates,
    task_prompt,
)
from whale.metaharness.proposer.workspace import TOOL_SPECS, Workspace

log = logging.getLogger(__name__)

SYSTEM_PROMPT = (
    "You are a careful coding agent improving an LLM agent's harness. Work only through the tools: "
    "read the archive (summary.md, candidates' code and traces), then write your candidates with "
    "write_candidate, then call finish."
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


class ProposerClient:
    """OpenAI-compatible ``/chat/completions`` for the proposer (retries, deadlines, clear errors)."""

    def __init__(
        self,
        base_url: str,
        model: str,
        api_key: str | None = None,
        *,
        request_timeout_s: float = 600.0,
        retries: int = 2,
        transport: httpx.AsyncBaseTransport | None = None,
    ):
        if not base_url:
            raise ProposerError("proposer baseUrl is empty: set spec.harnessSearch.proposer.baseUrl")
        self.base_url = base_url.rstrip("/")
        self.model = model
        self.retries = retries
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._http = httpx.AsyncClient(
            base_url=self.base_url, headers=headers, timeout=request_timeout_s, transport=transport
        )

    async def chat(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]], max_tokens: int,
                   timeout_s: float) -> dict[str, Any]:
        """One completion (the raw response JSON). Raises ProposerError after retries."""
        body = {
            "model": self.model,
            "messages": messages,
            "tools": tools,
            "tool_choice": "auto",
            "max_tokens": max_tokens,
            "temperature": 0.7,
        }
        last = "no attempt"
        for attempt in range(self.retries + 1):
            try:
                resp = await self._http.post("/chat/completions", json=body, timeout=max(timeout_s, 1.0))
            except httpx.TimeoutException:
                raise ProposerError(f"proposer endpoint {self.base_url} did not answer within {timeout_s:.0f} s") from None
            except httpx.TransportError as exc:
                last = f"cannot reach {self.base_url}: {exc}"
            else:
                if resp.status_code < 400:
                    try:
                        data = resp.json()
                    except ValueError:
                        raise ProposerError(f"proposer endpoint {self.base_url} answered non-JSON") from None
                    if not isinstance(data, dict) or not data.get("choices"):
                        raise ProposerError(f"proposer endpoint {self.base_url} answered without choices: {str(data)[:200]}")
                    return data
                last = f"HTTP {resp.status_code} from {self.base_url}: {resp.text[:300]}"
                if resp.status_code < 500 and resp.status_code != 429:
                    hint = " (check the API key Secret)" if resp.status_code in (401, 403) else ""
                    raise ProposerError(last + hint)
            if attempt < self.retries:
                await asyncio.sleep(0.5 * 2**attempt)
        raise ProposerError(f"proposer request failed after {self.retries + 1} attempts: {last}")

    async def aclose(self) -> None:
        await self._http.aclose()


class OpenAIAgentProposer(Proposer):
    """The built-in agent loop (backend ``openai``)."""

    backend = "openai"

    def __init__(self, client: ProposerClient, *, reply_tokens: int = 4096):
        self.client = client
        self.reply_tokens = reply_tokens

    async def aclose(self) -> None:
        await self.client.aclose()

    async def propose(self, request: ProposalRequest) -> ProposerReport:
        report = ProposerReport()
        workspace = Workspace(request.archive_dir, request.scratch_dir, request.count)
        messages: list[dict[str, Any]] = [
            {"role": "system", "content": SYSTEM_PROMPT},
            {"role": "user", "content": task_prompt(request)},
        ]
        report.transcript.extend({"turn": 0, **m} for m in messages)
        started = time.monotonic()
        deadline = started + request.timeout_s
        nudged = False
        report.stopped_by = "max_turns"
        while report.turns < request.max_turns:
            left_s = deadline - time.monotonic()
            if left_s <= 0:
                report.stopped_by = "timeout"
                break
            if report.tokens >= request.max_tokens:
                report.stopped_by = "max_tokens"
                break
            try:
                data = await asyncio.wait_for(
                    self.client.chat(messages, TOOL_SPECS, min(self.reply_tokens, request.max_tokens - report.tokens), left_s),
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
            usage = data.get("usage") or {}
            report.tokens += int(usage.get("total_tokens") or 0) or _estimate_tokens(messages, data)
            message = _assistant_message(data)
            messages.append(message)
            report.transcript.append({"turn": report.turns, **message})
            calls = message.get("tool_calls") or []
            if not calls:
                _take_code_blocks(message.get("content") or "", workspace, report)
                if nudged or workspace.written:
                    report.stopped_by = "no_tool_calls"
                    break
                nudged = True
                messages.append({"role": "user", "content": NUDGE})
                continue
            for call in calls:
                # each tool call is bounded (workspace.py); many of them in one reply must not outlast the budget
                if time.monotonic() >= deadline:
                    result = "error: the proposer's time budget is spent; this tool call was not run"
                else:
                    result = _run_call(workspace, call)
                tool_msg = {"role": "tool", "tool_call_id": call.get("id") or "", "content": result[:TOOL_RESULT_CHARS]}
                messages.append(tool_msg)
                report.transcript.append({"turn": report.turns, "name": (call.get("function") or {}).get("name"), **tool_msg})
            if workspace.finished:
                report.stopped_by = "finish"
                break
            _elide_old_tool_results(messages, CONTEXT_CHARS)
        if report.stopped_by in ("max_turns", "max_tokens", "timeout"):
            report.notes.append(f"proposer stopped by its {report.stopped_by} budget")
        report.seconds = time.monotonic() - started
        proposals, notes = collect_candidates(request.scratch_dir, request.count, workspace.written)
        report.proposals = proposals
        report.notes.extend(notes)
        return report


def _elide_old_tool_results(messages: list[dict[str, Any]], budget: int) -> None:
    """Keep the conversation under ``budget`` characters by blanking the oldest tool results."""
    total = sum(len(str(m.get("content") or "")) for m in messages)
    for m in messages:
        if total <= budget:
            return
        if m.get("role") == "tool" and m.get("content") != ELIDED:
            total -= len(str(m["content"])) - len(ELIDED)
            m["content"] = ELIDED


def _assistant_message(data: dict[str, Any]) -> dict[str, Any]:
    choice = (data.get("choices") or [{}])[0] or {}
    raw = choice.get("message") or {}
    message: dict[str, Any] = {"role": "assistant", "content": raw.get("content") or ""}
    calls = raw.get("tool_calls")
    if isinstance(calls, list) and calls:
        message["tool_calls"] = [c for c in calls if isinstance(c, dict)]
    return message


def _run_call(workspace: Workspace, call: dict[str, Any]) -> str:
    function = call.get("function") or {}
    name = str(function.get("name", ""))
    raw = function.get("arguments") or "{}"
    try:
        arguments = json.loads(raw) if isinstance(raw, str) else dict(raw)
    except (ValueError, TypeError):
        return f"error: the arguments of {name} are not a JSON object"
    if not isinstance(arguments, dict):
        return f"error: the arguments of {name} are not a JSON object"
    return workspace.call(name, arguments)


def _take_code_blocks(text: str, workspace: Workspace, report: ProposerReport) -> None:
    """Plain-text answers: fenced python blocks become candidates (they still face validation)."""
    for block in _CODE_BLOCK_RE.findall(text):
        if len(workspace.written) >= workspace.max_candidates:
            break
        name = f"text{len(workspace.written) + 1}"
        result = workspace.call("write_candidate", {"name": name, "code": block, "rationale": "taken from a plain-text reply"})
        report.notes.append(f"took a code block from a plain-text reply as {name}: {result[:120]}")


def _estimate_tokens(messages: list[dict[str, Any]], data: dict[str, Any]) -> int:
    """No usage reported: ~4 characters per token over the prompt and the reply."""
    chars = sum(len(json.dumps(m)) for m in messages) + len(json.dumps(data.get("choices", [])))
    return chars // 4

