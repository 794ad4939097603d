"""Weight sync: make the weights SFT just produced the ones the next step samples from.

Four implementations behind one interface:

* :class:`SharedModelSync` — the in-process transformers backend samples from the very model
  object the trainer updates, so there is nothing to move (CPU runs, tests).
* :class:`StoreSync` — a cluster: the vLLM pod runs beside, not with, the train Job. Each step's
  weights are uploaded to the object store (``layout.sync_step_prefix``, the last two kept), the
  serving target ``control/serving.json`` is pointed at them, and the trainer waits, with a
  deadline, for the vLLM pod's weight-sync sidecar (``whale.inference.weight_sync``) to download
  them, reload vLLM in place and acknowledge in ``control/served.json``. No shared volume, no
  process group between the pods; the same transport the operator uses between phases.
* :class:`VLLMReloadSync` — a vLLM server that can read a folder this process writes (a volume
  shared by the trainer and the server, or one machine): write the checkpoint, then reload. Its two
  slot folders are written whole once; after that each step replaces only the weights file
  (:class:`ServingFolderWriter`: ``safetensors`` from a pinned host copy, renamed into place).
* :class:`VLLMIpcSync` — a vLLM server on the trainer's GPU (``inference.weightSync: cudaIpc``, colocated):
  no file at all; the server maps bf16 copies of the weights through CUDA IPC handles and loads them
  (vLLM's weight-transfer API, ``--weight-transfer-config '{"backend": "ipc"}'``).

The two folder paths reload through the dev-mode control endpoints (:mod:`whale.inference.vllm_control`)
and write the weights in the dtype the server computes in (bf16), not the trainer's fp32 master
copy: half the bytes, and the very numbers vLLM would have rounded them to.

Why reload-from-folder by default and not vLLM's NCCL/IPC weight-transfer engine (``/update_weights``): it
needs no process group between the train Job and the inference pod (different pods, possibly different
nodes and GPU counts, and a preempted train pod would leave a dangling communicator), and it is
cheap. CUDA IPC needs none either, only the same GPU, hence :class:`VLLMIpcSync` for the colocated pod. Measured on one H200 with vLLM 0.24.0 and a 1.5 B-parameter Qwen3 model
(``benchmarks/weight_sync_vllm.py``, docs/performance.md): 2.3 s per step for VLLMReloadSync (bf16
write + a 0.4-0.7 s reload), 5-8.6 s writing fp32, 5.7-9.5 s through the store and the sidecar,
against 46-110 s to restart the server and minutes of sampling per RSFT step; decoding speed is
unchanged after reloads (CUDA graphs keep pointing at the live parameters). Two folders are used alternately,
so the server never reads a folder being written.
"""

from __future__ import annotations

import base64
import json
import logging
import os
import pickle
import shutil
import tempfile
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any, Protocol

import httpx
import torch
from safetensors.torch import save_file

from whale.core import layout
from whale.inference.vllm_control import VLLMControl, WeightSyncError
from whale.rsft.checkpoint_writer import HostSnapshot, TensorIdentity, tensor_identity

__all__ = [
    "ServingFolderWriter",
    "SharedModelSync",
    "StoreSync",
    "VLLMIpcSync",
    "VLLMReloadSync",
    "WeightSync",
    "WeightSyncError",
    "ipc_chunks",
    "ipc_update_info",
    "save_for_serving",
    "saved_names",
    "serving_state",
]

log = logging.getLogger(__name__)

#: the marker written last under each sync folder
SYNC_MARKER = layout.CHECKPOINT_COMPLETE_MARKER
#: the weights file (or, sharded, the index's stem) ``save_pretrained`` writes with safe serialisation
SAFE_WEIGHTS_NAME = "model.safetensors"


