"""The asynchronous checkpoint writer (``rsft.asyncCheckpoint``, :mod:`whale.rsft.checkpoint_writer`): the
trainer waits only for a host snapshot, the background write produces the synchronous writer's bytes, a
checkpoint counts (COMPLETE, latest.json) only once fully written, one write is in flight at a time, a
failed write surfaces, and a process killed mid-write resumes from the previous complete checkpoint."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO

import pytest

from tests.component.rsft_support import tiny_model_dir
from whale.core import layout
from whale.core.protocol import WeightPhaseArgs
from whale.rsft import checkpoint as ckpt
from whale.rsft.checkpoint_writer import CheckpointWriteError, CheckpointWriter, HostSnapshot
from whale.rsft.phase import find_start
from whale.store.local import LocalStore

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

RUN, PHASE = "kill-test", "c01-weight"  # as in checkpoint_writer_child
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    return tiny_model_dir(tmp_path_factory.getbasetemp())


def trained(model_dir: Path, device: str = "cpu"):
    """(model, tokenizer, optimizer) after one real AdamW update: moments and step counters exist."""
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).to(device)
    tokenizer = transformers.AutoTokenizer.from_pretrained(model_dir)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=device == "cuda")
    update(model, optimizer)
    return model, tokenizer, optimizer


def update(model, optimizer) -> None:
    ids = torch.randint(0, model.config.vocab_size, (2, 16), device=model.device)
    model(input_ids=ids, labels=ids).loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


class GatedStore(LocalStore):
    """Test double around the real local store: every upload waits for ``gate`` (a slow disk or network)."""

    def __init__(self, root: Path):
        super().__init__(root)
        self.gate = threading.Event()

    def upload_file(self, path: Path, key: str) -> None:
        if not self.gate.wait(timeout=60):
            raise TimeoutError("the test never opened the gate")
        super().upload_file(path, key)


class FailingStore(LocalStore):
    """Test double: the disk is full for optimiser files (uploaded, or streamed through ``writing``)."""

    def upload_file(self, path: Path, key: str) -> None:
        if key.endswith(ckpt.OPTIMIZER_FILE):
            raise OSError(28, "No space left on device")
        super().upload_file(path, key)

    @contextmanager
    def writing(self, key: str) -> Iterator[BinaryIO]:
        with super().writing(key) as fh:
            yield fh
            if key.endswith(ckpt.OPTIMIZER_FILE):
                raise OSError(28, "No space left on device")


def files(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def assert_same_state(a: dict, b: dict) -> None:
    assert a["param_groups"] == b["param_groups"] and a["state"].keys() == b["state"].keys()
    for idx, entry in a["state"].items():
        for name, value in entry.items():
            assert torch.equal(value, b["state"][idx][name]), (idx, name)


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_the_background_write_is_the_synchronous_one_of_the_state_at_the_snapshot(tmp_path, model_dir, device):
    """On a GPU the snapshot is a pinned, non-blocking copy synchronised before the write starts."""
    model, tokenizer, optimizer = trained(model_dir, device)
    sync_store = LocalStore(tmp_path / "sync")
    CheckpointWriter(sync_store, RUN, PHASE, background=False).save(
        3, model, tokenizer, optimizer.state_dict, {"cursor": 3}
    )
    expected_opt = torch.load(
        sync_store.local_path(f"{layout.state_prefix(RUN, PHASE)}/step-000003/{ckpt.OPTIMIZER_FILE}"),
        map_location="cpu",
        weights_only=True,
    )

    store = GatedStore(tmp_path / "async")
    writer = CheckpointWriter(store, RUN, PHASE, background=True)
    writer.save(3, model, tokenizer, optimizer.state_dict, {"cursor": 3})
    # save returned with nothing written: the write waits for the gate, so the checkpoint does not count yet
    assert writer.in_flight == 3
    assert not ckpt.checkpoint_complete(store, RUN, 3) and ckpt.load_state(store, RUN, PHASE) is None
    # the trainer goes on: the next updates change the weights and the moments in place
    for _ in range(2):
        update(model, optimizer)
    store.gate.set()
    writer.wait()
    assert writer.in_flight is None and ckpt.checkpoint_complete(store, RUN, 3)
    # the very bytes of the synchronous write of the state as it was at the snapshot
    assert files(tmp_path / "async").keys() == files(tmp_path / "sync").keys()
    for name, data in files(tmp_path / "sync").items():
        if not name.endswith(ckpt.OPTIMIZER_FILE):
            assert files(tmp_path / "async")[name] == data, name
    step, meta, loaded = ckpt.load_state(store, RUN, PHASE)
    assert (step, meta["cursor"]) == (3, 3)
    assert_same_state(loaded, expected_opt)
    live = optimizer.state_dict()["state"][0]
    assert not all(torch.equal(loaded["state"][0][k], v.cpu()) for k, v in live.items())  # the trainer moved on


def test_one_write_in_flight_the_next_checkpoint_waits_for_it(tmp_path, model_dir):
    model, tokenizer, optimizer = trained(model_dir)
    store = GatedStore(tmp_path / "store")
    writer = CheckpointWriter(store, RUN, PHASE, background=True)
    writer.save(1, model, tokenizer, optimizer.state_dict, {"cursor": 1})
    second = threading.Thread(target=writer.save, args=(2, model, tokenizer, optimizer.state_dict, {"cursor": 2}))
    second.start()
    second.join(timeout=1.0)
    assert second.is_alive(), "the second checkpoint did not wait for the first write"
    assert writer.in_flight == 1
    store.gate.set()
    second.join(timeout=60)
    assert not second.is_alive()
    writer.wait()
    assert ckpt.checkpoint_complete(store, RUN, 1) and ckpt.checkpoint_complete(store, RUN, 2)
    assert ckpt.load_state(store, RUN, PHASE)[0] == 2  # newest state only, pointer last


def test_a_failed_background_write_surfaces_at_the_next_checkpoint_and_at_the_end(tmp_path, model_dir):
    model, tokenizer, optimizer = trained(model_dir)
    store = FailingStore(tmp_path / "store")
    writer = CheckpointWriter(store, RUN, PHASE, background=True)
    writer.save(1, model, tokenizer, optimizer.state_dict, {})
    with pytest.raises(CheckpointWriteError, match=r"step 1 .*No space left on device"):
        writer.save(2, model, tokenizer, optimizer.state_dict, {})
    writer.save(2, model, tokenizer, optimizer.state_dict, {})
    with pytest.raises(CheckpointWriteError, match="step 2"):
        writer.wait()
    writer.wait()  # reported once, then clear
    assert ckpt.load_state(store, RUN, PHASE) is None  # no resume state points at a half-written step


def test_host_buffers_are_reused_and_tied_weights_copied_once(model_dir):
    model, _tokenizer, optimizer = trained(model_dir)
    snap = HostSnapshot(pin=False)
    first = snap.copy(model.state_dict())
    size = snap.nbytes
    second = snap.copy(model.state_dict())
    assert snap.nbytes == size and all(first[k] is second[k] for k in first)  # the same buffers
    params = sum(t.numel() * t.element_size() for t in {t.data_ptr(): t for t in model.state_dict().values()}.values())
    assert size == params  # tied tensors (embedding = LM head) once
    state = snap.copy(optimizer.state_dict())
    assert_same_state(state, optimizer.state_dict())


@pytest.mark.parametrize("block", ["weights", "state"])
@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM])
@pytest.mark.timeout(90 + 30 + 30 + 60)  # its own bounds (the child reaching the write, its end, a kill) and set-up
def test_a_process_killed_mid_write_resumes_from_the_previous_checkpoint(tmp_path, model_dir, block, sig):
    ready = tmp_path / "ready"
    store_dir = tmp_path / "store"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tests.component.checkpoint_writer_child",
            str(store_dir),
            str(model_dir),
            str(ready),
            block,
        ],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        deadline = time.monotonic() + 90
        while not ready.exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert ready.exists(), f"the child never reached the write of step 2: {proc.poll()}"
        proc.send_signal(sig)
        proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate(timeout=30)
    assert proc.returncode == -sig
    store = LocalStore(store_dir)
    assert ckpt.checkpoint_complete(store, RUN, 1)
    # step 2's checkpoint: half there (no marker) or complete, but no resume state points at it
    assert ckpt.checkpoint_complete(store, RUN, 2) == (block == "state")
    if block == "weights":
        assert store.list(layout.checkpoint_prefix(RUN, 2) + "/"), "the kill did not land mid-write"
    start = find_start(
        store,
        RUN,
        PHASE,
        WeightPhaseArgs(
            cycle=1, harness=None, from_checkpoint=None, from_step=0, target_step=5, steps_per_epoch=5, total_steps=5
        ),
    )
    assert (start.step, start.model_prefix, start.resumed) == (1, layout.checkpoint_prefix(RUN, 1), True)
    assert start.optimizer_state is not None and start.optimizer_state["state"]
