"""HTTP clients of the tool services, with the same call shapes as the in-process tools.

``RetrieverClient.search`` mirrors ``whale.tools.retrieval_index.Retriever.search``; ``CodeClient.run`` mirrors
``whale.tools.code.LocalCodeRunner.run``. Environments pick one from the deployment's settings
(:func:`retriever_from_env`, :func:`code_runner_from_env`). Transport failures and 5xx answers are
retried briefly, then raised as :class:`ToolServiceError` naming the URL (:mod:`whale.tools.service_call`, the
rule the proposer's prototyping kit follows too).
"""

from __future__ import annotations

import functools
import os
import time
from collections.abc import Callable
from pathlib import Path

import httpx

from whale.tools.code import CodeResult
from whale.tools.retrieval_index import Hit
from whale.tools.service_call import CODE_SERVICE_FAILED, ToolServiceError, TransportFailure, post_json

#: environment variables naming the deployed services (set on the cluster's workload pods)
RETRIEVER_URL_ENV = "WHALE_RETRIEVER_URL"
CODE_URL_ENV = "WHALE_CODE_URL"
#: a prepared dense index to serve in-process (no service): ``whale.tools.prepare_index`` output
SEARCH_INDEX_ENV = "WHALE_SEARCH_INDEX"
#: how long an environment waits for the deployed retriever to answer its first health check
READY_WAIT_ENV = "WHALE_RETRIEVER_WAIT_S"
READY_WAIT_S = 1800.0


def _post(client: httpx.Client, url: str, payload: dict) -> dict:
    def send(url: str, payload: dict) -> tuple[int, str]:
        try:
            resp = client.post(url, json=payload)
        except httpx.TransportError as exc:
            raise TransportFailure(str(exc) or type(exc).__name__) from exc
        return resp.status_code, resp.text

    return post_json(send, url, payload)


class RetrieverClient:
    """Client of ``python -m whale.tools.retriever_service`` (or of Search-R1's ``retrieval_server.py``)."""

    def __init__(self, base_url: str, timeout_s: float = 30.0):
        self.base_url = base_url.rstrip("/")
        self.url = self.base_url + "/retrieve"
        self._client = httpx.Client(timeout=timeout_s)

    def wait_ready(
        self,
        deadline_s: float = READY_WAIT_S,
        poll_s: float = 2.0,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> dict:
        """Poll ``/healthz`` until the service answers (a cluster's retriever loads a large index first);
        :class:`ToolServiceError` naming the URL when it does not within ``deadline_s``."""
        end = clock() + deadline_s
        last = "no answer"
        while True:
            try:
                resp = self._client.get(self.base_url + "/healthz")
                if resp.status_code == 200:
                    return resp.json()
                last = f"{resp.status_code}: {resp.text[:200]}"
            except httpx.TransportError as exc:
                last = str(exc) or type(exc).__name__
            if clock() >= end:
                raise ToolServiceError(
                    f"{self.base_url} not ready within {deadline_s:.0f} s ({last}); is the retriever service running?"
                )
            sleep(poll_s)

    @functools.cached_property
    def cuts_tokens(self) -> bool:
        """Whether the service cuts passages in the policy's tokens (it was started with ``--tokenizer``)."""
        try:
            about = self._client.get(self.base_url + "/healthz").json()
        except (httpx.HTTPError, ValueError):
            return False
        return isinstance(about, dict) and bool(about.get("tokenizer"))

    def search(self, queries: list[str], topk: int, max_doc_tokens: int | None = None) -> list[list[Hit]]:
        """Top ``topk`` hits per query; ``max_doc_tokens``: the service cuts each to that many tokens."""
        payload: dict = {"queries": list(queries), "topk": int(topk), "return_scores": True}
        if max_doc_tokens is not None:
            payload["max_doc_tokens"] = int(max_doc_tokens)
        data = _post(self._client, self.url, payload)
        return [[Hit.from_wire(h) for h in row] for row in data["result"]]

    def close(self) -> None:
        self._client.close()


class CodeClient:
    """Client of ``python -m whale.tools.code_interpreter``."""

    def __init__(self, base_url: str, timeout_s: float = 30.0):
        self.url = base_url.rstrip("/") + "/run"
        self.timeout_s = timeout_s
        # the service may queue a run behind others: allow for the run itself plus waiting
        self._client = httpx.Client(timeout=httpx.Timeout(timeout_s * 4 + 30, connect=10))

    def run(self, code: str, timeout_s: float | None = None) -> CodeResult:
        payload: dict = {"code": code}
        if timeout_s is not None:
            payload["timeout_s"] = timeout_s
        try:
            return CodeResult.from_dict(_post(self._client, self.url, payload))
        except ToolServiceError as exc:
            return CodeResult("service_error", "", f"{CODE_SERVICE_FAILED}{exc}", 0.0)

    def close(self) -> None:
        self._client.close()


def retriever_from_env(corpus: Path | None, method: str = "bm25"):
    """The deployed retriever when ``$WHALE_RETRIEVER_URL`` is set (after its first health check answers,
    within ``$WHALE_RETRIEVER_WAIT_S``); else a prepared dense index named by ``$WHALE_SEARCH_INDEX``;
    else an in-process ``method`` index over ``corpus``."""
    url = os.environ.get(RETRIEVER_URL_ENV)
    if url:
        client = RetrieverClient(url)
        client.wait_ready(float(os.environ.get(READY_WAIT_ENV, READY_WAIT_S)))
        return client
    from whale.tools import retrieval_index

    index = os.environ.get(SEARCH_INDEX_ENV)
    if index:
        return retrieval_index.shared_index(Path(index))
    if corpus is None:
        raise retrieval_index.RetrieverError(
            f"no retriever for this corpus (spec.experiment.domainOptions.corpus wiki18 has no in-process "
            f"index): set ${RETRIEVER_URL_ENV} (a retriever service) or "
            f"${SEARCH_INDEX_ENV} (a prepared index)"
        )
    return retrieval_index.shared(corpus, method)


def code_runner_from_env(isolation=None):
    """The deployed interpreter when ``$WHALE_CODE_URL`` is set (its pod is the wall), else local
    sandboxes with ``isolation`` (a ``whale.sandbox.Isolation``; None = the sandbox's default)."""
    url = os.environ.get(CODE_URL_ENV)
    if url:
        return CodeClient(url)
    from whale.tools.code import LocalCodeRunner

    return LocalCodeRunner(isolation=isolation)
