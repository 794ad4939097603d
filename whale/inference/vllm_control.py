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

A server colocated with the trainer (``inference.placement: colocated``, started with
``--enable-sleep-mode``) is also put to sleep during each SFT update and woken before the next
generation, through the dev-mode sleep endpoints (vLLM docs, "Sleep Mode")::

    POST /sleep?level=1|2             (1: weights to host memory, KV cache dropped; 2: both dropped)
    POST /wake_up[?tags=weights|kv_cache]
    GET  /is_sleeping                 -> {"is_sleeping": bool}

With ``inference.weightSync: cudaIpc`` (``whale.rsft.sync.VLLMIpcSync``) the weights come through vLLM's
weight-transfer API instead of a folder (server started with ``--weight-transfer-config '{"backend": "ipc"}'``)::

    POST /start_weight_update {"is_checkpoint_format": true}
    POST /update_weights {"update_info": {names, dtype_names, shapes, ipc_handles_pickled}}   (per chunk)
    POST /finish_weight_update
    POST /reset_prefix_cache
"""

from __future__ import annotations

import importlib.util
import logging
import os
import time
from collections.abc import Sequence
from typing import Any

import httpx

log = logging.getLogger(__name__)


#: the run's shared secret with its vLLM server (``vllm serve --api-key``; the operator sets both from the run's
#: auth Secret). Sent as ``Authorization: Bearer`` on every request, never logged.
API_KEY_ENV = "WHALE_INFERENCE_API_KEY"


def api_key_from_env(environ: dict[str, str] | None = None) -> str | None:
    """The run's vLLM API key from ``$WHALE_INFERENCE_API_KEY`` (None: the server wants none, as in `whale run`)."""
    env = os.environ if environ is None else environ
    return env.get(API_KEY_ENV) or None


