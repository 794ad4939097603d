"""A small client of vLLM's dev-mode control endpoints (``VLLM_SERVER_DEV_MODE=1``): reload the
weights of a running server from a folder, in place, without restarting it.

Used by both weight-sync paths: the RSFT trainer's shared-volume sync (``whale.rsft.sync``) and the
vLLM pod's weight-sync sidecar (``whale.inference.weight_sync``). The sequence (measured against
vLLM 0.24.0 on an H200: docs/performance.md)::

    POST /collective_rpc {"method": "reload_weights", "kwargs": {"weights_path": DIR}}
    POST /reset_prefix_cache          (cached KV blocks were computed with the old weights)

Older servers, whose ``reload_weights`` takes no folder, are pointed at it first with
``{"method": "update_config", "args": [{"model_config": {"model": DIR}}]}`` (the call vLLM 0.24
rejects); the client falls back to that once and remembers it.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import httpx

log = logging.getLogger(__name__)


class WeightSyncError(RuntimeError):
    """The inference server did not take the new weights; the message says what to check."""


def control_root(base_url: str) -> str:
    """``http://host:port/v1`` -> ``http://host:port`` (the control endpoints are not under /v1)."""
    root = base_url.rstrip("/")
    return root[: -len("/v1")] if root.endswith("/v1") else root


class VLLMControl:
    """Reload-in-place requests to one vLLM server."""

    def __init__(self, base_url: str, *, timeout_s: float = 600.0, client: httpx.Client | None = None):
        self.base_url = control_root(base_url)
        self.timeout_s = timeout_s
        self.client = client or httpx.Client(timeout=timeout_s)
        self.legacy: bool | None = None  # None: not known yet; True: update_config + bare reload_weights

    def close(self) -> None:
        self.client.close()

    def _post(self, path: str, body: dict[str, Any] | None = None) -> Any:
        url = f"{self.base_url}{path}"
        try:
            response = self.client.post(url, json=body) if body is not None else self.client.post(url)
        except httpx.HTTPError as exc:
            raise WeightSyncError(f"weight sync: cannot reach the inference server at {url}: {exc}") from exc
        if response.status_code == 404:
            raise WeightSyncError(
                f"weight sync: {url} answered 404; start vLLM with VLLM_SERVER_DEV_MODE=1 so its "
                "/collective_rpc and /reset_prefix_cache endpoints exist"
            )
        if response.status_code >= 400:
            raise WeightSyncError(f"weight sync: {url} answered {response.status_code}: {response.text[:500]}")
        return response.json() if response.content else None

    def healthy(self) -> bool:
        """``GET /health`` answers 200 (the server is up and serving what it loaded)."""
        try:
            return self.client.get(f"{self.base_url}/health", timeout=5.0).status_code == 200
        except httpx.HTTPError:
            return False

    def reload_from(self, folder: str) -> float:
        """Reload the server's weights from ``folder`` (a path the SERVER sees); returns the seconds taken."""
        start = time.perf_counter()
        if self.legacy:
            self._legacy_reload(folder)
        else:
            try:
                self._post(
                    "/collective_rpc",
                    {"method": "reload_weights", "kwargs": {"weights_path": folder}, "timeout": self.timeout_s},
                )
                self.legacy = False
            except WeightSyncError as first:
                if self.legacy is False or "answered 500" not in str(first):
                    raise
                try:  # an older server? (a 500 tells no more: its reload_weights takes no folder)
                    self._legacy_reload(folder)
                except WeightSyncError as second:
                    raise WeightSyncError(
                        f"{first}; the older protocol (update_config, then reload_weights) failed too: {second}"
                    ) from None
                log.info(
                    "%s: reload_weights takes no weights_path; pointing the server with update_config", self.base_url
                )
                self.legacy = True
        self._post("/reset_prefix_cache")
        seconds = time.perf_counter() - start
        log.info("%s reloaded its weights from %s in %.1f s", self.base_url, folder, seconds)
        return seconds

    def _legacy_reload(self, folder: str) -> None:
        self._post("/collective_rpc", {"method": "update_config", "args": [{"model_config": {"model": folder}}]})
        self._post("/collective_rpc", {"method": "reload_weights", "timeout": self.timeout_s})
