"""``inference.weightSync: cudaIpc`` (``whale.rsft.sync.VLLMIpcSync``) against the loopback *test double* of
vLLM's weight-transfer API (``tests/fixtures/vllm_double.py``). CI has no GPU, so CUDA IPC itself is stood in
for: the handle of a tensor is a key into a registry, and the double rebuilds the tensor from it, as vLLM's
``rebuild_cuda_tensor`` maps the trainer's memory. What is checked is everything around it: the sequence of
calls, what each carries, that every weight arrives once in bf16 and equal to the trainer's, and the errors."""

from __future__ import annotations

import itertools
from typing import Any

import pytest

from tests.fixtures.vllm_double import running_vllm_double
from whale.rsft.sync import VLLMIpcSync, WeightSyncError, ipc_chunks, ipc_update_info

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")


class HandleRegistry:
    """Stands in for CUDA IPC: ``handle`` files a tensor under a fresh key (as ``reduce_tensor`` exports its
    memory), ``rebuild`` returns it from the key (as ``rebuild_cuda_tensor`` maps it)."""

    def __init__(self) -> None:
        self.tensors: dict[int, Any] = {}
        self._keys = itertools.count()

    def handle(self, tensor: Any) -> dict[str, tuple[Any, ...]]:
        key = next(self._keys)
        self.tensors[key] = tensor.clone()  # what the server would read from the trainer's memory right now
        return {"GPU-test-uuid": (key,)}

    def rebuild(self, handle: dict[str, tuple[Any, ...]]) -> Any:
        return self.tensors[handle["GPU-test-uuid"][0]]


@pytest.fixture(scope="module")
def tiny():
    from synthetic.tiny_model import build_model, build_tokenizer

    tok = build_tokenizer()
    return build_model(len(tok), seed=0), tok


def transfer_calls(server) -> list[str]:
    return [path for path, _ in server.calls]


def test_every_weight_reaches_the_server_once_in_bf16_in_bounded_chunks(tiny):
    model, tok = tiny
    registry = HandleRegistry()
    chunk_bytes = 256 * 1024
    with running_vllm_double(rebuild=registry.rebuild) as server:
        sync = VLLMIpcSync(server.url, chunk_bytes=chunk_bytes, handle=registry.handle)
        seconds = sync.sync(model, tok, step=1)
        first = list(server.received)
        sync.sync(model, tok, step=2)
        sync.close()
    assert seconds > 0
    updates = transfer_calls(server).count("/update_weights") // 2
    assert updates > 1  # chunked
    step = ["/start_weight_update", *["/update_weights"] * updates, "/finish_weight_update", "/reset_prefix_cache"]
    assert transfer_calls(server) == step * 2
    assert not server.updating
    # every tensor of the state dict once; the tied lm_head goes under the embedding's name only
    state = model.state_dict()
    assert model.config.tie_word_embeddings
    names = [name for name, _ in first]
    assert names == [n for n in state if n != "lm_head.weight"] and len(set(names)) == len(names)
    for name, tensor in first:
        assert tensor.dtype == torch.bfloat16 and torch.equal(tensor, state[name].to(torch.bfloat16)), name
    assert model.dtype == torch.float32  # the trainer's master weights are untouched
    # each chunk holds about chunk_bytes: the trainer's extra memory is bounded by it (plus one tensor)
    chunks = list(ipc_chunks(model, torch.bfloat16, chunk_bytes))
    largest = max(t.numel() * t.element_size() for chunk in chunks for _, t in chunk)
    assert all(sum(t.numel() * t.element_size() for _, t in chunk) < chunk_bytes + largest for chunk in chunks)
    assert len(chunks) == updates


def test_the_update_info_is_what_vllms_ipc_engine_parses(tiny):
    import base64
    import pickle

    model, _ = tiny
    registry = HandleRegistry()
    [chunk, *_] = list(ipc_chunks(model, torch.bfloat16, 1 << 40))
    info = ipc_update_info(chunk, registry.handle)
    assert set(info) == {"names", "dtype_names", "shapes", "ipc_handles_pickled", "packed"}
    assert info["packed"] is False and set(info["dtype_names"]) == {"bfloat16"}
    assert info["shapes"] == [list(t.shape) for _, t in chunk]
    handles = pickle.loads(base64.b64decode(info["ipc_handles_pickled"]))
    assert len(handles) == len(info["names"]) and all(set(h) == {"GPU-test-uuid"} for h in handles)


def test_a_server_without_the_ipc_engine_gets_the_flags_named(tiny):
    model, tok = tiny
    registry = HandleRegistry()
    with running_vllm_double(weight_transfer=False, rebuild=registry.rebuild) as server:
        with pytest.raises(WeightSyncError, match="--weight-transfer-config"):
            VLLMIpcSync(server.url, handle=registry.handle).sync(model, tok, step=1)
    with running_vllm_double(insecure_serialization=False, rebuild=registry.rebuild) as server:
        with pytest.raises(WeightSyncError, match="VLLM_ALLOW_INSECURE_SERIALIZATION=1"):
            VLLMIpcSync(server.url, handle=registry.handle).sync(model, tok, step=1)
        # the failed update was still closed: the next sync can start one
        assert transfer_calls(server)[-1] == "/finish_weight_update" and not server.updating


def test_a_model_off_the_gpu_is_refused_before_anything_is_sent(tiny):
    model, tok = tiny
    with running_vllm_double() as server:
        with pytest.raises(WeightSyncError, match="weightSync cudaIpc .* on cpu"):
            VLLMIpcSync(server.url).sync(model, tok, step=1)
        assert server.calls == []


def test_the_train_workload_picks_the_ipc_sync_for_a_cuda_ipc_spec(tiny, monkeypatch):
    from whale.core.spec import WhaleRunSpec
    from whale.workloads.train import make_sampling_backend

    model, tok = tiny
    monkeypatch.setenv("WHALE_INFERENCE_URL", "http://127.0.0.1:9/v1")
    monkeypatch.setenv("WHALE_SYNC_DIR", "/nonexistent")  # the colocated pod's folder: unused with cudaIpc
    spec = WhaleRunSpec.model_validate(
        {
            "domain": "synthetic",
            "condition": "rsft_only",
            "model": {"name": "Qwen/Qwen3-1.7B"},
            "schedule": {"totalSteps": 1},
            "inference": {"backend": "vllm", "placement": "colocated", "weightSync": "cudaIpc"},
        }
    )
    _, sync, lock = make_sampling_backend(spec, model, tok)
    assert isinstance(sync, VLLMIpcSync) and sync.base_url == "http://127.0.0.1:9" and lock is None
