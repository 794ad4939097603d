"""Checkpoints (for serving and for the next phase) and resume state (for a killed phase).

* HF checkpoint at ``layout.checkpoint_prefix(run, step)``: safetensors + config + tokenizer, the
  ``COMPLETE`` marker uploaded last, so a reader that sees the marker sees the whole folder. The
  weights are saved as trained (fp32 master weights), so a phase that resumes from a checkpoint
  continues from exactly the weights the killed one had; vLLM casts them to bf16 when it loads.
* Resume state at ``layout.state_prefix(run, phase)/step-NNNNNN/``: the optimiser state and a small
  JSON (step, data-order cursor, seeds), marker last; ``state/latest.json`` then points at it. It is
  written *after* the checkpoint of the same step, so a pointer never names a step without weights.
  Only the newest state is kept. A new phase that starts at step S without state of its own takes
  the optimiser state any earlier phase of the run saved at step S (the run's optimiser carries
  across phases, as in one long training run).

The optimiser state is streamed, never held as bytes: ``torch.save`` writes it tensor by tensor into
:meth:`Store.writing`'s file (a GPU tensor is copied to the host one at a time): a local store's own temp file
beside the target, renamed over it (the bytes written once); for S3 a temporary file on local disk (``$TMPDIR``)
uploaded multipart from the file. For Adam on a
1.7 B model that is 13.6 GB the old in-memory ``BytesIO`` held twice (the buffer, then its bytes).
Loading reads the file the same way: straight from a local store, else downloaded to a temporary file
first. The object's bytes are exactly what ``torch.save`` writes either way, so states saved before
and after this change load alike.

* Replay records at ``layout.replay_key(run, phase, step)`` (``rsft.stepResume: replay``, a model too large
  for a checkpoint after every step): the step's kept trajectories as the token ids and labels it trained
  on (int32: 8 bytes a token trained, against 12 bytes a parameter for a light resume point), one safetensors file written (streamed from a temporary file, like the optimiser) before the step's
  metrics line. A resume loads the last checkpoint and trains the recorded steps since again, in order and
  with their learning rates and seeds, instead of sampling them again; the records up to a complete
  checkpoint are deleted.

Every phase that loads a checkpoint (train, search, eval) calls :func:`require_complete` first, so
one pointed at a half-written checkpoint fails naming it, before any weights are read. torch is
imported only where optimiser state is (de)serialised: search and eval load this module without it.
"""

from __future__ import annotations

import itertools
import json
import logging
import tempfile
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from whale.core import layout
from whale.rsft.hub_form import restore_hub_form
from whale.store.base import Store

if TYPE_CHECKING:
    from whale.rsft.collate import Example

log = logging.getLogger(__name__)

STATE_MARKER = "COMPLETE"
OPTIMIZER_FILE = "optimizer.pt"
META_FILE = "state.json"


def step_dirname(step: int) -> str:
    return f"step-{step:06d}"


class CheckpointIncomplete(FileNotFoundError):
    """A checkpoint without its COMPLETE marker: missing, or its writer did not finish."""


def checkpoint_complete(store: Store, run: str, step: int) -> bool:
    return store.exists(layout.checkpoint_complete_key(run, step))


def require_complete(store: Store, prefix: str) -> None:
    """Raise :class:`CheckpointIncomplete` naming the checkpoint unless its COMPLETE marker exists."""
    marker = f"{prefix.rstrip('/')}/{layout.CHECKPOINT_COMPLETE_MARKER}"
    if not store.exists(marker):
        raise CheckpointIncomplete(
            f"checkpoint {store.uri_for(prefix)} is missing or incomplete (no {layout.CHECKPOINT_COMPLETE_MARKER} "
            "marker): the phase that wrote it did not finish; rerun it, or point the phase at a complete checkpoint"
        )


def save_checkpoint(store: Store, run: str, step: int, model: Any, tokenizer: Any) -> str:
    """Upload an HF checkpoint of ``model`` at ``step``; returns its store prefix."""
    with tempfile.TemporaryDirectory(prefix="whale-ckpt-") as tmp:
        tokenizer.save_pretrained(tmp)
        return write_checkpoint_dir(store, run, step, model, Path(tmp))


def write_checkpoint_dir(
    store: Store, run: str, step: int, model: Any, folder: Path, state_dict: dict[str, Any] | None = None
) -> str:
    """Write ``model``'s weights (``state_dict``: these tensors instead of the model's, e.g. a host
    snapshot) and config into ``folder`` beside whatever it holds (the tokenizer), then upload it as the
    checkpoint of ``step``, COMPLETE marker last; returns its store prefix."""
    prefix = layout.checkpoint_prefix(run, step)
    model.save_pretrained(folder, safe_serialization=True, state_dict=state_dict)
    form = getattr(model, "whale_hub_form", None)
    if form is not None:  # trained out of a multimodal checkpoint: keep its form (vLLM serves only that)
        restore_hub_form(folder, form)
    store.upload_dir(folder, prefix, marker=layout.CHECKPOINT_COMPLETE_MARKER)
    return prefix


def _state_dir(run: str, phase: str, step: int) -> str:
    return f"{layout.state_prefix(run, phase)}/{step_dirname(step)}"


def _latest_key(run: str, phase: str) -> str:
    return f"{layout.state_prefix(run, phase)}/latest.json"


