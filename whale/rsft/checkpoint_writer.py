"""Asynchronous checkpoints (``rsft.asyncCheckpoint``): snapshot to host memory, write in the background.

A checkpoint of a 1.7 B model blocked the trainer for ~40 s on the H200 (6.8 GB of fp32 weights and
13.6 GB of Adam moments written at the disk's speed; docs/performance.md). :class:`CheckpointWriter`
splits it in two:

1. **snapshot** (the trainer waits): the weights as they are saved (the fp32 master weights, so a resume
   continues from exactly them) and the optimiser state (moments, step counters, param groups) are
   copied off the device into host buffers that are allocated once and reused by every checkpoint
   (pinned when there is a GPU, so the copy runs at the bus's speed); tied tensors are copied once;
2. **write** (a background thread, while the trainer samples the next step): the HF checkpoint from the
   snapshot, uploaded with its ``COMPLETE`` marker last, then the resume state
   (:func:`whale.rsft.checkpoint.save_state`: optimiser file, meta, marker, ``latest.json`` last).

What a reader sees is unchanged: a checkpoint exists for the observer and every phase when its
``COMPLETE`` marker does (:func:`whale.rsft.checkpoint.checkpoint_complete`, what
``whale.control.observer.StoreObserver.checkpoints`` reads), and a resume point when ``latest.json``
names it. Both are written last, so a crash or a signal mid-write leaves the previous complete
checkpoint and resume state as the resume point. The bytes written are the synchronous writer's.

Bounded: one snapshot in flight. The next checkpoint first waits for the previous write (the buffers
are reused), and an error of a background write is raised there, or at the phase end
(:meth:`CheckpointWriter.wait`), never dropped. Per-step weight sync does not read the checkpoint
folder (it writes its own: :mod:`whale.rsft.sync`), so nothing waits for the write but the next
checkpoint and the phase result, which is written only after its checkpoint is complete.
"""

from __future__ import annotations

import copy
import logging
import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch

from whale.rsft import checkpoint as ckpt
from whale.store.base import Store

log = logging.getLogger(__name__)


class CheckpointWriteError(RuntimeError):
    """A background checkpoint write failed; the message names the step and the cause."""


#: what makes two state-dict entries one tensor (tied weights): the same memory, dtype and shape
TensorIdentity = tuple[int, torch.dtype, tuple[int, ...]]


def tensor_identity(tensor: torch.Tensor) -> TensorIdentity:
    """Equal for the entries of a tensor shared in a model (tied embeddings); empty tensors all look alike."""
    return (tensor.data_ptr(), tensor.dtype, tuple(tensor.shape))


class HostSnapshot:
    """Host copies of a tree of tensors (dicts, lists, tuples; other leaves deep-copied), in buffers
    kept between snapshots: the same tree shape reuses every buffer, a new shape allocates once."""

    def __init__(self, *, pin: bool | None = None):
        self.pin = torch.cuda.is_available() if pin is None else pin
        self._buffers: dict[str, torch.Tensor] = {}

    @property
    def nbytes(self) -> int:
        return sum(b.numel() * b.element_size() for b in self._buffers.values())

    def _buffer(self, path: str, tensor: torch.Tensor) -> torch.Tensor:
        buf = self._buffers.get(path)
        if buf is None or buf.shape != tensor.shape or buf.dtype != tensor.dtype:
            buf = torch.empty(tensor.shape, dtype=tensor.dtype, device="cpu", pin_memory=self.pin)
            self._buffers[path] = buf
        return buf

    def copy(self, tree: Any) -> Any:
        """The host copy of ``tree``; device copies are complete when this returns."""
        seen: dict[TensorIdentity, torch.Tensor] = {}
        device_copies = False

        def walk(node: Any, path: str) -> Any:
            nonlocal device_copies
            if isinstance(node, torch.Tensor):
                src = node.detach()
                key = tensor_identity(src)
                if src.numel() and key in seen:  # tied weights: one copy, shared as in the model
                    return seen[key]
                buf = self._buffer(path, src)
                device_copies = device_copies or src.device.type != "cpu"
                buf.copy_(src, non_blocking=self.pin and src.device.type != "cpu")
                seen[key] = buf
                return buf
            if isinstance(node, Mapping):
                return {k: walk(v, f"{path}/{k}") for k, v in node.items()}
            if isinstance(node, list):
                return [walk(v, f"{path}/{i}") for i, v in enumerate(node)]
            if type(node) is tuple:
                return tuple(walk(v, f"{path}/{i}") for i, v in enumerate(node))
            return copy.deepcopy(node)

        out = walk(tree, "")
        if device_copies and torch.cuda.is_available():
            torch.cuda.synchronize()
        return out


