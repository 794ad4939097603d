"""Weight sync: make the weights SFT just produced the ones the next step samples from.

Three implementations behind one interface:

* :class:`SharedModelSync` — the in-process transformers backend samples from the very model
  object the trainer updates, so there is nothing to move (CPU runs, tests).
* :class:`StoreSync` — a cluster: the vLLM pod runs beside, not with, the train Job. Each step's
  weights are uploaded to the object store (``layout.sync_step_prefix``, the last two kept), the
  serving target ``control/serving.json`` is pointed at them, and the trainer waits, with a
  deadline, for the vLLM pod's weight-sync sidecar (``whale.inference.weight_sync``) to download
  them, reload vLLM in place and acknowledge in ``control/served.json``. No shared volume, no
  process group between the pods; the same transport the operator uses between phases.
* :class:`VLLMReloadSync` — a vLLM server that can read a folder this process writes (a volume
  shared by the trainer and the server, or one machine): write the checkpoint, then reload.

Both vLLM paths reload through the dev-mode control endpoints (:mod:`whale.inference.vllm_control`).
Why reload-from-folder and not vLLM's NCCL/IPC weight-transfer engine (``/update_weights``): it needs
no process group between the train Job and the inference pod (different pods, possibly different
nodes and GPU counts, and a preempted train pod would leave a dangling communicator), it works with
the vLLM image the spec pins (v0.11: ``update_config`` and ``reload_weights`` are worker methods
there), and its cost is one safetensors write plus one read of the model per RSFT step, a few seconds
for a 2-4B model, against minutes of sampling per step. Two folders are used alternately, so the
server never reads a folder being written.
"""

from __future__ import annotations

import logging
import shutil
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any, Protocol

import httpx

from whale import layout
from whale.inference.vllm_control import VLLMControl, WeightSyncError

__all__ = ["SharedModelSync", "StoreSync", "VLLMReloadSync", "WeightSync", "WeightSyncError"]

log = logging.getLogger(__name__)

#: the marker written last under each sync folder
SYNC_MARKER = layout.CHECKPOINT_COMPLETE_MARKER


class WeightSync(Protocol):
    def sync(self, model: Any, tokenizer: Any, step: int) -> float:
        """Publish the weights after global step ``step``; returns the seconds it took."""


class SharedModelSync:
    """The sampler holds the trainer's model object: nothing to do."""

    def sync(self, model: Any, tokenizer: Any, step: int) -> float:
        return 0.0


class VLLMReloadSync:
    """Reload-from-folder weight sync for a long-lived vLLM server that sees this process's disk.

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
        self.control = VLLMControl(base_url, timeout_s=timeout_s, client=client)
        self.base_url = self.control.base_url
        self.local_dir = Path(local_dir)
        self.server_dir = server_dir or str(self.local_dir)

    def close(self) -> None:
        self.control.close()

    def sync(self, model: Any, tokenizer: Any, step: int) -> float:
        start = time.perf_counter()
        slot = f"slot-{step % 2}"
        folder = self.local_dir / slot
        if folder.exists():
            shutil.rmtree(folder)
        folder.mkdir(parents=True)
        model.save_pretrained(folder, safe_serialization=True)
        tokenizer.save_pretrained(folder)
        self.control.reload_from(f"{self.server_dir.rstrip('/')}/{slot}")
        return time.perf_counter() - start


class StoreSync:
    """Store-transported weight sync for a vLLM pod with the weight-sync sidecar (see the module doc).

    ``ack_timeout_s`` bounds the wait for the sidecar's acknowledgement of each step (download +
    reload: seconds to minutes for a few-GB model)."""

    def __init__(self, store: Any, run: str, *, ack_timeout_s: float = 900.0, poll_s: float = 0.5, keep: int = 2):
        self.store = store
        self.run = run
        self.ack_timeout_s = ack_timeout_s
        self.poll_s = poll_s
        self.keep = max(keep, 1)

    def serve(self, checkpoint: str | None) -> float:
        """Ask the inference server to serve ``checkpoint`` (a store prefix; None = the base model)
        and wait for its acknowledgement; returns the seconds waited."""
        start = time.perf_counter()
        version = uuid.uuid4().hex[:12]
        self.store.write_json(layout.serving_key(self.run), {"checkpoint": checkpoint, "version": version})
        self.wait_served(checkpoint, version)
        return time.perf_counter() - start

    def wait_served(self, checkpoint: str | None, version: str | None = None) -> dict[str, Any]:
        key = layout.served_key(self.run)
        deadline = time.monotonic() + self.ack_timeout_s
        last: Any = None
        while True:
            last = self.store.read_json_or_none(key)
            if isinstance(last, dict) and last.get("checkpoint") == checkpoint and (
                    version is None or last.get("version") == version):
                return last
            if time.monotonic() >= deadline:
                break
            time.sleep(self.poll_s)
        raise WeightSyncError(
            f"weight sync: the inference server did not acknowledge {checkpoint or 'the base model'} within "
            f"{self.ack_timeout_s:.0f} s ({self.store.uri_for(key)} says {last!r}); check that the vLLM pod "
            f"runs and read its weight-sync sidecar's log (kubectl logs deploy/{self.run}-vllm -c weight-sync)"
        )

    def sync(self, model: Any, tokenizer: Any, step: int) -> float:
        start = time.perf_counter()
        prefix = layout.sync_step_prefix(self.run, step)
        with tempfile.TemporaryDirectory(prefix="whale-sync-") as tmp:
            model.save_pretrained(tmp, safe_serialization=True)
            tokenizer.save_pretrained(tmp)
            Path(tmp, SYNC_MARKER).write_text(f"step {step}\n")
            self.store.upload_dir(Path(tmp), prefix, marker=SYNC_MARKER)
        self.serve(prefix)
        self.prune(keep_step=step)
        seconds = time.perf_counter() - start
        log.info("weights of step %d served from %s after %.1f s", step, self.store.uri_for(prefix), seconds)
        return seconds

    def prune(self, keep_step: int) -> None:
        """Delete all sync folders but the newest ``keep`` (the one just served included)."""
        steps = []
        for entry in self.store.list(layout.sync_prefix(self.run) + "/", recursive=False):
            step = layout.parse_checkpoint_step(entry.rstrip("/").rsplit("/", 1)[-1])
            if step is not None:
                steps.append(step)
        newest = sorted(s for s in steps if s <= keep_step)[-self.keep:]
        for step in steps:
            if step not in newest:
                self.store.delete_prefix(layout.sync_step_prefix(self.run, step))
