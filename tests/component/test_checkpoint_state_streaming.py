"""The resume state's optimiser file is streamed to the store's file, never held as bytes (issue #17) and, on a
local store, written once (#33):
the format and keys stay what ``torch.save`` writes, so states saved before the change load after it and
the other way round, on both store backends; and saving holds no copy of the state in Python memory
(the old ``BytesIO`` held it twice). A run resuming from such a state is
``test_train_workload.test_a_killed_phase_resumes_with_the_same_data_order_and_step_count``."""

from __future__ import annotations

import io
import tracemalloc
from pathlib import Path

import pytest

from whale.core import layout
from whale.rsft import checkpoint as ckpt
from whale.store import Store
from whale.store.local import LocalStore

torch = pytest.importorskip("torch")

RUN, PHASE, STEP = "r1", "c01-weight", 4


@pytest.fixture(params=["local", "s3"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Store:
    if request.param == "local":
        return LocalStore(tmp_path / "store")
    return request.getfixturevalue("s3_store")


def adam_state(n_params: int = 4, numel: int = 1 << 20) -> dict:
    """A real AdamW state after one update: 2 moments of ``numel`` fp32 per parameter (32 MiB in all)."""
    gen = torch.Generator().manual_seed(0)
    params = [torch.nn.Parameter(torch.randn(numel, generator=gen)) for _ in range(n_params)]
    opt = torch.optim.AdamW(params, lr=1e-3)
    sum((p * p).sum() for p in params).backward()
    opt.step()
    return opt.state_dict()


def mark_checkpoint_complete(store: Store) -> None:
    store.write_bytes(layout.checkpoint_complete_key(RUN, STEP), b"")


def assert_same_state(a: dict, b: dict) -> None:
    assert a["param_groups"] == b["param_groups"]
    assert a["state"].keys() == b["state"].keys()
    for idx, entry in a["state"].items():
        for name, value in entry.items():
            assert torch.equal(value, b["state"][idx][name]), (idx, name)


def test_a_streamed_state_has_the_old_keys_and_bytes_and_loads_back(store):
    state = adam_state()
    mark_checkpoint_complete(store)
    ckpt.save_state(store, RUN, PHASE, STEP, state, {"cursor": 7})
    base = f"{layout.state_prefix(RUN, PHASE)}/{ckpt.step_dirname(STEP)}"
    assert sorted(store.list(base)) == [
        f"{base}/{ckpt.STATE_MARKER}",
        f"{base}/{ckpt.OPTIMIZER_FILE}",
        f"{base}/{ckpt.META_FILE}",
    ]
    # the old loader (torch.load of the object's bytes) reads what the new code wrote
    old_read = torch.load(io.BytesIO(store.read_bytes(f"{base}/{ckpt.OPTIMIZER_FILE}")), weights_only=True)
    assert_same_state(old_read, state)
    step, meta, loaded = ckpt.load_state(store, RUN, PHASE)
    assert (step, meta["cursor"], meta["step"]) == (STEP, 7, STEP)
    assert_same_state(loaded, state)


def test_a_state_written_by_the_old_in_memory_code_still_loads(store):
    state = adam_state(n_params=2, numel=1000)
    mark_checkpoint_complete(store)
    base = f"{layout.state_prefix(RUN, 'c00-weight')}/{ckpt.step_dirname(STEP)}"
    buf = io.BytesIO()  # exactly what save_state did before streaming
    torch.save(state, buf)
    store.write_bytes(f"{base}/{ckpt.OPTIMIZER_FILE}", buf.getvalue())
    store.write_json(f"{base}/{ckpt.META_FILE}", {"step": STEP})
    store.write_bytes(f"{base}/{ckpt.STATE_MARKER}", b"")
    store.write_json(f"{layout.state_prefix(RUN, 'c00-weight')}/latest.json", {"step": STEP})
    assert_same_state(ckpt.load_state(store, RUN, "c00-weight")[2], state)
    # and a later phase starting at that step carries it
    assert_same_state(ckpt.find_carried_optimizer(store, RUN, STEP, exclude_phase=PHASE), state)


def test_saving_holds_no_copy_of_the_state_in_memory(tmp_path):
    """tracemalloc sees every bytes/BytesIO buffer (tensor storage is not Python memory): the old code's
    peak was twice the state (buffer + getvalue()); the streamed save stays far below one copy."""
    store = LocalStore(tmp_path / "store")
    state = adam_state()  # 32 MiB of moments
    state_bytes = sum(v.numel() * v.element_size() for e in state["state"].values() for v in e.values() if v.dim() > 0)
    mark_checkpoint_complete(store)
    tracemalloc.start()
    try:
        ckpt.save_state(store, RUN, PHASE, STEP, state, {})
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert state_bytes >= 32 << 20
    assert peak < state_bytes / 8, f"save_state held {peak} bytes of Python memory for a {state_bytes}-byte state"


def _bytes_written() -> int:
    """Bytes this process has passed to write(2) and the like so far (Linux's /proc/self/io ``wchar``)."""
    for line in Path("/proc/self/io").read_text().splitlines():
        if line.startswith("wchar:"):
            return int(line.split()[1])
    raise AssertionError("no wchar in /proc/self/io")


@pytest.mark.skipif(not Path("/proc/self/io").exists(), reason="needs Linux's /proc/self/io")
def test_a_local_store_writes_the_optimiser_file_once(tmp_path):
    # issue #33: the save went to a temporary file, then copied it into the store (every byte written twice)
    store = LocalStore(tmp_path / "store")
    state = adam_state()  # 32 MiB of moments
    mark_checkpoint_complete(store)
    before = _bytes_written()
    ckpt.save_state(store, RUN, PHASE, STEP, state, {})
    written = _bytes_written() - before
    size = (store.root / layout.state_prefix(RUN, PHASE) / ckpt.step_dirname(STEP) / ckpt.OPTIMIZER_FILE).stat().st_size
    assert size >= 32 << 20
    assert written < 1.25 * size, f"{written} bytes written for a {size}-byte optimiser file"


def test_writing_stores_the_object_only_when_the_block_ends_cleanly(store):
    with store.writing("a/b.bin") as fh:
        fh.write(b"x" * 1000)
        fh.write(b"y")
    assert store.read_bytes("a/b.bin") == b"x" * 1000 + b"y"
    with pytest.raises(RuntimeError), store.writing("a/b.bin") as fh:
        fh.write(b"half")
        raise RuntimeError("the writer failed")
    assert store.read_bytes("a/b.bin") == b"x" * 1000 + b"y"  # the old object, untouched
    with pytest.raises(RuntimeError), store.writing("a/c.bin") as fh:
        fh.write(b"half")
        raise RuntimeError("the writer failed")
    assert not store.exists("a/c.bin")
    assert store.list("a") == ["a/b.bin"]  # no temporary file left behind