def _unwrapped(model: Any) -> Any:
    """The HF model that writes the checkpoint files (``GatheringModel`` wraps it on a data-parallel lead)."""
    return getattr(model, "unwrapped", model)


class CheckpointWriter:
    """Checkpoint + resume state of one weight phase, written in the background or in place.

    ``background=False`` writes in :meth:`save` itself (``rsft.asyncCheckpoint: false``): the same files in
    the same order, the trainer blocked until they are written."""

    def __init__(self, store: Store, run: str, phase: str, *, background: bool = True, pin: bool | None = None):
        self.store = store
        self.run = run
        self.phase = phase
        self.background = background
        self._weights = HostSnapshot(pin=pin)
        self._optimizer = HostSnapshot(pin=pin)
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self._step: int | None = None
        #: seconds each save() held the caller (the trainer), and each write took, newest last
        self.blocked_s: list[float] = []
        self.write_s: list[float] = []

    @property
    def in_flight(self) -> int | None:
        """The step whose write is running, or None."""
        return self._step if self._thread is not None and self._thread.is_alive() else None

    def save(
        self,
        step: int,
        model: Any,
        tokenizer: Any,
        optimizer_state: Callable[[], dict[str, Any]],
        meta: dict[str, Any],
    ) -> float:
        """Checkpoint ``step`` (the weights unless a complete checkpoint of it exists) and its resume state.
        Waits for the previous write first (raising its error). Returns the seconds the caller was held."""
        start = time.perf_counter()
        self.wait()
        write_weights = not ckpt.checkpoint_complete(self.store, self.run, step)
        staging = Path(tempfile.mkdtemp(prefix="whale-ckpt-"))
        # in place: the live tensors, as the synchronous path always wrote them; in the background: a snapshot
        take = (lambda tree, _snap: tree) if not self.background else (lambda tree, snap: snap.copy(tree))
        try:
            weights = None
            if write_weights:
                weights = take(model.state_dict(), self._weights)
                tokenizer.save_pretrained(staging)  # small; here, not beside a sampler using the tokenizer
            optim = take(optimizer_state(), self._optimizer)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
        job = (step, _unwrapped(model), weights, optim, dict(meta), staging)
        self._step = step
        if self.background:
            self._thread = threading.Thread(target=self._run, args=job, name=f"whale-checkpoint-{step}", daemon=False)
            self._thread.start()
        else:
            self._run(*job)
            self.wait()
        blocked = time.perf_counter() - start
        self.blocked_s.append(blocked)
        return blocked

    def _run(
        self,
        step: int,
        hf_model: Any,
        weights: dict[str, torch.Tensor] | None,
        optim: dict[str, Any],
        meta: dict[str, Any],
        staging: Path,
    ) -> None:
        try:
            start = time.perf_counter()
            if weights is not None:
                ckpt.write_checkpoint_dir(self.store, self.run, step, hf_model, staging, dict(weights))
                shutil.rmtree(staging, ignore_errors=True)  # before the state's own temporary file: less disk
            ckpt.save_state(self.store, self.run, self.phase, step, optim, meta)
            self.write_s.append(time.perf_counter() - start)
            log.info("checkpoint of step %d written in %.1f s", step, self.write_s[-1])
        except BaseException as exc:  # noqa: BLE001 - not swallowed: kept for the next save() / wait(), which raise it
            self._error = exc
        finally:
            shutil.rmtree(staging, ignore_errors=True)

    def wait(self) -> None:
        """Block until the write in flight (if any) is done; raise :class:`CheckpointWriteError` if it failed."""
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        error, self._error = self._error, None
        if error is not None:
            raise CheckpointWriteError(
                f"writing the checkpoint of step {self._step} to {self.store.uri_for(ckpt.layout.run_prefix(self.run))} "
                f"failed: {type(error).__name__}: {error}; the previous complete checkpoint stays the resume point"
            ) from error

    def close_after_error(self) -> None:
        """On the way out of a failed phase: let the write in flight finish (its checkpoint is a valid
        resume point) and log, not raise, its own error (the phase's error is the one that propagates)."""
        try:
            self.wait()
        except CheckpointWriteError as exc:
            log.error("%s", exc)
