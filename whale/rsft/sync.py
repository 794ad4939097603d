"""Weight sync: make the weights SFT just produced the ones the next step samples from.

Two implementations behind one interface:

* :class:`SharedModelSync` — the in-process transformers backend samples from the very model
  object the trainer updates, so there is nothing to move (CPU runs, tests).
* :class:`VLLMReloadSync` — a vLLM OpenAI-compatible server that stays up across steps. The new
  weights are written as an HF checkpoint to a folder the server can read (a volume shared by the
  train Job and the vLLM pod), then the server is told, through its dev-mode control endpoints
  (``VLLM_SERVER_DEV_MODE=1``), to point its load config at that folder and reload in place::

      POST /collective_rpc {"method": "update_config", "args": [{"model_config": {"model": DIR}}]}
      POST /collective_rpc {"method": "reload_weights"}
      POST /reset_prefix_cache          (cached KV blocks were computed with the old weights)

  Why this path and not vLLM's NCCL/IPC weight-transfer engine (``/init_weight_transfer_engine`` +
  ``/update_weights``): it needs no process group between the train Job and the inference pod
  (different pods, possibly different nodes and GPU counts, and a preempted train pod would leave
  a dangling communicator), it works with the vLLM image the spec pins (v0.11: ``update_config``
  and ``reload_weights`` are worker methods there; the transfer engine is newer), and its cost is
  one safetensors write plus one read of the model per RSFT step, a few seconds for a 2-4B model
  (benchmarks/sft_throughput.py measures the save), against minutes of sampling per step. Two
  folders are used alternately, so the server never reads a folder being written.
"""

from __future__ import annotations

import logging
import shutil
import time
from pathlib import Path
from typing import Any, Protocol

import httpx

log = logging.getLogger(__name__)


class WeightSyncError(RuntimeError):
    """The inference server did not take the new weights; the message says what to check."""


class WeightSync(Protocol):
    def sync(self, model: Any, tokenizer: Any, step: int) -> float:
        """Publish the weights after global step ``step``; returns the seconds it took."""


class SharedModelSync:
    """The sampler holds the trainer's model object: nothing to do."""

    def sync(self, model: Any, tokenizer: Any, step: int) -> float:
        return 0.0


class VLLMReloadSync:
    """Reload-from-folder weight sync for a long-lived vLLM server (see the module doc).

    ``local_dir`` is where this process writes; ``server_dir`` is the same folder as the server
    sees it (a shared volume may be mounted at different paths)."""

    def __init__(
        self,
        base_url: str,
        local_dir: Path,
        server_dir: str | None = None,
        *,
        timeout_s: float = 600.0,
        client: httpx.Client | None = None,
    ):
        root = base_url.rstrip("/")
        self.base_url = root[: -len("/v1")] if root.endswith("/v1") else root
        self.local_dir = Path(local_dir)
        self.server_dir = server_dir or str(self.local_dir)
        self.timeout_s = timeout_s
        self.client = client or httpx.Client(timeout=timeout_s)

    def close(self) -> None:
        self.client.close()

    def _slot(self, step: int) -> str:
        return f"slot-{step % 2}"

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

    def sync(self, model: Any, tokenizer: Any, step: int) -> float:
        start = time.perf_counter()
        slot = self._slot(step)
        folder = self.local_dir / slot
        if folder.exists():
            shutil.rmtree(folder)
        folder.mkdir(parents=True)
        model.save_pretrained(folder, safe_serialization=True)
        tokenizer.save_pretrained(folder)
        server_path = f"{self.server_dir.rstrip('/')}/{slot}"
        self._post("/collective_rpc", {"method": "update_config", "args": [{"model_config": {"model": server_path}}]})
        self._post("/collective_rpc", {"method": "reload_weights", "timeout": self.timeout_s})
        self._post("/reset_prefix_cache")
        seconds = time.perf_counter() - start
        log.info("weights of step %d reloaded by %s from %s in %.1f s", step, self.base_url, server_path, seconds)
        return seconds