def serving_state(
    model: Any, dtype: torch.dtype | None = torch.bfloat16, host: HostSnapshot | None = None
) -> dict[str, torch.Tensor]:
    """``model``'s state dict in ``dtype`` (None: as it is). Tensors shared in the model (tied
    embeddings) stay shared. With ``host``, tensors on a device are copied into its host buffers
    (pinned and reused across calls on a GPU; one synchronize); tensors on the CPU are not copied."""
    cast: dict[TensorIdentity, torch.Tensor] = {}
    state: dict[str, torch.Tensor] = {}
    for name, tensor in model.state_dict().items():
        key = tensor_identity(tensor)
        if key not in cast:
            cast[key] = _in_serving_dtype(tensor, dtype)
        state[name] = cast[key]
    if host is not None and any(t.device.type != "cpu" for t in state.values()):
        state = host.copy(state)
    return state


def saved_names(model: Any, names: Iterable[str]) -> dict[str, str]:
    """Each state-dict name of ``model`` -> the name ``save_pretrained`` writes it under, which is the name the
    server loaded. transformers renames some checkpoints' tensors on load and back on save (Qwen3.5's language
    model is ``model.language_model.*`` in the hub's multimodal checkpoint, ``model.*`` in
    ``Qwen3_5ForCausalLM``): a sync in the loaded names would address no parameter of the server's model. A
    model whose saving does more than rename (fused tensors split) keeps its names; its folder is then always
    written whole by ``save_pretrained``."""
    names = list(names)
    try:
        from transformers.core_model_loading import revert_weight_conversion
    except ImportError:  # a transformers without weight conversions saves under the loaded names
        return {n: n for n in names}
    probes = {name: torch.empty(0) for name in names}  # one object per name: renamings only re-key them
    try:
        reverted = revert_weight_conversion(model, dict(probes))
    except Exception:  # noqa: BLE001 - a converter that needs the real tensors: not a plain renaming
        return {n: n for n in names}
    by_probe = {id(t): saved for saved, t in reverted.items()}
    if len(reverted) != len(names) or any(id(t) not in by_probe for t in probes.values()):
        return {n: n for n in names}
    return {name: by_probe[id(t)] for name, t in probes.items()}


def _in_serving_dtype(tensor: torch.Tensor, dtype: torch.dtype | None) -> torch.Tensor:
    """A floating-point tensor cast to ``dtype`` (None: as it is); integer buffers stay as they are."""
    src = tensor.detach()
    return src.to(dtype) if dtype is not None and src.is_floating_point() else src


def save_for_serving(
    model: Any,
    tokenizer: Any,
    folder: Path,
    dtype: torch.dtype | None = torch.bfloat16,
    *,
    state: dict[str, torch.Tensor] | None = None,
) -> None:
    """An HF checkpoint of ``model`` in ``dtype`` (None: as it is) for the inference server to load,
    written whole by ``save_pretrained`` (weights, config, generation config, tokenizer). Tensors shared
    in the model (tied embeddings) stay shared, so they are written once. ``state``: the state dict
    to write (:func:`serving_state`), when the caller has it already."""
    if state is None and dtype is not None:
        state = serving_state(model, dtype)
    # a copy of the dict: save_pretrained empties the one it is given as it writes
    model.save_pretrained(folder, safe_serialization=True, state_dict=None if state is None else dict(state))
    tokenizer.save_pretrained(folder)
    if dtype is not None:  # the config says what the tensors are
        config_path = Path(folder) / "config.json"
        config = json.loads(config_path.read_text())
        for field in ("torch_dtype", "dtype"):
            if field in config:
                config[field] = str(dtype).removeprefix("torch.")
        config_path.write_text(json.dumps(config, indent=2))


def _weight_files(folder: Path) -> dict[str, tuple[list[str], dict[str, str] | None]]:
    """The safetensors files of an HF folder: file name -> (tensor names, metadata), as written."""
    from safetensors import safe_open

    index = folder / f"{SAFE_WEIGHTS_NAME}.index.json"
    if index.is_file():
        names = sorted(set(json.loads(index.read_text())["weight_map"].values()))
    else:
        names = [SAFE_WEIGHTS_NAME]
    files = {}
    for name in names:
        with safe_open(str(folder / name), "pt") as f:
            files[name] = (list(f.keys()), f.metadata())
    return files


