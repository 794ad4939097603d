"""The proposer APIs' one HTTP call: POST a JSON body, retry what is worth retrying, raise a
:class:`ProposerError` that says where and why. The OpenAI-compatible and the Messages API backends
differ only in what an :class:`Endpoint` says about them."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import httpx

from whale.metaharness.proposer.base import ProposerError


@dataclass(frozen=True)
class Endpoint:
    """What one API's answers look like and which failures are worth another attempt."""

    #: how messages name it ("proposer endpoint http://host/v1", "the Messages API at https://...")
    name: str
    #: the address in "cannot reach ..." and "HTTP 503 from ..."
    address: str
    #: what a good answer holds (named in the error when it does not)
    needs: str
    #: a good answer's check
    valid: Callable[[dict[str, Any]], bool]
    #: the HTTP statuses (>= 400) that are retried; any other fails at once
    retryable: Callable[[int], bool]
    #: the error text of a failed answer
    error_text: Callable[[httpx.Response], str] = lambda resp: resp.text[:300]
    #: advice appended to a failure that is not retried, by status
    hints: Mapping[int, str] = field(default_factory=dict)


async def post_json(
    http: httpx.AsyncClient, path: str, body: dict[str, Any], endpoint: Endpoint, *, timeout_s: float, retries: int
) -> dict[str, Any]:
    """The answer's JSON; transport errors and retryable statuses are tried ``retries`` more times with
    exponential backoff (0.5 s, 1 s, ...); a timeout is final (the phase's clock is already spent)."""
    last = "no attempt"
    for attempt in range(retries + 1):
        try:
            resp = await http.post(path, json=body, timeout=max(timeout_s, 1.0))
        except httpx.TimeoutException:
            raise ProposerError(f"{endpoint.name} did not answer within {timeout_s:.0f} s") from None
        except httpx.TransportError as exc:
            last = f"cannot reach {endpoint.address}: {exc}"
        else:
            if resp.status_code < 400:
                try:
                    data = resp.json()
                except ValueError:
                    raise ProposerError(f"{endpoint.name} answered non-JSON: {resp.text[:200]!r}") from None
                if not isinstance(data, dict) or not endpoint.valid(data):
                    raise ProposerError(f"{endpoint.name} answered without {endpoint.needs}: {str(data)[:200]}")
                return data
            last = f"HTTP {resp.status_code} from {endpoint.address}: {endpoint.error_text(resp)}"
            if not endpoint.retryable(resp.status_code):
                raise ProposerError(last + endpoint.hints.get(resp.status_code, ""))
        if attempt < retries:
            await asyncio.sleep(0.5 * 2**attempt)
    raise ProposerError(f"proposer request failed after {retries + 1} attempts: {last}")
