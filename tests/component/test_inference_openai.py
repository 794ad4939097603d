"""The OpenAI-compatible HTTP client against real servers on loopback: the in-process backend behind
``whale.inference.server`` (tiny random Qwen3) and a scripted failure double (5xx, 4xx, hangs)."""

from __future__ import annotations

import time
from typing import Any

import pytest

from tests.fixtures.guess_domain import GuessNumberDomainDouble
from tests.fixtures.servers import FailureServerDouble
from whale.harness.runner import run_episodes
from whale.inference.base import InferenceError, SamplingParams
from whale.inference.openai_http import OpenAIClient
from whale.inference.server import free_port

FAST_RETRIES: dict[str, Any] = {"max_retries": 3, "backoff_s": 0.01, "max_backoff_s": 0.02}


async def test_chat_against_the_tiny_model_server(tiny_model_server: str) -> None:
    async with OpenAIClient(tiny_model_server) as client:
        assert await client.resolve_model() == "tiny-qwen3"
        result = await client.chat([{"role": "user", "content": "Guess a number"}], SamplingParams(max_tokens=8), n=3)
    assert len(result.completions) == 3
    assert result.prompt_tokens > 0
    assert 3 <= result.completion_tokens <= 24
    assert sum(c.completion_tokens for c in result.completions) == result.completion_tokens
    assert all(c.finish_reason in ("stop", "length") for c in result.completions)
    assert all(len(c.token_ids or []) == c.completion_tokens for c in result.completions)


async def test_greedy_is_reproducible_over_http(tiny_model_server: str) -> None:
    messages = [{"role": "system", "content": "sys"}, {"role": "user", "content": "hello"}]
    async with OpenAIClient(tiny_model_server, model="tiny-qwen3") as client:
        first = await client.chat(messages, SamplingParams(temperature=0.0, max_tokens=6))
        second = await client.chat(messages, SamplingParams(temperature=0.0, max_tokens=6))
    assert first.completions[0].message == second.completions[0].message


async def test_runtime_over_http_counts_tokens_from_usage(tiny_model_server: str) -> None:
    domain = GuessNumberDomainDouble()
    async with OpenAIClient(tiny_model_server) as client:
        episodes = await run_episodes(
            domain, domain.h0_path(), client, domain.items[:1], SamplingParams(max_tokens=4), k=2
        )
    assert len(episodes) == 2
    for episode in episodes:
        assert episode.end in ("harness_done", "max_turns", "env_done"), episode.error
        assert episode.turns >= 1 and episode.prompt_tokens > 0 and episode.completion_tokens > 0
        assert episode.model == "tiny-qwen3"


async def test_retries_5xx_then_succeeds(failures: FailureServerDouble) -> None:
    failures.reset([503, 500])
    async with OpenAIClient(failures.url, model="m", **FAST_RETRIES) as client:
        result = await client.chat([{"role": "user", "content": "q"}], SamplingParams(top_k=20), n=2)
    assert [c.message["content"] for c in result.completions] == ["reply 0", "reply 1"]
    assert len(failures.requests) == 3
    assert failures.requests[-1]["top_k"] == 20 and failures.requests[-1]["n"] == 2


async def test_4xx_is_permanent_and_names_the_server_message(failures: FailureServerDouble) -> None:
    failures.reset([400])
    async with OpenAIClient(failures.url, model="m", **FAST_RETRIES) as client:
        with pytest.raises(InferenceError, match="HTTP 400: scripted 400"):
            await client.chat([{"role": "user", "content": "q"}], SamplingParams())
    assert len(failures.requests) == 1


async def test_gives_up_after_the_retry_budget(failures: FailureServerDouble) -> None:
    failures.reset([502] * 10)
    async with OpenAIClient(failures.url, model="m", **FAST_RETRIES) as client:
        with pytest.raises(InferenceError, match="gave up after 4 attempts; last: HTTP 502"):
            await client.chat([{"role": "user", "content": "q"}], SamplingParams())
    assert len(failures.requests) == 4


async def test_read_timeout_is_retried(failures: FailureServerDouble) -> None:
    failures.hang_s = 1.0
    failures.reset(["hang"])
    started = time.perf_counter()
    async with OpenAIClient(failures.url, model="m", timeout_s=0.3, **FAST_RETRIES) as client:
        result = await client.chat([{"role": "user", "content": "q"}], SamplingParams())
    assert result.completions[0].message["content"] == "reply 0"
    assert len(failures.requests) == 2
    assert time.perf_counter() - started < 1.0


async def test_connection_refused_is_an_inference_error() -> None:
    async with OpenAIClient(f"http://127.0.0.1:{free_port()}/v1", model="m", **FAST_RETRIES) as client:
        with pytest.raises(InferenceError, match="gave up after 4 attempts; last: ConnectError"):
            await client.chat([{"role": "user", "content": "q"}], SamplingParams())


async def test_server_rejects_bad_requests_in_openai_shape(tiny_model_server: str) -> None:
    async with OpenAIClient(tiny_model_server, model="tiny-qwen3", **FAST_RETRIES) as client:
        with pytest.raises(InferenceError, match="HTTP 400: invalid request"):
            await client.chat([], SamplingParams())
