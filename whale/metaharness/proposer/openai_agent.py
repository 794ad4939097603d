"""Built-in proposer over any OpenAI-compatible chat-completions API with tool calls (backend ``openai``).

:class:`ProposerClient` is the only code that talks to the proposer's endpoint (httpx): one POST
per turn, retries on connection errors and 5xx, a deadline per request, errors that name the
endpoint and what to check. :class:`OpenAIAgentProposer` runs the shared agent loop
(:mod:`whale.metaharness.proposer.agent`) over an OpenAI-format conversation: ``tool_calls`` in the
assistant message, one ``tool`` message per call, usage from ``usage.prompt_tokens`` /
``completion_tokens`` (``prompt_tokens_details.cached_tokens`` is recorded where reported).
"""

from __future__ import annotations

import json
import logging
from typing import Any

import httpx

from whale.metaharness.proposer.agent import (
    CONTEXT_CHARS,
    DEFAULT_REPLY_TOKENS,
    ELIDED,
    NUDGE,
    SYSTEM_PROMPT,
    TOOL_RESULT_CHARS,
    AgentProposer,
    Conversation,
    ModelTurn,
    ToolCall,
    parse_arguments,
)
from whale.metaharness.proposer.base import ProposerError
from whale.metaharness.proposer.http import Endpoint, post_json

log = logging.getLogger(__name__)

__all__ = [
    "CONTEXT_CHARS",
    "ELIDED",
    "NUDGE",
    "SYSTEM_PROMPT",
    "TOOL_RESULT_CHARS",
    "OpenAIAgentProposer",
    "ProposerClient",
]


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
        seed: int | None = None,
    ):
        if not base_url:
            raise ProposerError("proposer baseUrl is empty: set spec.experiment.harnessSearch.proposer.baseUrl")
        self.base_url = base_url.rstrip("/")
        self.model = model
        self.retries = retries
        #: ``harnessSearch.seed``: request n carries ``seed + n`` (OpenAI's and vLLM's best-effort reproducible
        #: sampling), so one seed replays a search where the endpoint honours it; None sends none
        self.seed = seed
        self._requests = 0
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._http = httpx.AsyncClient(
            base_url=self.base_url, headers=headers, timeout=request_timeout_s, transport=transport
        )

    async def chat(
        self, messages: list[dict[str, Any]], tools: list[dict[str, Any]], max_tokens: int, timeout_s: float
    ) -> dict[str, Any]:
        """One completion (the raw response JSON). Raises ProposerError after retries."""
        body = {
            "model": self.model,
            "messages": messages,
            "tools": tools,
            "tool_choice": "auto",
            "max_tokens": max_tokens,
            "temperature": 0.7,
        }
        if self.seed is not None:
            body["seed"] = self.seed + self._requests
        self._requests += 1
        endpoint = Endpoint(
            name=f"proposer endpoint {self.base_url}",
            address=self.base_url,
            needs="choices",
            valid=lambda data: bool(data.get("choices")),
            retryable=lambda status: status >= 500 or status == 429,
            hints={401: " (check the API key Secret)", 403: " (check the API key Secret)"},
        )
        return await post_json(
            self._http, "/chat/completions", body, endpoint, timeout_s=timeout_s, retries=self.retries
        )

    async def aclose(self) -> None:
        await self._http.aclose()


class OpenAIAgentProposer(AgentProposer):
    """The built-in agent loop over an OpenAI-compatible API (backend ``openai``)."""

    backend = "openai"

    def __init__(self, client: ProposerClient, *, reply_tokens: int = DEFAULT_REPLY_TOKENS):
        super().__init__(reply_tokens=reply_tokens)
        self.client = client

    async def aclose(self) -> None:
        await self.client.aclose()

    def conversation(self, system: str, task: str) -> Conversation:
        return OpenAIConversation(self.client, system, task)


class OpenAIConversation(Conversation):
    """Messages in the chat-completions format."""

    def __init__(self, client: ProposerClient, system: str, task: str):
        self.client = client
        self.messages: list[dict[str, Any]] = [{"role": "system", "content": system}, {"role": "user", "content": task}]

    async def ask(self, tools: list[dict[str, Any]], max_tokens: int, timeout_s: float) -> ModelTurn:
        data = await self.client.chat(self.messages, tools, max_tokens, timeout_s)
        message = _assistant_message(data)
        self.messages.append(message)
        calls = []
        for n, raw in enumerate(message.get("tool_calls") or []):
            function = raw.get("function") or {}
            if not raw.get("id"):
                raw["id"] = f"call_{len(self.messages)}_{n}"  # the tool message must name it
            calls.append(
                ToolCall(
                    str(raw["id"]), str(function.get("name", "")), parse_arguments(function.get("arguments") or "{}")
                )
            )
        usage = data.get("usage")
        usage = usage if isinstance(usage, dict) else {}
        details = usage.get("prompt_tokens_details")
        details = details if isinstance(details, dict) else {}
        choice = (data.get("choices") or [{}])[0] or {}
        return ModelTurn(
            text=str(message.get("content") or ""),
            calls=calls,
            prompt_tokens=_int_or_none(usage.get("prompt_tokens")),
            completion_tokens=_int_or_none(usage.get("completion_tokens")),
            cached_tokens=_int_or_none(details.get("cached_tokens")),
            stop_reason=str(choice.get("finish_reason") or ""),
        )

    def add_tool_results(self, results: list[tuple[ToolCall, str]]) -> None:
        for call, text in results:
            self.messages.append({"role": "tool", "tool_call_id": call.id, "content": text})

    def add_user(self, text: str) -> None:
        self.messages.append({"role": "user", "content": text})

    def elide(self, budget_chars: int) -> None:
        _elide_old_tool_results(self.messages, budget_chars)

    def chars(self) -> int:
        return sum(len(json.dumps(m)) for m in self.messages)


def _int_or_none(value: Any) -> int | None:
    return int(value) if isinstance(value, (int, float)) and not isinstance(value, bool) and value >= 0 else None


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
