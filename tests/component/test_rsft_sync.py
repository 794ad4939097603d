"""Weight sync to a long-lived vLLM server, against a loopback *test double* of vLLM's dev-mode
control endpoints (``tests/fixtures/vllm_double.py``: CI has no GPU; the real server was measured
with ``benchmarks/weight_sync_vllm.py``).

The double records each request and checks, when asked to reload, that the folder the client
named holds a complete HF checkpoint: the contract the real server relies on."""

from __future__ import annotations

import pytest

from tests.fixtures.vllm_double import running_vllm_double
from whale.rsft.sync import (
    ServingFolderWriter,
    SharedModelSync,
    VLLMReloadSync,
    WeightSyncError,
    save_for_serving,
    serving_state,
)

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
    # the third step reuses slot-1: its weights file is replaced, nothing else (no temporary file left)
    before = sorted(p.name for p in (tmp_path / "local" / "slot-1").iterdir())
    sync.sync(model, tok, step=3)
    assert sorted(p.name for p in (tmp_path / "local" / "slot-1").iterdir()) == before
    assert double.loaded[-1] == str(tmp_path / "local" / "slot-1") and double.rpc_methods() == RELOAD * 3


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


def read_weights(folder):
    from safetensors import safe_open

    with safe_open(str(folder / "model.safetensors"), "pt") as f:
        return {name: f.get_tensor(name) for name in f.keys()}, f.metadata()  # noqa: SIM118 - safe_open is not iterable


def file_ids(folder):
    return {p.name: (p.stat().st_ino, p.stat().st_mtime_ns) for p in folder.iterdir()}


@pytest.fixture()
def trained(tiny):
    """A copy of the tiny model and one optimiser update to apply to it (the module's model stays as it is)."""
    import copy

    import torch

    model = copy.deepcopy(tiny[0])
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)

    def update():
        ids = torch.arange(12).reshape(2, 6)
        model(input_ids=ids, labels=ids).loss.backward()
        optimizer.step()
        optimizer.zero_grad()

    return model, update


def test_the_reused_folder_holds_what_save_pretrained_writes_and_takes_each_new_step(trained, tiny, tmp_path):
    import json

    import torch
    from transformers import AutoModelForCausalLM

    model, update = trained
    tok = tiny[1]
    writer = ServingFolderWriter()
    slot = tmp_path / "slot-1"
    assert writer.write(model, tok, slot) == "whole"
    first = {k: v.clone() for k, v in serving_state(model).items()}
    kept = {name: ids for name, ids in file_ids(slot).items() if name != "model.safetensors"}
    assert {"config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json"} <= kept.keys()

    update()  # the next step's weights
    assert writer.write(model, tok, slot) == "weights"
    save_for_serving(model, tok, tmp_path / "old")  # the old path, whole, of the same weights
    # the same files, the same config (bf16), the same tensor names (lm_head.weight tied, left out), metadata, tensors
    assert sorted(p.name for p in slot.iterdir()) == sorted(p.name for p in (tmp_path / "old").iterdir())
    assert json.loads((slot / "config.json").read_text()) == json.loads((tmp_path / "old" / "config.json").read_text())
    assert json.loads((slot / "config.json").read_text())["dtype"] == "bfloat16"
    new, new_meta = read_weights(slot)
    old, old_meta = read_weights(tmp_path / "old")
    assert new.keys() == old.keys() and "lm_head.weight" not in new and new_meta == old_meta
    assert all(torch.equal(new[k], old[k]) and new[k].dtype == torch.bfloat16 for k in new)
    # transformers loads the new step's weights exactly, not the first step's
    loaded = AutoModelForCausalLM.from_pretrained(slot, dtype=torch.bfloat16).state_dict()
    cast = serving_state(model)
    assert loaded.keys() == cast.keys()
    assert all(torch.equal(loaded[k], cast[k]) for k in cast)
    assert not torch.equal(loaded["model.embed_tokens.weight"], first["model.embed_tokens.weight"])
    # config, generation config and tokenizer were not rewritten (same inode, same mtime); no temporary file left
    assert {name: ids for name, ids in file_ids(slot).items() if name != "model.safetensors"} == kept
    assert model.dtype == torch.float32  # the trainer's master weights are untouched


