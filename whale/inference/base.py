"""The inference client interface every backend implements (HTTP, in-process, scripted).

The harness runtime, the RSFT sampler and the eval workload only see :class:`InferenceClient`:
``await client.chat(messages, sampling, n=..., tools=...)`` → a :class:`ChatResult` with ``n``
completions and the token usage. Backends:

* ``whale.inference.openai_http.OpenAIClient`` — any OpenAI-compatible server (vLLM in production);
* ``whale.inference.transformers_backend.TransformersClient`` — in-process, batched, on CPU or GPU;
  can share the model object with a trainer;
* ``whale.inference.scripted.ScriptedClient`` — replies given in advance (``whale replay``).
"""

from __future__ import annotations

import abc
import dataclasses
import hashlib
from typing import Any, Self

#: call seeds stay below this (a signed 32-bit seed field takes them, with room for ``seed + j``)
MAX_CALL_SEED = 2**31 - 2**16


def call_seed(seed: int, *parts: object) -> int:
    """A model call's seed from a run's seed and what identifies the call (item id, sample, turn):
    a stable hash, the same in every process and Python version (unlike ``hash()``). Pure."""
    key = "\x1f".join(map(str, (seed, *parts))).encode("utf-8")
    return int.from_bytes(hashlib.blake2b(key, digest_size=8).digest(), "big") % MAX_CALL_SEED


class InferenceError(RuntimeError):
    """A request failed for good (after retries, or a 4xx); the message says what to check."""


@dataclasses.dataclass(frozen=True)
class SamplingParams:
    """Sampling knobs, named as in the OpenAI/vLLM API. ``top_k`` -1 = off.

    ``chat_template_kwargs`` travel with every request (vLLM's field of that name; the in-process
    backend renders with them), as ``(name, value)`` pairs so the value stays hashable. The ``episode_*``
    budgets are never sent: the episode runner reads them and clamps each call's ``max_tokens``
    (``whale.harness.runner``)."""

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    #: generated tokens of one call at most
    max_tokens: int = 1024
    #: the call's sampling seed (None: unseeded): completion ``j`` of an ``n``-sample call samples from a
    #: generator seeded with ``seed + j`` (in process; vLLM seeds its ``j``-th child request the same way)
    seed: int | None = None
    stop: tuple[str, ...] = ()
    #: extra chat-template variables, e.g. ``(("enable_thinking", True),)``
    chat_template_kwargs: tuple[tuple[str, Any], ...] = ()
    #: generated tokens one episode may spend over all its calls (None: no budget)
    episode_tokens: int | None = None
    #: tokens after an episode's first prompt, generated and tool/environment alike (None: no cap)
    episode_window: int | None = None

    def __post_init__(self) -> None:
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {self.max_tokens}")
        for name in ("episode_tokens", "episode_window"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"{name} must be >= 1 or None, got {value}")
        if isinstance(self.chat_template_kwargs, dict):  # accept a dict, keep the hashable form
            object.__setattr__(self, "chat_template_kwargs", tuple(sorted(self.chat_template_kwargs.items())))

    @property
    def template_kwargs(self) -> dict[str, Any]:
        """``chat_template_kwargs`` as a dict."""
        return dict(self.chat_template_kwargs)

    @classmethod
    def from_spec(
        cls, sampling: Any, temperature: float | None = None, chat_template_kwargs: dict[str, Any] | None = None
    ) -> SamplingParams:
        """From ``whale.core.spec.Sampling`` (``rsft.sampling``), optionally overriding the temperature."""
        return cls(
            temperature=sampling.temperature if temperature is None else temperature,
            top_p=sampling.top_p,
            top_k=sampling.top_k,
            max_tokens=sampling.max_response_tokens,
            chat_template_kwargs=tuple(sorted((chat_template_kwargs or {}).items())),
            episode_tokens=getattr(sampling, "episode_token_budget", None),
            episode_window=getattr(sampling, "episode_window_tokens", None),
        )


@dataclasses.dataclass
class Completion:
    """One sampled reply."""

    #: the assistant message exactly as generated: ``{"role": "assistant", "content": str}`` plus
    #: ``"tool_calls"`` (OpenAI shape) when the model called tools
    message: dict[str, Any]
    #: "stop" | "length" | "tool_calls"
    finish_reason: str
    #: generated tokens of this completion
    completion_tokens: int
    #: the generated token ids, when the backend knows them (in-process backend); None otherwise
    token_ids: list[int] | None = None


@dataclasses.dataclass
class ChatResult:
    """The answer to one ``chat`` call: ``n`` completions of one prompt."""

    completions: list[Completion]
    #: tokens of the prompt (counted once, as the OpenAI ``usage`` does)
    prompt_tokens: int
    #: generated tokens, all completions together
    completion_tokens: int
    #: wall seconds of the call, retries included
    latency_s: float = 0.0


class InferenceClient(abc.ABC):
    """Chat completions. Safe to call concurrently from many asyncio tasks."""

    #: the model name reported in traces
    model: str = "unknown"
    #: prompt + max_tokens of one request may not exceed this (the server's context); None: unknown
    max_model_len: int | None = None
    #: the torch device type generation runs on when it runs in this process (cpu, cuda); None: a server's
    device: str | None = None

    @abc.abstractmethod
    async def chat(
        self,
        messages: list[dict[str, Any]],
        sampling: SamplingParams,
        n: int = 1,
        tools: list[dict[str, Any]] | None = None,
    ) -> ChatResult:
        """Sample ``n`` replies to ``messages`` (OpenAI chat format). ``tools``: OpenAI function
        schemas the model may call; replies then may carry ``tool_calls``. Raises
        :class:`InferenceError`."""

    async def count_prompt_tokens(
        self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None, sampling: SamplingParams
    ) -> int | None:
        """Tokens of the prompt ``chat`` would send for these messages (the rendered chat template with
        the generation prompt), or None when this backend cannot count them without a model call."""
        return None

    async def aclose(self) -> None:
        """Release connections/threads. Idempotent."""

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()
