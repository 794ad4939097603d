"""The proposer APIs' one POST-with-retries (whale.metaharness.proposer.http): what is retried, what fails at
once and what the error says. The remote API is httpx's MockTransport (a double: no real API is reachable)."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import httpx
import pytest

from whale.metaharness.proposer.base import ProposerError
from whale.metaharness.proposer.http import Endpoint, post_json

ENDPOINT = Endpoint(
    name="proposer endpoint http://api.test/v1",
    address="http://api.test/v1",
    needs="choices",
    valid=lambda data: bool(data.get("choices")),
    retryable=lambda status: status >= 500 or status == 429,
    hints={401: " (check the API key Secret)"},
)


def skip_sleeps(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """The back-off's sleeps, recorded and skipped: ``asyncio.sleep`` is replaced in the asyncio module itself (the
    client calls it through it), so a call from another thread (a session fixture's server running its own event
    loop, the API emulator's, say) goes to the real one and is not recorded."""
    slept: list[float] = []
    real = asyncio.sleep
    here = threading.get_ident()

    async def sleep(seconds: float, *args: Any, **kwargs: Any) -> Any:
        if threading.get_ident() != here:
            return await real(seconds, *args, **kwargs)
        slept.append(seconds)
        return args[0] if args else kwargs.get("result")

    monkeypatch.setattr("whale.metaharness.proposer.http.asyncio.sleep", sleep)
    return slept


def answers(*responses: httpx.Response | Exception) -> tuple[httpx.AsyncClient, list[int]]:
    calls: list[int] = []

    def handle(request: httpx.Request) -> httpx.Response:
        calls.append(1)
        answer = responses[min(len(calls), len(responses)) - 1]
        if isinstance(answer, Exception):
            raise answer
        return answer

    return httpx.AsyncClient(base_url="http://api.test/v1", transport=httpx.MockTransport(handle)), calls


async def call(client: httpx.AsyncClient, retries: int = 2) -> dict:
    async with client:
        return await post_json(client, "/chat/completions", {"x": 1}, ENDPOINT, timeout_s=5, retries=retries)


async def test_a_retryable_status_is_tried_again_then_the_answer_returned(monkeypatch: pytest.MonkeyPatch) -> None:
    slept = skip_sleeps(monkeypatch)
    client, calls = answers(httpx.Response(503, text="busy"), httpx.Response(200, json={"choices": [{}]}))
    assert await call(client) == {"choices": [{}]}
    assert (len(calls), slept) == (2, [0.5])


@pytest.mark.parametrize(
    ("response", "message"),
    [
        (httpx.Response(401, text="no"), r"HTTP 401 from http://api.test/v1: no \(check the API key Secret\)"),
        (httpx.Response(200, text="<html>"), "proposer endpoint http://api.test/v1 answered non-JSON: '<html>'"),
        (httpx.Response(200, json={"id": 1}), "answered without choices"),
    ],
)
async def test_a_refusal_or_a_bad_answer_fails_at_once(response: httpx.Response, message: str) -> None:
    client, calls = answers(response)
    with pytest.raises(ProposerError, match=message):
        await call(client)
    assert len(calls) == 1


async def test_an_unreachable_endpoint_fails_after_every_attempt(monkeypatch: pytest.MonkeyPatch) -> None:
    skip_sleeps(monkeypatch)
    client, calls = answers(httpx.ConnectError("refused"))
    with pytest.raises(ProposerError, match="failed after 3 attempts: cannot reach http://api.test/v1: refused"):
        await call(client)
    assert len(calls) == 3