class ServingFolderWriter:
    """Writes the serving checkpoint of each step into reused folders, faster than :func:`save_for_serving`.

    The first write into a folder (per writer) is :func:`save_for_serving`'s, whole: weights, config
    with the serving dtype, generation config, tokenizer. The writer remembers the safetensors files
    ``save_pretrained`` produced there (names, the tensors in each, their metadata: tied tensors written
    once under the name it kept). Each later write into that folder replaces only those files with
    ``safetensors.torch.save_file`` of the same tensor names; config and tokenizer files are left as they
    are. The cast weights are copied off the GPU into host buffers pinned and reused across writes
    (:class:`~whale.rsft.checkpoint_writer.HostSnapshot`); on the CPU they are only cast.

    A weights file is deleted first (the old writer deleted the whole folder first), then written under a
    temporary name (no ``*.safetensors`` match) and renamed to its own name once complete: a reader finds
    it absent or whole, never part of it. The server is serving the other slot meanwhile and holds its
    weights in memory. Measured (benchmarks/sync_write.py, ext4): writing the new file beside the old one
    and renaming it over the old made the write 2.2x slower than ``save_pretrained`` into an emptied
    folder, deleting first made it faster; docs/performance.md.

    A folder found missing or incomplete (a failed write) is written whole again. Tensors are written under
    the names ``save_pretrained`` gives them (:func:`saved_names`: Qwen3.5's language model is renamed back into
    the hub's ``model.language_model``); a model whose saving does more than rename is always written whole."""

    def __init__(self, dtype: torch.dtype | None = torch.bfloat16, *, pin: bool | None = None):
        self.dtype = dtype
        self.host = HostSnapshot(pin=pin)
        self._files: dict[Path, dict[str, tuple[list[str], dict[str, str] | None]]] = {}
        self._whole_only = False
        #: state-dict name -> saved name (:func:`saved_names`), found at the first whole write: the model's names
        #: do not change between steps, so the per-step write does not ask transformers again
        self._names: dict[str, str] = {}

    def write(self, model: Any, tokenizer: Any, folder: Path) -> str:
        """Write ``model``'s serving checkpoint into ``folder``; returns ``"whole"`` or ``"weights"``."""
        folder = Path(folder)
        state = serving_state(model, self.dtype, self.host)
        files = self._files.get(folder)
        if (
            files is None
            or self._whole_only
            or not (folder / "config.json").is_file()
            or not all((folder / name).is_file() for name in files)
        ):
            self._write_whole(model, tokenizer, folder, state)
            return "whole"
        state = {self._names[k]: t for k, t in state.items()}
        for name, (keys, metadata) in files.items():
            final, tmp = folder / name, folder / f".{name}.{uuid.uuid4().hex[:8]}.tmp"
            final.unlink(missing_ok=True)  # first: see the class doc
            try:
                save_file({k: state[k].contiguous() for k in keys}, str(tmp), metadata=metadata)
                os.replace(tmp, final)
            except BaseException:
                tmp.unlink(missing_ok=True)
                raise
        return "weights"

    def _write_whole(self, model: Any, tokenizer: Any, folder: Path, state: dict[str, torch.Tensor]) -> None:
        self._files.pop(folder, None)
        if folder.exists():
            shutil.rmtree(folder)
        folder.mkdir(parents=True)
        save_for_serving(model, tokenizer, folder, self.dtype, state=state)
        files = _weight_files(folder)
        self._names = saved_names(model, state)
        saved = set(self._names.values())
        if any(k not in saved for keys, _ in files.values() for k in keys):
            log.info(
                "the serving checkpoint converts tensors on save (more than a renaming): each sync writes the whole folder"
            )
            self._whole_only = True
            return
        self._files[folder] = files


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
    sees it (a shared volume may be mounted at different paths). Two slot folders alternate; each is
    written whole at its first sync and then only its weights file is replaced
    (:class:`ServingFolderWriter`)."""

    def __init__(
        self,
        base_url: str,
        local_dir: Path,
        server_dir: str | None = None,
        *,
        timeout_s: float = 600.0,
        client: httpx.Client | None = None,
        dtype: torch.dtype | None = torch.bfloat16,
    ):
        self.control = VLLMControl(base_url, timeout_s=timeout_s, client=client)
        self.dtype = dtype
        self.writer = ServingFolderWriter(dtype)
        self.base_url = self.control.base_url
        self.local_dir = Path(local_dir)
        self.server_dir = server_dir or str(self.local_dir)

    def close(self) -> None:
        self.control.close()

    def sync(self, model: Any, tokenizer: Any, step: int) -> float:
        start = time.perf_counter()
        slot = f"slot-{step % 2}"
        self.writer.write(model, tokenizer, self.local_dir / slot)
        self.control.reload_from(f"{self.server_dir.rstrip('/')}/{slot}")
        return time.perf_counter() - start


#: bytes of bf16 weights per ``/update_weights`` call of :class:`VLLMIpcSync`: the trainer holds one chunk's
#: copies at a time (the server loads each chunk before it answers), so the sync costs the GPU this much extra
IPC_CHUNK_BYTES = 1 << 30


def ipc_chunks(
    model: Any, dtype: torch.dtype | None = torch.bfloat16, chunk_bytes: int = IPC_CHUNK_BYTES
) -> Iterator[list[tuple[str, torch.Tensor]]]:
    """``model``'s state dict as the server loads it, in chunks of about ``chunk_bytes``: (name, tensor in
    ``dtype``, contiguous, on the model's device). A tensor shared in the model (tied embeddings) is sent once,
    under its first name (``model.embed_tokens.weight``; the server ties ``lm_head`` itself). Each chunk's
    tensors are made when it is taken, so only one chunk's copies exist at a time."""
    seen: set[TensorIdentity] = set()
    chunk: list[tuple[str, torch.Tensor]] = []
    size = 0
    state = model.state_dict()
    names = saved_names(model, state)
    for name, tensor in state.items():
        key = tensor_identity(tensor)
        if tensor.numel() and key in seen:
            continue
        seen.add(key)
        out = _in_serving_dtype(tensor, dtype).contiguous()
        chunk.append((names[name], out))
        size += out.numel() * out.element_size()
        if size >= chunk_bytes:
            yield chunk
            chunk, size = [], 0
    if chunk:
        yield chunk