def auth_headers(api_key: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


#: what a vLLM server needs to take weights over CUDA IPC (``inference.weightSync: cudaIpc``,
#: ``whale.rsft.sync.VLLMIpcSync``): its IPC weight-transfer engine, and leave to unpickle the handles (vLLM's
#: HTTP transport of them). The operator's colocated pod and the benchmarks start the server with both.
IPC_WEIGHT_TRANSFER_ARGS = ("--weight-transfer-config", '{"backend": "ipc"}')
IPC_WEIGHT_TRANSFER_ENV = {"VLLM_ALLOW_INSECURE_SERIALIZATION": "1"}


def linear_attention_kernel_args() -> tuple[str, ...]:
    """vLLM arguments that let a Qwen3.5 (gated delta-net) server run where FlashInfer is not installed.

    vLLM 0.24 picks FlashInfer's GDN prefill kernel on every Hopper GPU without checking that FlashInfer
    can be imported, and its engine then dies at the first prompt (``No module named 'flashinfer'``). vLLM
    requires FlashInfer and its images carry it; an install without it (the GPU bundle the tests and
    benchmarks carry, to fit a device call) asks for the Triton (fla) kernels instead.
    """
    if importlib.util.find_spec("flashinfer") is not None:
        return ()
    return ("--gdn-prefill-backend", "triton")


class WeightSyncError(RuntimeError):
    """The inference server did not take the new weights; the message says what to check."""


def control_root(base_url: str) -> str:
    """``http://host:port/v1`` -> ``http://host:port`` (the control endpoints are not under /v1)."""
    root = base_url.rstrip("/")
    return root[: -len("/v1")] if root.endswith("/v1") else root


class VLLMControl:
    """Reload-in-place requests to one vLLM server."""

    def __init__(
        self,
        base_url: str,
        *,
        timeout_s: float = 600.0,
        client: httpx.Client | None = None,
        api_key: str | None = None,
    ):
        """``api_key``: the server's ``--api-key``; None reads ``$WHALE_INFERENCE_API_KEY`` (set by the operator
        in the run's pods), so every caller authenticates without passing it through. vLLM checks the key only on
        /v1 (its security guide): sending it to the dev-mode endpoints too costs nothing and is right should a
        later vLLM check them."""
        self.base_url = control_root(base_url)
        self.timeout_s = timeout_s
        self.client = client or httpx.Client(timeout=timeout_s)
        self._headers = auth_headers(api_key if api_key is not None else api_key_from_env())
        self.legacy: bool | None = None  # None: not known yet; True: update_config + bare reload_weights

    def close(self) -> None:
        self.client.close()

    def _post(self, path: str, body: dict[str, Any] | None = None, params: dict[str, Any] | None = None) -> Any:
        url = f"{self.base_url}{path}"
        try:
            response = (
                self.client.post(url, json=body, params=params, headers=self._headers)
                if body is not None
                else self.client.post(url, params=params, headers=self._headers)
            )
        except httpx.HTTPError as exc:
            raise WeightSyncError(f"weight sync: cannot reach the inference server at {url}: {exc}") from exc
        if response.status_code == 404:
            needs = (
                "--enable-sleep-mode and VLLM_SERVER_DEV_MODE=1 so its /sleep and /wake_up"
                if path in ("/sleep", "/wake_up")
                else "VLLM_SERVER_DEV_MODE=1 so its /collective_rpc, /reset_prefix_cache and weight-transfer"
            )
            raise WeightSyncError(f"weight sync: {url} answered 404; start vLLM with {needs} endpoints exist")
        if response.status_code == 401:
            raise WeightSyncError(
                f"weight sync: {url} answered 401: the server wants its API key; set ${API_KEY_ENV} to the run's "
                "vllm-api-key (the operator does, from the run's auth Secret)"
            )
        if response.status_code >= 400:
            hint = ""
            if path in ("/start_weight_update", "/update_weights", "/finish_weight_update"):
                flags = " ".join(IPC_WEIGHT_TRANSFER_ARGS[:1] + (f"'{IPC_WEIGHT_TRANSFER_ARGS[1]}'",))
                env = " ".join(f"{k}={v}" for k, v in IPC_WEIGHT_TRANSFER_ENV.items())
                hint = (
                    f" (weightSync cudaIpc: start vLLM with {flags} and {env}, on the trainer's GPU, in its PID "
                    "namespace)"
                )
            raise WeightSyncError(f"weight sync: {url} answered {response.status_code}: {response.text[:500]}{hint}")
        return response.json() if response.content else None

    def healthy(self) -> bool:
        """``GET /health`` answers 200 (the server is up and serving what it loaded)."""
        try:
            return self.client.get(f"{self.base_url}/health", timeout=5.0, headers=self._headers).status_code == 200
        except httpx.HTTPError:
            return False

    def sleep(self, level: int) -> float:
        """Free the server's GPU memory for training (``--enable-sleep-mode``); returns the seconds taken."""
        if level not in (1, 2):
            raise ValueError(f"sleep level must be 1 or 2, got {level!r}")
        start = time.perf_counter()
        self._post("/sleep", params={"level": level})
        return time.perf_counter() - start

    def wake_up(self, tags: Sequence[str] = ()) -> float:
        """Give the server its GPU memory back: everything, or only ``tags`` (``weights``, ``kv_cache``)."""
        start = time.perf_counter()
        self._post("/wake_up", params={"tags": list(tags)} if tags else None)
        return time.perf_counter() - start

    def is_sleeping(self) -> bool:
        url = f"{self.base_url}/is_sleeping"
        try:
            response = self.client.get(url, timeout=10.0, headers=self._headers)
        except httpx.HTTPError as exc:
            raise WeightSyncError(f"cannot reach the inference server at {url}: {exc}") from exc
        if response.status_code != 200:
            raise WeightSyncError(
                f"{url} answered {response.status_code}; start vLLM with --enable-sleep-mode and VLLM_SERVER_DEV_MODE=1"
            )
        return bool(response.json().get("is_sleeping"))

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
        self.reset_prefix_cache()
        seconds = time.perf_counter() - start
        log.info("%s reloaded its weights from %s in %.1f s", self.base_url, folder, seconds)
        return seconds

    def start_weight_update(self) -> None:
        """Open a weight update through vLLM's weight-transfer API (checkpoint-format names: the model's own
        ``load_weights`` maps them, layer by layer)."""
        self._post("/start_weight_update", {"is_checkpoint_format": True})

    def update_weights(self, update_info: dict[str, Any]) -> None:
        """One chunk of the update: the server loads the tensors ``update_info`` describes before answering."""
        self._post("/update_weights", {"update_info": update_info})

    def finish_weight_update(self) -> None:
        self._post("/finish_weight_update", {})

    def reset_prefix_cache(self) -> None:
        """Drop the server's cached KV blocks (after a reload they were computed with the old weights)."""
        self._post("/reset_prefix_cache")

    def _legacy_reload(self, folder: str) -> None:
        self._post("/collective_rpc", {"method": "update_config", "args": [{"model_config": {"model": folder}}]})
        self._post("/collective_rpc", {"method": "reload_weights", "timeout": self.timeout_s})
