"""Store-transported weight sync on a cluster: the trainer publishes each step's weights to the store
and waits for the vLLM pod's weight-sync sidecar to reload vLLM and acknowledge.

Real stores (a local folder and S3 on loopback), real HF checkpoints of the tiny synthetic model, the
real sidecar loop and CLI; vLLM itself is the loopback *test double* of its dev-mode control
endpoints (``tests/fixtures/vllm_double.py``; no vLLM here), which checks that each folder it is told to reload
holds a complete checkpoint."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from tests.fixtures.kube import wait_for
from tests.fixtures.vllm_double import running_vllm_double
from whale.core import layout
from whale.core.spec import WhaleRunSpec
from whale.inference.vllm_control import VLLMControl
from whale.inference.weight_sync import WeightSyncer
from whale.rsft.sync import StoreSync, WeightSyncError
from whale.store import open_store

pytest.importorskip("transformers")
RUN = "sync"


@pytest.fixture()
def vllm():
    with running_vllm_double() as server:
        yield server


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from synthetic.tiny_model import build_model, build_tokenizer

    tok = build_tokenizer()
    model = build_model(len(tok), seed=0)
    base = tmp_path_factory.mktemp("base")
    model.save_pretrained(base)
    tok.save_pretrained(base)
    return model, tok, base


@pytest.fixture(params=["local", "s3"])
def store(request, tmp_path):
    if request.param == "local":
        return open_store(f"file://{tmp_path / 'store'}")
    return request.getfixturevalue("s3_store")


def test_the_sidecar_follows_each_step_and_the_trainer_waits_for_the_ack(store, vllm, tiny, tmp_path):
    model, tok, base = tiny
    dest = tmp_path / "models"
    syncer = WeightSyncer(store, RUN, str(base), dest)
    assert syncer.prepare_once() == {"checkpoint": None}  # init container: nothing served yet -> base model
    assert os.path.realpath(dest / "current") == str(base)
    syncer.control = VLLMControl(vllm.url, timeout_s=30)
    stop = threading.Event()
    sidecar = threading.Thread(target=syncer.follow, kwargs={"poll_s": 0.05, "stop": stop}, daemon=True)
    sidecar.start()
    try:
        # vLLM came up on the base model: acknowledged without a reload
        wait_for(lambda: store.read_json_or_none(layout.served_key(RUN)), what="the start-up ack")
        assert store.read_json(layout.served_key(RUN))["checkpoint"] is None and vllm.loaded == []

        # the train workload on a cluster picks the store sync and first waits for its start weights
        from whale.workloads.train import make_sampling_backend

        spec = WhaleRunSpec.model_validate(
            {
                "domain": "synthetic",
                "condition": "whale",
                "model": {"name": str(base)},
                "schedule": {"totalSteps": 2, "weightStepsPerCycle": 1},
                "inference": {"backend": "vllm", "baseUrl": vllm.url},
                "storage": {"uri": store.uri},
            }
        )
        _client, sync, lock = make_sampling_backend(spec, model, tok, store, RUN, None)
        assert isinstance(sync, StoreSync) and lock is None
        sync.poll_s, sync.ack_timeout_s = 0.05, 60
        for step in (1, 2, 3):
            assert sync.sync(model, tok, step) > 0
            served = store.read_json(layout.served_key(RUN))
            assert served["checkpoint"] == layout.sync_step_prefix(RUN, step) and served["at"].endswith("Z")
        # three reloads, alternating slots: the folder being written is never the one served
        assert vllm.loaded == [str(dest / "slot-0"), str(dest / "slot-1"), str(dest / "slot-0")]
        assert os.path.realpath(dest / "current") == str((dest / "slot-0").resolve())
        assert [p for p, _ in vllm.calls].count("/reset_prefix_cache") == 3
        # only the last two steps stay in the store
        kept = {e.rstrip("/").rsplit("/", 1)[-1] for e in store.list(layout.sync_prefix(RUN) + "/", recursive=False)}
        assert kept == {"step-000002", "step-000003"}
        # back to a phase checkpoint between phases (the operator's ServeCheckpoint)
        ckpt = layout.checkpoint_prefix(RUN, 3)
        store.upload_dir(dest / "slot-0", ckpt)
        store.write_bytes(layout.checkpoint_complete_key(RUN, 3), b"")
        store.write_json(layout.serving_key(RUN), {"checkpoint": ckpt})
        wait_for(
            lambda: (store.read_json_or_none(layout.served_key(RUN)) or {}).get("checkpoint") == ckpt,
            what="the ack of the phase checkpoint",
        )
        assert vllm.loaded[-1] == str(dest / "slot-1")
        # a resumed attempt re-publishes a step under the same name: the new version forces a reload
        loads = len(vllm.loaded)
        sync.sync(model, tok, 3)
        assert len(vllm.loaded) == loads + 1
        # the start-of-phase request for immutable weights is acknowledged without reloading them
        sync.serve(ckpt)
        assert len(vllm.loaded) == loads + 2  # ckpt differs from the sync folder just served: one reload
        sync.serve(ckpt)
        assert len(vllm.loaded) == loads + 2
    finally:
        stop.set()
        sidecar.join(timeout=10)
    assert not sidecar.is_alive()


def test_without_a_sidecar_the_trainer_fails_with_an_actionable_error(tmp_path, tiny):
    model, tok, _ = tiny
    store = open_store(str(tmp_path / "store"))
    sync = StoreSync(store, RUN, ack_timeout_s=0.5, poll_s=0.05)
    with pytest.raises(
        WeightSyncError,
        match=r"did not acknowledge runs/sync/sync/step-000001 within 0 s.*"
        r"kubectl logs deploy/sync-vllm -c weight-sync",
    ):
        sync.sync(model, tok, 1)
    # the weights were published all the same (COMPLETE last) and the target set
    assert store.exists(f"{layout.sync_step_prefix(RUN, 1)}/COMPLETE")
    assert store.read_json(layout.serving_key(RUN))["checkpoint"] == layout.sync_step_prefix(RUN, 1)


def test_a_server_without_dev_mode_stops_the_sidecar_with_the_fix(tmp_path, tiny):
    _, _, base = tiny
    with running_vllm_double(dev_mode=False) as server:
        store = open_store(str(tmp_path / "store"))
        ckpt = layout.checkpoint_prefix(RUN, 1)
        store.upload_dir(base, ckpt, marker="COMPLETE")
        store.write_bytes(layout.checkpoint_complete_key(RUN, 1), b"")
        store.write_json(layout.serving_key(RUN), {"checkpoint": ckpt})
        syncer = WeightSyncer(store, RUN, str(base), tmp_path / "models", control=VLLMControl(server.url))
        with pytest.raises(WeightSyncError, match="VLLM_SERVER_DEV_MODE=1"):
            syncer.follow(poll_s=0.05, stop=threading.Event())
        assert not store.exists(layout.served_key(RUN))


def test_the_init_container_cli_materialises_the_served_checkpoint(tmp_path, tiny):
    _, _, base = tiny
    store = open_store(f"file://{tmp_path / 'store'}")
    ckpt = layout.checkpoint_prefix(RUN, 4)
    store.upload_dir(base, ckpt)
    store.write_bytes(layout.checkpoint_complete_key(RUN, 4), b"")
    store.write_json(layout.serving_key(RUN), {"checkpoint": ckpt})
    dest = tmp_path / "models"
    cmd = [
        sys.executable,
        "-m",
        "whale.inference.weight_sync",
        "--store",
        store.uri,
        "--run",
        RUN,
        "--model",
        "Qwen/never-downloaded",
        "--dest",
        str(dest),
        "--once",
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr[-2000:]
    current = Path(os.path.realpath(dest / "current"))
    assert current == (dest / "slot-0").resolve() and (current / "config.json").is_file()
    assert not (current / "COMPLETE").exists()
    # an incomplete checkpoint is refused with the missing marker named, in one line
    store.delete(layout.checkpoint_complete_key(RUN, 4))
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1
    assert "weight sync failed" in proc.stderr.strip().splitlines()[-1]
    assert "step-000004/COMPLETE" in proc.stderr.strip().splitlines()[-1]
