"""Weight sync to a long-lived vLLM server, against a loopback *test double* of vLLM's dev-mode
control endpoints (``tests/fixtures/vllm_double.py``: CI has no GPU; the real server was measured
with ``benchmarks/weight_sync_vllm.py``).

The double records each request and checks, when asked to reload, that the folder the client
named holds a complete HF checkpoint: the contract the real server relies on."""

from __future__ import annotations

import pytest

from tests.fixtures.vllm_double import running_vllm_double
from whale.rsft.sync import SharedModelSync, VLLMReloadSync, WeightSyncError, save_for_serving

pytest.importorskip("transformers")

RELOAD = [("/collective_rpc", "reload_weights"), ("/reset_prefix_cache", None)]
LEGACY_RELOAD = [
    ("/collective_rpc", "update_config"),
    ("/collective_rpc", "reload_weights"),
    ("/reset_prefix_cache", None),
]


@pytest.fixture()
def double():
    with running_vllm_double() as server:
        yield server


@pytest.fixture(scope="module")
def tiny():
    from synthetic.tiny_model import build_model, build_tokenizer

    tok = build_tokenizer()
    return build_model(len(tok), seed=0), tok


def test_each_step_writes_a_checkpoint_and_asks_the_server_to_reload_it(double, tiny, tmp_path):
    model, tok = tiny
    sync = VLLMReloadSync(double.url, tmp_path / "local")  # the server sees the folder at the same path
    seconds = sync.sync(model, tok, step=1)
    sync.sync(model, tok, step=2)
    assert seconds > 0
    assert double.rpc_methods() == RELOAD * 2
    # two alternating folders: the one being written is never the one being served
    assert double.loaded == [str(tmp_path / "local" / "slot-1"), str(tmp_path / "local" / "slot-0")]


def test_an_older_server_is_pointed_at_the_folder_first_and_the_client_remembers(tiny, tmp_path):
    model, tok = tiny
    with running_vllm_double(legacy=True) as server:
        sync = VLLMReloadSync(server.url, tmp_path / "local")
        sync.sync(model, tok, step=1)
        sync.sync(model, tok, step=2)
        # one failed attempt with weights_path, then the old protocol from the start
        assert server.rpc_methods() == [("/collective_rpc", "reload_weights")] + LEGACY_RELOAD * 2
        assert server.loaded == [str(tmp_path / "local" / "slot-1"), str(tmp_path / "local" / "slot-0")]


def test_the_server_path_is_what_the_server_is_told(double, tiny, tmp_path):
    model, tok = tiny
    with pytest.raises(WeightSyncError, match="no checkpoint in /mnt/sync/slot-1.*failed too"):
        VLLMReloadSync(double.url, tmp_path / "local", server_dir="/mnt/sync").sync(model, tok, step=3)
    assert double.calls[0][1]["kwargs"] == {"weights_path": "/mnt/sync/slot-1"}


def test_a_server_without_dev_mode_gets_an_actionable_error(tiny, tmp_path):
    model, tok = tiny
    with running_vllm_double(dev_mode=False) as server, pytest.raises(WeightSyncError, match="VLLM_SERVER_DEV_MODE=1"):
        VLLMReloadSync(server.url, tmp_path).sync(model, tok, step=1)


def test_weights_are_written_in_the_serving_dtype_and_tied_tensors_once(tiny, tmp_path):
    import torch
    from safetensors import safe_open
    from transformers import AutoModelForCausalLM

    model, tok = tiny
    save_for_serving(model, tok, tmp_path / "bf16")
    save_for_serving(model, tok, tmp_path / "as-is", dtype=None)
    with safe_open(str(tmp_path / "bf16" / "model.safetensors"), "pt") as f:
        names = set(f.keys())
        assert {f.get_tensor(n).dtype for n in names} == {torch.bfloat16}
    assert model.config.tie_word_embeddings and "lm_head.weight" not in names
    assert (tmp_path / "bf16" / "model.safetensors").stat().st_size < 0.6 * (
        tmp_path / "as-is" / "model.safetensors"
    ).stat().st_size
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path / "bf16")
    for name, tensor in model.state_dict().items():
        assert torch.equal(loaded.state_dict()[name].to(torch.bfloat16), tensor.to(torch.bfloat16)), name
    assert model.dtype == torch.float32  # the trainer's master weights are untouched


def test_an_unreachable_server_names_the_url(tiny, tmp_path):
    model, tok = tiny
    with pytest.raises(WeightSyncError, match="cannot reach the inference server at http://127.0.0.1:9/"):
        VLLMReloadSync("http://127.0.0.1:9/v1", tmp_path, timeout_s=2).sync(model, tok, step=1)


def test_in_process_sharing_needs_no_sync(tiny):
    assert SharedModelSync().sync(*tiny, step=1) == 0.0