def cuda_ipc_handle(tensor: torch.Tensor) -> dict[str, tuple[Any, ...]]:
    """``{GPU UUID: rebuild args}`` of a CUDA tensor, as vLLM's IPC weight-transfer engine reads it
    (``torch.multiprocessing.reductions.reduce_tensor``; the receiver puts its own device index in)."""
    from torch.multiprocessing.reductions import reduce_tensor

    _, args = reduce_tensor(tensor)
    return {str(torch.cuda.get_device_properties(tensor.device).uuid): args}


def ipc_update_info(
    chunk: list[tuple[str, torch.Tensor]], handle: Callable[[torch.Tensor], dict[str, tuple[Any, ...]]]
) -> dict[str, Any]:
    """The ``update_info`` of one ``POST /update_weights`` (vLLM's ``IPCWeightTransferUpdateInfo``, unpacked):
    names, dtypes, shapes and the handles, pickled and base64-encoded as vLLM's HTTP transport sends them."""
    return {
        "names": [name for name, _ in chunk],
        "dtype_names": [str(t.dtype).removeprefix("torch.") for _, t in chunk],
        "shapes": [list(t.shape) for _, t in chunk],
        "ipc_handles_pickled": base64.b64encode(pickle.dumps([handle(t) for _, t in chunk])).decode("ascii"),
        "packed": False,
    }


