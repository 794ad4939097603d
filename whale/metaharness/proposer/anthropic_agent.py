"""Built-in proposer over the Anthropic Messages API (backend ``anthropic``).

:class:`AnthropicClient` is the only code that talks to the Messages API (plain HTTP with httpx, the
project's client; no SDK): ``POST {baseUrl}/v1/messages`` with the ``x-api-key`` and
``anthropic-version`` headers, retries on connection errors, 429, 5xx and 529 (overloaded), a deadline
per request, and errors that name the endpoint, the API's own error type and message, and what to check.

:class:`AnthropicAgentProposer` runs the shared agent loop (:mod:`whale.metaharness.proposer.agent`)
with the same tools and budgets as the ``openai`` backend, in Anthropic's wire format:

* tools are declared as ``{"name", "description", "input_schema"}``; the reply's ``content`` holds
  ``text`` and ``tool_use`` blocks (``{"id", "name", "input"}``) and is sent back unchanged (thinking
  blocks included) as the assistant turn;
* every ``tool_use`` is answered in the next user turn by a ``tool_result`` block
  (``{"tool_use_id", "content", "is_error"}``);
* the system prompt goes in ``system``; one ``cache_control`` breakpoint on the newest block lets the API
  cache the conversation's prefix between turns (cheaper and faster; it changes nothing else);
* usage: the prompt is ``input_tokens + cache_creation_input_tokens + cache_read_input_tokens``
  (``input_tokens`` leaves the cached part out), the reply ``output_tokens``; the budget charges them
  by :class:`~whale.metaharness.proposer.base.TokenMeter`'s rule, like every backend.
"""

from __future__ import annotations

import json
import logging
from typing import Any

import httpx

from whale.metaharness.proposer.agent import (
    DEFAULT_REPLY_TOKENS,
    ELIDED,
    AgentProposer,
    Conversation,
    ModelTurn,
    ToolCall,
    parse_arguments,
)
from whale.metaharness.proposer.base import ProposerError
from whale.metaharness.proposer.http import Endpoint, post_json

log = logging.getLogger(__name__)

#: the public endpoint (``spec.experiment.harnessSearch.proposer.baseUrl`` overrides it, e.g. for a gateway)
DEFAULT_BASE_URL = "https://api.anthropic.com"
#: the Messages API version this client speaks
ANTHROPIC_VERSION = "2023-06-01"
#: status codes worth a retry: rate limited, server errors, overloaded
_RETRY_STATUS = frozenset({408, 409, 429, 500, 502, 503, 504, 529})


class AnthropicClient:
    """``POST /v1/messages`` for the proposer (retries, deadlines, clear errors)."""

    def __init__(
        self,
        base_url: str | None,
        model: str,
        api_key: str,
        *,
        request_timeout_s: float = 600.0,
        retries: int = 2,
        transport: httpx.AsyncBaseTransport | None = None,
    ):
        if not model:
            raise ProposerError(
                "proposer backend 'anthropic' needs spec.experiment.harnessSearch.proposer.model (e.g. claude-opus-4-1)"
            )
        if not api_key:
            raise ProposerError(
                "proposer backend 'anthropic' needs an API key: set spec.experiment.harnessSearch.proposer."
                "apiKeySecret (and its environment variable for `whale run`)"
            )
        root = (base_url or DEFAULT_BASE_URL).rstrip("/")
        self.base_url = root.removesuffix("/v1")
        self.model = model
        self.retries = retries
        headers = {"x-api-key": api_key, "anthropic-version": ANTHROPIC_VERSION, "content-type": "application/json"}
        self._http = httpx.AsyncClient(
            base_url=self.base_url, headers=headers, timeout=request_timeout_s, transport=transport
        )

    async def messages(self, body: dict[str, Any], timeout_s: float) -> dict[str, Any]:
        """One Messages API call (the raw response JSON). Raises ProposerError after retries."""
        body = {"model": self.model, **body}
        url = f"{self.base_url}/v1/messages"
        hint_key = " (check the API key Secret, spec.experiment.harnessSearch.proposer.apiKeySecret)"
        endpoint = Endpoint(
            name=f"the Messages API at {url}",
            address=url,
            needs="content",
            valid=lambda data: isinstance(data.get("content"), list),
            retryable=lambda status: status in _RETRY_STATUS,
            error_text=_api_error,
            hints={
                401: hint_key,
                403: hint_key,
                404: " (check spec.experiment.harnessSearch.proposer.model and baseUrl)",
            },
        )
        return await post_json(self._http, "/v1/messages", body, endpoint, timeout_s=timeout_s, retries=self.retries)

    async def aclose(self) -> None:
        await self._http.aclose()