def save_state(
    store: Store, run: str, phase: str, step: int, optimizer_state: dict[str, Any], meta: dict[str, Any]
) -> None:
    """Resume state of ``phase`` after global step ``step`` (call after its checkpoint is complete)."""
    import torch

    base = _state_dir(run, phase, step)
    with store.writing(f"{base}/{OPTIMIZER_FILE}") as fh:
        torch.save(optimizer_state, fh)  # tensor by tensor into the file: never the whole state as bytes
    store.write_json(f"{base}/{META_FILE}", {**meta, "step": step})
    store.write_bytes(f"{base}/{STATE_MARKER}", b"")
    previous = store.read_json_or_none(_latest_key(run, phase))
    store.write_json(_latest_key(run, phase), {"step": step})
    if previous and previous.get("step") != step:
        store.delete_prefix(_state_dir(run, phase, int(previous["step"])) + "/")


def _load_optimizer(store: Store, key: str) -> dict[str, Any]:
    """``torch.load`` of the object at ``key`` from a file (the store's own, or a temporary download)."""
    import torch

    local = store.local_path(key)
    if local is not None:
        return torch.load(local, map_location="cpu", weights_only=True)
    with tempfile.TemporaryDirectory(prefix="whale-state-") as tmp:
        path = store.download_file(key, Path(tmp) / OPTIMIZER_FILE)
        return torch.load(path, map_location="cpu", weights_only=True)


def load_state(store: Store, run: str, phase: str) -> tuple[int, dict[str, Any], dict[str, Any]] | None:
    """(step, meta, optimizer state) of this phase's newest state, or None."""
    latest = store.read_json_or_none(_latest_key(run, phase))
    if not latest:
        return None
    step = int(latest["step"])
    base = _state_dir(run, phase, step)
    if not store.exists(f"{base}/{STATE_MARKER}") or not checkpoint_complete(store, run, step):
        log.warning("resume state of %s at step %d is incomplete; ignoring it", phase, step)
        return None
    meta = store.read_json(f"{base}/{META_FILE}")
    return step, meta, _load_optimizer(store, f"{base}/{OPTIMIZER_FILE}")


def find_carried_optimizer(store: Store, run: str, step: int, exclude_phase: str) -> dict[str, Any] | None:
    """The optimiser state another phase of the run saved at ``step``, if any."""
    phases_root = f"{layout.run_prefix(run)}/phases/"
    for child in store.list(phases_root, recursive=False):
        phase = child.rstrip("/").rsplit("/", 1)[-1]
        if phase == exclude_phase:
            continue
        base = _state_dir(run, phase, step)
        if store.exists(f"{base}/{STATE_MARKER}"):
            log.info("carrying the optimiser state of phase %s at step %d", phase, step)
            return _load_optimizer(store, f"{base}/{OPTIMIZER_FILE}")
    return None


def save_replay(store: Store, run: str, phase: str, step: int, examples: Sequence[Example]) -> None:
    """The replay record of global step ``step``: the sequences it trained on (none: a step that kept nothing)."""
    import numpy as np
    import torch
    from safetensors.torch import save_file

    total = sum(len(e) for e in examples)

    def flat(rows: Iterable[Sequence[int]]) -> torch.Tensor:  # int32: ids of any vocabulary, and -100
        return torch.from_numpy(np.fromiter(itertools.chain.from_iterable(rows), dtype=np.int32, count=total))

    tensors = {
        "input_ids": flat(e.input_ids for e in examples),
        "labels": flat(e.labels for e in examples),
        "lengths": torch.tensor([len(e) for e in examples], dtype=torch.int64),
    }
    with tempfile.TemporaryDirectory(prefix="whale-replay-") as tmp:
        path = Path(tmp) / "replay.safetensors"
        save_file(tensors, str(path), metadata={"step": str(step)})
        store.upload_file(path, layout.replay_key(run, phase, step))


def load_replay(store: Store, run: str, phase: str, step: int) -> list[Example]:
    """The sequences global step ``step`` trained on, as :func:`save_replay` wrote them."""
    from safetensors.torch import load_file

    from whale.rsft.collate import Example

    key = layout.replay_key(run, phase, step)
    with tempfile.TemporaryDirectory(prefix="whale-replay-") as tmp:
        path = store.local_path(key) or store.download_file(key, Path(tmp) / "replay.safetensors")
        tensors = load_file(str(path))
    ids, labels = tensors["input_ids"].tolist(), tensors["labels"].tolist()
    out, at = [], 0
    for n in tensors["lengths"].tolist():
        out.append(Example(tuple(ids[at : at + n]), tuple(labels[at : at + n])))
        at += n
    return out


def replay_steps(store: Store, run: str, phase: str, after: int, logged: Sequence[int]) -> list[int]:
    """The steps after ``after`` a resume can train again instead of sampling: each with a replay record and a
    metrics line (``logged``), without a gap (a record is written before its line, so the last may lack one)."""
    recorded = set(store.list(layout.replay_prefix(run, phase) + "/"))
    steps, logged_steps = [], set(logged)
    step = after + 1
    while layout.replay_key(run, phase, step) in recorded and step in logged_steps:
        steps.append(step)
        step += 1
    return steps


def prune_replay(store: Store, run: str, phase: str, up_to: int) -> None:
    """Delete the replay records of steps up to ``up_to`` (a complete checkpoint of that step holds them)."""
    prefix = layout.replay_prefix(run, phase) + "/"
    for key in store.list(prefix):
        step = layout.parse_checkpoint_step(key.rsplit("/", 1)[-1].removesuffix(".safetensors"))
        if step is not None and step <= up_to:
            store.delete(key)


def materialise(store: Store, prefix: str, workdir: Path) -> Path:
    """A local folder holding the checkpoint at store ``prefix`` (no copy for a local store)."""
    require_complete(store, prefix)
    local = store.local_path(prefix.rstrip("/"))
    if local is not None and local.is_dir():
        return local
    return store.download_dir(prefix, workdir / prefix.rstrip("/").replace("/", "_"))


def dump_json_line(record: dict[str, Any]) -> str:
    return json.dumps(record, sort_keys=True)
