"""A client whose replies are given in advance: ``whale replay`` and harness smoke tests.

Replies are handed out in call order, one per completion; when they run out, replies are empty
strings (the episode then goes on with empty answers until its harness or turn budget ends it).
A string reply is read the way a server with a tool-call parser reads generated text: ``<tool_call>``
blocks, hermes-style JSON or qwen3_coder ``<function=...>`` (``whale.inference.toolcalls``), become
the message's tool calls.
Token counts are whitespace word counts: there is no tokenizer behind this client.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from typing import Any

from whale.inference.base import ChatResult, Completion, InferenceClient, SamplingParams
from whale.inference.toolcalls import assistant_message


class ScriptedClient(InferenceClient):
    model = "scripted"

    def __init__(self, replies: Iterable[str | dict[str, Any]]):
        self._replies = list(replies)
        self._next = 0
        self._lock = asyncio.Lock()
        #: every prompt this client was asked, in order (for inspection)
        self.prompts: list[list[dict[str, Any]]] = []

    @property
    def used(self) -> int:
        return min(self._next, len(self._replies))

    async def chat(
        self,
        messages: list[dict[str, Any]],
        sampling: SamplingParams,
        n: int = 1,
        tools: list[dict[str, Any]] | None = None,
    ) -> ChatResult:
        async with self._lock:
            self.prompts.append([dict(m) for m in messages])
            completions = []
            for _ in range(n):
                reply = self._replies[self._next] if self._next < len(self._replies) else ""
                self._next += 1
                # a string reply is read like generated text: <tool_call> blocks become tool calls
                message = assistant_message(reply, tools=tools) if isinstance(reply, str) else dict(reply)
                message.setdefault("role", "assistant")
                finish = "tool_calls" if message.get("tool_calls") else "stop"
                tokens = len(str(message.get("content") or "").split())
                completions.append(Completion(message=message, finish_reason=finish, completion_tokens=tokens))
        prompt_tokens = sum(len(str(m.get("content") or "").split()) for m in messages)
        return ChatResult(completions, prompt_tokens, sum(c.completion_tokens for c in completions))


class FixedLatencyClient(InferenceClient):
    """Answers every request with ``reply`` after ``latency_s``: a stand-in model with a known
    service time, for throughput benchmarks and tests of the runtime (it does not model anything)."""

    model = "fixed-latency"

    def __init__(self, reply: str, latency_s: float, prompt_tokens: int = 10, completion_tokens: int = 5):
        self.reply, self.latency_s = reply, latency_s
        self.prompt_tokens, self.completion_tokens_each = prompt_tokens, completion_tokens
        self.requests = 0

    async def chat(
        self,
        messages: list[dict[str, Any]],
        sampling: SamplingParams,
        n: int = 1,
        tools: list[dict[str, Any]] | None = None,
    ) -> ChatResult:
        self.requests += 1
        await asyncio.sleep(self.latency_s)
        completions = [
            Completion({"role": "assistant", "content": self.reply}, "stop", self.completion_tokens_each)
            for _ in range(n)
        ]
        return ChatResult(completions, self.prompt_tokens, self.completion_tokens_each * n, self.latency_s)
