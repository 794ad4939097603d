"""The paper's checkpoints are multimodal on the hub (``Qwen3_5ForConditionalGeneration``, the language model under
``model.language_model``); the train workload loads their language model (``Qwen3_5ForCausalLM``, ``model.*``).
Every weight sync must name tensors as the server loaded them, the hub's names: a folder reload and CUDA IPC in
the trainer's own names would address no parameter of the server's model. These checks run the real transformers
conversion on a tiny model in the hub's form."""

from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from tests.fixtures.models import folder_tensors as tensors  # noqa: E402
from tests.fixtures.models import load_tiny  # noqa: E402
from whale.rsft.sync import ServingFolderWriter, ipc_chunks, saved_names  # noqa: E402


def test_the_hub_form_loads_as_the_hybrid_language_model(tiny_qwen35_hub_dir):
    assert json.loads((tiny_qwen35_hub_dir / "config.json").read_text())["architectures"] == [
        "Qwen3_5ForConditionalGeneration"
    ]
    model, _ = load_tiny(tiny_qwen35_hub_dir)
    assert type(model).__name__ == "Qwen3_5ForCausalLM"
    assert "linear_attention" in model.config.layer_types
    assert any(k.startswith("model.layers.") for k in model.state_dict())


def test_sync_names_are_the_checkpoints_the_server_loaded(tiny_qwen35_hub_dir):
    model, _ = load_tiny(tiny_qwen35_hub_dir)
    hub = tensors(tiny_qwen35_hub_dir)
    names = saved_names(model, model.state_dict())
    assert names["model.layers.0.linear_attn.in_proj_qkv.weight"] == (
        "model.language_model.layers.0.linear_attn.in_proj_qkv.weight"
    )
    state = model.state_dict()
    assert model.config.tie_word_embeddings  # as the 2B's: the head is the embedding, saved once
    for loaded, saved in names.items():
        if loaded == "lm_head.weight":
            assert state[loaded].data_ptr() == state["model.embed_tokens.weight"].data_ptr()
            continue
        assert saved in hub, saved
        assert hub[saved].shape == state[loaded].shape
    # every language-model tensor of the hub is reached; only the vision tower is not
    missed = set(hub) - set(names.values())
    assert missed and all(k.startswith("model.visual.") for k in missed)


def test_cuda_ipc_chunks_carry_the_hub_names(tiny_qwen35_hub_dir):
    model, _ = load_tiny(tiny_qwen35_hub_dir)
    hub = tensors(tiny_qwen35_hub_dir)
    sent = dict(pair for chunk in ipc_chunks(model, chunk_bytes=1 << 12) for pair in chunk)
    assert sent and set(sent) <= set(hub)
    embed = "model.language_model.embed_tokens.weight"
    torch.testing.assert_close(sent[embed], model.model.embed_tokens.weight.detach().to(torch.bfloat16))


def test_the_per_step_write_replaces_only_the_weights_under_the_hub_names(tiny_qwen35_hub_dir, tmp_path):
    model, tokenizer = load_tiny(tiny_qwen35_hub_dir)
    writer = ServingFolderWriter(dtype=torch.float32, pin=False)
    folder = tmp_path / "slot"
    assert writer.write(model, tokenizer, folder) == "whole"
    config = (folder / "config.json").read_text()
    with torch.no_grad():
        model.model.layers[0].linear_attn.in_proj_qkv.weight.add_(1.0)
    # renamed on save, yet only the weights file is written again
    assert writer.write(model, tokenizer, folder) == "weights"
    assert (folder / "config.json").read_text() == config
    written = tensors(folder)
    torch.testing.assert_close(
        written["model.language_model.layers.0.linear_attn.in_proj_qkv.weight"],
        model.model.layers[0].linear_attn.in_proj_qkv.weight.detach(),
    )
    reloaded, _ = load_tiny(folder)
    for (name, got), want in zip(reloaded.state_dict().items(), model.state_dict().values(), strict=True):
        torch.testing.assert_close(got, want, msg=name)


def test_a_model_saved_under_its_own_names_keeps_them(tiny_qwen3_dir):
    model, _ = load_tiny(tiny_qwen3_dir)
    names = saved_names(model, model.state_dict())
    assert all(k == v for k, v in names.items())
