"""OpenAI-compatible chat-completions client over aiohttp (vLLM in production).

The only module that speaks HTTP to an inference server. Retries with exponential backoff (and
jitter) on connection errors, timeouts, 429 and 5xx; a 4xx other than 429 is permanent (bad request,
unknown model) and raised at once with the server's message. ``top_k`` is sent as a top-level body
field, as vLLM accepts it (other servers ignore unknown fields or reject them: set ``send_top_k``).

Why aiohttp: the harness runtime keeps 64+ requests in flight to one server, so the client's CPU per
request sets how close the runtime gets to the server's ceiling. Measured on loopback at concurrency
64 (``benchmarks/runtime_throughput.py``'s server): httpx's default pool ~70 requests/s (its pool
scans every connection per request), httpx over a hand-written keep-alive transport ~310 µs CPU per
request, aiohttp (C HTTP parser, O(1) keep-alive pool, TLS) ~215 µs.
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
import time
from typing import Any

import aiohttp

from whale.inference.base import ChatResult, Completion, InferenceClient, InferenceError, SamplingParams

log = logging.getLogger(__name__)

RETRY_STATUSES = frozenset({408, 429, 500, 502, 503, 504})
#: idle keep-alive seconds on our side: below uvicorn's (vLLM's) 5 s, so we drop an idle connection
#: before the server does (a request racing the server's close would cost a retry)
KEEPALIVE_S = 4.0


class OpenAIClient(InferenceClient):
    """``OpenAIClient("http://host:8000/v1", model="Qwen/Qwen3-4B")``.

    Args:
        base_url: up to and including ``/v1``.
        model: the served model name (``/v1/models``); None = ask the server once.
        timeout_s: per-request read timeout (a long generation is one request).
        connect_timeout_s: TCP connect timeout.
        max_retries: retries after the first attempt, on retryable failures only.
        backoff_s: first backoff; doubles each retry, capped at ``max_backoff_s``, with jitter.
        max_connections: HTTP connection pool size (≥ the runtime's concurrency).
        api_key: sent as a Bearer token when given (never logged).
        send_top_k: include ``top_k`` in requests (vLLM: yes; strict OpenAI servers: no).
        max_model_len: the server's context length (vLLM ``--max-model-len``), for the episode runner's
            clamp of ``max_tokens``; None: unknown.

    ``sampling.chat_template_kwargs`` go out as the request's ``chat_template_kwargs`` (vLLM renders
    its chat template with them: ``enable_thinking``). A server with a reasoning parser answers the
    thinking apart (``reasoning_content``, or ``reasoning`` in newer vLLM); it is kept on the message as
    ``reasoning_content``, the name chat templates read when the conversation is sent back.

    The connection pool belongs to the event loop of the first request (as every asyncio pool does).
    """

    def __init__(
        self,
        base_url: str,
        model: str | None = None,
        *,
        timeout_s: float = 600.0,
        connect_timeout_s: float = 10.0,
        max_retries: int = 4,
        backoff_s: float = 0.5,
        max_backoff_s: float = 20.0,
        max_connections: int = 256,
        api_key: str | None = None,
        send_top_k: bool = True,
        max_model_len: int | None = None,
    ):
        self.base_url = base_url.rstrip("/")
        self.max_model_len = max_model_len
        self._model = model
        self.max_retries = max_retries
        self.backoff_s = backoff_s
        self.max_backoff_s = max_backoff_s
        self.send_top_k = send_top_k
        self.max_connections = max_connections
        self._headers = {"Content-Type": "application/json"}
        if api_key:
            self._headers["Authorization"] = f"Bearer {api_key}"
        self._timeout = aiohttp.ClientTimeout(total=None, sock_connect=connect_timeout_s, sock_read=timeout_s)
        self._session: aiohttp.ClientSession | None = None
        self._model_lock: asyncio.Lock | None = None

    def _http(self) -> aiohttp.ClientSession:
        """The session, created on first use inside the running loop (aiohttp binds it there)."""
        if self._session is None or self._session.closed:
            connector = aiohttp.TCPConnector(
                limit=self.max_connections, limit_per_host=0, keepalive_timeout=KEEPALIVE_S
            )
            self._session = aiohttp.ClientSession(connector=connector, headers=self._headers, timeout=self._timeout)
        return self._session

    @property
    def model(self) -> str:  # type: ignore[override]  # a plain attribute in the base; here resolved from /models
        return self._model or "unknown"

    async def aclose(self) -> None:
        session, self._session = self._session, None
        if session is not None:
            await session.close()

    async def resolve_model(self) -> str:
        """The served model name: the one given, else the first of ``/v1/models``."""
        self._model_lock = self._model_lock or asyncio.Lock()
        async with self._model_lock:
            if self._model is None:
                body = await self._request("GET", "/models", None)
                try:
                    self._model = body["data"][0]["id"]
                except (KeyError, IndexError, TypeError) as exc:
                    raise InferenceError(f"{self.base_url}/models lists no model; pass the model name") from exc
            return self._model

    def request_body(
        self, messages: list[dict[str, Any]], sampling: SamplingParams, n: int, tools: list[dict[str, Any]] | None
    ) -> dict[str, Any]:
        body: dict[str, Any] = {
            "model": self._model,
            "messages": messages,
            "n": n,
            "temperature": sampling.temperature,
            "top_p": sampling.top_p,
            "max_tokens": sampling.max_tokens,
        }
        if self.send_top_k and sampling.top_k > 0:
            body["top_k"] = sampling.top_k
        if sampling.seed is not None:
            body["seed"] = sampling.seed
        if sampling.stop:
            body["stop"] = list(sampling.stop)
        if tools:
            body["tools"] = tools
        if sampling.chat_template_kwargs:
            body["chat_template_kwargs"] = sampling.template_kwargs
        return body

    async def chat(
        self,
        messages: list[dict[str, Any]],
        sampling: SamplingParams,
        n: int = 1,
        tools: list[dict[str, Any]] | None = None,
    ) -> ChatResult:
        if self._model is None:
            await self.resolve_model()
        started = time.perf_counter()
        body = await self._request("POST", "/chat/completions", self.request_body(messages, sampling, n, tools))
        return parse_response(body, time.perf_counter() - started)

    async def _request(self, method: str, path: str, body: dict[str, Any] | None) -> Any:
        url = self.base_url + path
        content = None if body is None else json.dumps(body).encode("utf-8")
        attempt = 0
        while True:
            try:
                async with self._http().request(method, url, data=content) as response:
                    status, raw = response.status, await response.read()
            except (aiohttp.ClientError, TimeoutError) as exc:
                problem = _problem(exc)
            else:
                if status < 400:
                    try:
                        return json.loads(raw)
                    except json.JSONDecodeError as exc:
                        raise InferenceError(f"{url}: the answer is not JSON ({exc})") from exc
                if status == 401:  # never retried, and the key itself is never part of a message
                    raise InferenceError(
                        f"{url}: HTTP 401: {_server_message(raw)}; the server wants its API key "
                        "($WHALE_INFERENCE_API_KEY in the run's pods, from the run's auth Secret)"
                    )
                if status not in RETRY_STATUSES:
                    raise InferenceError(f"{url}: HTTP {status}: {_server_message(raw)}")
                problem = f"HTTP {status}: {_server_message(raw)}"
            if attempt >= self.max_retries:
                raise InferenceError(f"{url}: gave up after {attempt + 1} attempts; last: {problem}")
            delay = min(self.max_backoff_s, self.backoff_s * 2**attempt) * (0.5 + random.random() / 2)
            log.warning("inference %s failed (%s); retry %d in %.2f s", url, problem, attempt + 1, delay)
            attempt += 1
            await asyncio.sleep(delay)


def _problem(exc: BaseException) -> str:
    """A transport failure in one line, its kind named the same whatever the HTTP library calls it."""
    if isinstance(exc, aiohttp.ClientConnectorError):
        kind = "ConnectError"
    elif isinstance(exc, TimeoutError):
        kind = "ConnectTimeout" if isinstance(exc, aiohttp.ConnectionTimeoutError) else "ReadTimeout"
    elif isinstance(exc, aiohttp.ServerDisconnectedError):
        kind = "ServerDisconnected"
    else:
        kind = type(exc).__name__
    return f"{kind}: {exc}"


def _server_message(raw: bytes) -> str:
    try:
        body = json.loads(raw)
        error = body.get("error") if isinstance(body, dict) else None
        if isinstance(error, dict):
            return str(error.get("message", error))[:500]
        if isinstance(body, dict) and "detail" in body:
            return str(body["detail"])[:500]
    except ValueError:
        pass
    return raw.decode("utf-8", "replace")[:500]


def parse_response(body: dict[str, Any], latency_s: float) -> ChatResult:
    """An OpenAI chat-completions response → :class:`ChatResult`. Usage comes from ``usage``."""
    try:
        choices = sorted(body["choices"], key=lambda c: c.get("index", 0))
    except (KeyError, TypeError) as exc:
        raise InferenceError(f"malformed chat-completions answer (no choices): {str(body)[:300]}") from exc
    usage = body.get("usage") or {}
    completions = []
    for choice in choices:
        raw = choice.get("message") or {}
        message: dict[str, Any] = {"role": "assistant", "content": raw.get("content") or ""}
        if raw.get("tool_calls"):
            message["tool_calls"] = raw["tool_calls"]
        reasoning = raw.get("reasoning_content") or raw.get("reasoning")
        if reasoning:
            message["reasoning_content"] = reasoning
        completions.append(
            Completion(
                message=message,
                finish_reason=choice.get("finish_reason") or "stop",
                completion_tokens=0,
                token_ids=choice.get("token_ids"),
            )
        )
    completion_tokens = int(usage.get("completion_tokens") or 0)
    lengths = [len(c.token_ids) if c.token_ids is not None else -1 for c in completions]
    if completions and min(lengths) >= 0 and sum(lengths) == completion_tokens:
        # each choice's own token ids (vLLM's return_token_ids, the in-process server's), adding up to the usage
        for completion, length in zip(completions, lengths, strict=True):
            completion.completion_tokens = length
    else:
        # usage is per request; spread it over the completions (exact for n=1)
        for i, completion in enumerate(completions):
            share = completion_tokens // len(completions)
            completion.completion_tokens = share + (1 if i < completion_tokens % len(completions) else 0)
    return ChatResult(completions, int(usage.get("prompt_tokens") or 0), completion_tokens, latency_s)