def test_a_failed_weights_write_never_leaves_part_of_a_file_and_the_next_write_is_whole(
    trained, tiny, tmp_path, monkeypatch
):
    import torch

    import whale.rsft.sync as sync_module

    model, update = trained
    writer = ServingFolderWriter()
    slot = tmp_path / "slot-0"
    writer.write(model, tiny[1], slot)

    def crash(tensors, path, metadata=None):  # half a file written, then the process fails (disk full, a signal)
        with open(path, "wb") as f:
            f.write(b"x" * 100)
        raise OSError("no space left on device")

    update()
    monkeypatch.setattr(sync_module, "save_file", crash)
    with pytest.raises(OSError, match="no space"):
        writer.write(model, tiny[1], slot)
    # no weights file at all (a reload of this folder fails cleanly), and no half-written one under any name
    assert [p.name for p in slot.iterdir() if "safetensors" in p.name] == []
    monkeypatch.undo()
    # the next write sees the folder incomplete and writes it whole: the new weights, exactly
    assert writer.write(model, tiny[1], slot) == "whole"
    written, _ = read_weights(slot)
    cast = serving_state(model)
    assert written.keys() == cast.keys() - {"lm_head.weight"}
    assert all(torch.equal(written[k], cast[k]) for k in written)
    # and a folder removed behind the writer's back is written whole again
    import shutil

    shutil.rmtree(slot)
    assert writer.write(model, tiny[1], slot) == "whole" and (slot / "tokenizer.json").is_file()


def test_the_hybrid_qwen35_syncs_every_weight_and_serves_the_trainers_predictions(tiny_qwen35_dir, tmp_path):
    """Qwen3.5's linear-attention weights (conv1d, A_log, dt_bias, the gated norm, the four input projections)
    travel with the rest: the serving folder and the CUDA IPC chunks carry every tensor of the state dict, and a
    model loaded from the folder (the folder-sync path's server, here transformers on the CPU) predicts what
    the trainer's model predicts in bf16. The same against vLLM is a GPU measurement (docs/performance.md)."""
    import torch
    from safetensors import safe_open
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from whale.rsft.sync import ipc_chunks, save_for_serving

    model = AutoModelForCausalLM.from_pretrained(tiny_qwen35_dir, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(tiny_qwen35_dir)
    with torch.no_grad():  # a trained step: every weight moved, the linear layers' own ones included
        for p in model.parameters():
            p.add_(0.01 * torch.randn_like(p))
    names = set(model.state_dict())
    linear = {n for n in names if ".linear_attn." in n}
    assert {n.rsplit(".", 2)[-2] for n in linear} >= {"conv1d", "norm", "in_proj_qkv", "in_proj_z", "out_proj"}
    assert any(n.endswith("A_log") for n in linear) and any(n.endswith("dt_bias") for n in linear)
    sent = {name for chunk in ipc_chunks(model, chunk_bytes=4096) for name, _ in chunk}
    assert names - sent <= {"lm_head.weight"}  # tied to the embeddings: sent once, under their name
    folder = tmp_path / "served"
    save_for_serving(model, tokenizer, folder)
    with safe_open(str(folder / "model.safetensors"), "pt") as f:
        assert names - set(f.keys()) <= {"lm_head.weight"}
    served = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.bfloat16)
    prompt = torch.tensor([tokenizer.encode("Guess a number between 1 and 100.")])
    with torch.no_grad():
        want = model.to(torch.bfloat16)(prompt).logits.float().log_softmax(-1)
        got = served(prompt).logits.float().log_softmax(-1)
    assert torch.equal(got.argmax(-1), want.argmax(-1))
    torch.testing.assert_close(got, want, rtol=0, atol=0)  # the same bf16 weights, the same bf16 forward