def _api_error(resp: httpx.Response) -> str:
    """``type: message`` of the API's error body, or the start of the body."""
    try:
        err = resp.json().get("error") or {}
        return f"{err.get('type', 'error')}: {str(err.get('message', ''))[:300]}"
    except (ValueError, AttributeError):
        return resp.text[:300]


def anthropic_tools(specs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """OpenAI-format function declarations as Messages API tools."""
    out = []
    for spec in specs:
        fn = spec["function"]
        out.append(
            {
                "name": fn["name"],
                "description": fn.get("description", ""),
                "input_schema": fn.get("parameters") or {"type": "object", "properties": {}},
            }
        )
    return out


class AnthropicAgentProposer(AgentProposer):
    """The built-in agent loop over the Messages API (backend ``anthropic``)."""

    backend = "anthropic"

    def __init__(self, client: AnthropicClient, *, reply_tokens: int = DEFAULT_REPLY_TOKENS):
        super().__init__(reply_tokens=reply_tokens)
        self.client = client

    async def aclose(self) -> None:
        await self.client.aclose()

    def conversation(self, system: str, task: str) -> Conversation:
        return AnthropicConversation(self.client, system, task)


class AnthropicConversation(Conversation):
    """Messages in the Messages API format: ``system`` apart, user/assistant turns of content blocks."""

    def __init__(self, client: AnthropicClient, system: str, task: str):
        self.client = client
        self.system = system
        self.messages: list[dict[str, Any]] = [{"role": "user", "content": [{"type": "text", "text": task}]}]

    def _with_cache_breakpoint(self) -> list[dict[str, Any]]:
        """The messages to send, with one ``cache_control`` on the newest block (the API allows four)."""
        out = [dict(m, content=[dict(b) for b in m["content"]]) for m in self.messages]
        last = out[-1]["content"]
        if last:
            last[-1]["cache_control"] = {"type": "ephemeral"}
        return out

    async def ask(self, tools: list[dict[str, Any]], max_tokens: int, timeout_s: float) -> ModelTurn:
        data = await self.client.messages(
            {
                "max_tokens": max_tokens,
                "system": self.system,
                "messages": self._with_cache_breakpoint(),
                "tools": anthropic_tools(tools),
                "tool_choice": {"type": "auto"},
            },
            timeout_s,
        )
        blocks = [b for b in data["content"] if isinstance(b, dict) and b.get("type")]
        # an empty text block is refused when sent back; a reply with nothing is not sent back at all
        blocks = [b for b in blocks if not (b["type"] == "text" and not b.get("text"))]
        if blocks:
            self.messages.append({"role": "assistant", "content": blocks})
        calls = [
            ToolCall(str(b.get("id") or ""), str(b.get("name") or ""), parse_arguments(b.get("input")))
            for b in blocks
            if b["type"] == "tool_use"
        ]
        text = "\n".join(str(b.get("text") or "") for b in blocks if b["type"] == "text")
        usage = data.get("usage")
        usage = usage if isinstance(usage, dict) else {}
        parts = [
            _count(usage.get(k)) for k in ("input_tokens", "cache_creation_input_tokens", "cache_read_input_tokens")
        ]
        prompt = None if parts[0] is None else sum(p or 0 for p in parts)
        return ModelTurn(
            text=text,
            calls=calls,
            prompt_tokens=prompt,
            completion_tokens=_count(usage.get("output_tokens")),
            cached_tokens=parts[2],
            stop_reason=str(data.get("stop_reason") or ""),
        )

    def add_tool_results(self, results: list[tuple[ToolCall, str]]) -> None:
        blocks = [
            {
                "type": "tool_result",
                "tool_use_id": call.id,
                "content": text,
                **({"is_error": True} if text.startswith("error:") else {}),
            }
            for call, text in results
        ]
        self._add_user_blocks(blocks)

    def add_user(self, text: str) -> None:
        self._add_user_blocks([{"type": "text", "text": text}])

    def _add_user_blocks(self, blocks: list[dict[str, Any]]) -> None:
        if self.messages and self.messages[-1]["role"] == "user":
            self.messages[-1]["content"].extend(blocks)  # roles alternate: one user turn
        else:
            self.messages.append({"role": "user", "content": blocks})

    def elide(self, budget_chars: int) -> None:
        total = self.chars()
        for message in self.messages:
            for block in message["content"]:
                if total <= budget_chars:
                    return
                if block.get("type") == "tool_result" and block.get("content") != ELIDED:
                    total -= len(json.dumps(block["content"])) - len(json.dumps(ELIDED))
                    block["content"] = ELIDED

    def chars(self) -> int:
        return len(self.system) + sum(len(json.dumps(m)) for m in self.messages)


def _count(value: Any) -> int | None:
    return int(value) if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None