class VLLMIpcSync:
    """CUDA-IPC weight sync into a vLLM server on the trainer's GPU (``inference.weightSync: cudaIpc``).

    Per step: ``/start_weight_update``; for each chunk of bf16 copies of the trainer's weights
    (:func:`ipc_chunks`), ``/update_weights`` with their CUDA IPC handles: the server maps the trainer's
    memory, loads the tensors through its model's ``load_weights`` and answers; the chunk's copies are then
    freed. ``/finish_weight_update`` and ``/reset_prefix_cache`` end it. No file is written or read: the
    reload path (:class:`VLLMReloadSync`) writes a bf16 checkpoint to disk and the server reads it back.

    The server must run on the same GPU, in the trainer's PID namespace (CUDA IPC checks the process; the
    operator's colocated pod shares it), with ``--weight-transfer-config '{"backend": "ipc"}'`` and
    ``VLLM_ALLOW_INSECURE_SERIALIZATION=1`` (it unpickles the handles, as vLLM's own HTTP sender sends them).
    ``handle``: how a tensor becomes a handle (:func:`cuda_ipc_handle`; tests on the CPU pass their own)."""

    def __init__(
        self,
        base_url: str,
        *,
        timeout_s: float = 600.0,
        client: httpx.Client | None = None,
        dtype: torch.dtype | None = torch.bfloat16,
        chunk_bytes: int = IPC_CHUNK_BYTES,
        handle: Callable[[torch.Tensor], dict[str, tuple[Any, ...]]] | None = None,
    ):
        self.control = VLLMControl(base_url, timeout_s=timeout_s, client=client)
        self.base_url = self.control.base_url
        self.dtype = dtype
        self.chunk_bytes = chunk_bytes
        self.handle = handle or cuda_ipc_handle

    def close(self) -> None:
        self.control.close()

    def sync(self, model: Any, tokenizer: Any, step: int) -> float:
        start = time.perf_counter()
        device = next(iter(model.parameters())).device
        if self.handle is cuda_ipc_handle and device.type != "cuda":
            raise WeightSyncError(
                f"weightSync cudaIpc hands the server CUDA memory, but the trainer's model is on {device}: run the "
                "trainer on the server's GPU, or set spec.execution.inference.weightSync auto"
            )
        self.control.start_weight_update()
        try:
            for chunk in ipc_chunks(model, self.dtype, self.chunk_bytes):
                if device.type == "cuda":
                    torch.cuda.current_stream(device).synchronize()  # the copies exist before the server reads them
                self.control.update_weights(ipc_update_info(chunk, self.handle))
                del chunk  # loaded: the server holds no reference once it answered
        finally:
            self.control.finish_weight_update()
        if device.type == "cuda":
            torch.cuda.ipc_collect()
        self.control.reset_prefix_cache()
        seconds = time.perf_counter() - start
        log.info("weights of step %d sent to %s over CUDA IPC in %.2f s", step, self.base_url, seconds)
        return seconds


class StoreSync:
    """Store-transported weight sync for a vLLM pod with the weight-sync sidecar (see the module doc).

    ``ack_timeout_s`` bounds the wait for the sidecar's acknowledgement of each step (download +
    reload: seconds to minutes for a few-GB model)."""

    def __init__(
        self,
        store: Any,
        run: str,
        *,
        ack_timeout_s: float = 900.0,
        poll_s: float = 0.5,
        keep: int = 2,
        dtype: torch.dtype | None = torch.bfloat16,
    ):
        self.dtype = dtype
        self.host = HostSnapshot()  # the weights' host copy: pinned and reused on a GPU
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
            if (
                isinstance(last, dict)
                and last.get("checkpoint") == checkpoint
                and (version is None or last.get("version") == version)
            ):
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
            # the whole folder each step: it is uploaded whole under a new prefix
            state = serving_state(model, self.dtype, self.host)
            save_for_serving(model, tokenizer, Path(tmp), self.dtype, state=state)
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
        newest = sorted(s for s in steps if s <= keep_step)[-self.keep :]
        for step in steps:
            if step not in newest:
                self.store.delete_prefix(layout.sync_step_prefix(self.run, step))
