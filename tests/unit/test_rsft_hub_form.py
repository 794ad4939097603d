"""Checkpoints of the paper's models keep the hub's multimodal form (``whale.rsft.hub_form``): the train workload
trains Qwen3.5's language model alone, and vLLM 0.24 serves only ``Qwen3_5ForConditionalGeneration``, which every
later phase's server starts from. A checkpoint must be a drop-in for the hub's: its config, every tensor of the
source (the vision tower as it was, the language model as trained), and it loads back as the language model."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from tests.fixtures.models import folder_tensors as tensors  # noqa: E402
from tests.fixtures.models import load_tiny  # noqa: E402
from whale.rsft.checkpoint import materialise, save_checkpoint  # noqa: E402
from whale.rsft.hub_form import UNTRAINED_FILE  # noqa: E402
from whale.store import open_store  # noqa: E402
from whale.workloads.train import keep_hub_form  # noqa: E402


def trained_checkpoint(source: Path, tmp_path: Path, step: int) -> tuple[object, Path]:
    """Load the language model as the train workload does, change every weight, and checkpoint it."""
    model, tokenizer = load_tiny(source)
    keep_hub_form(model, str(source), {})
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.01 * torch.randn_like(p))
    store = open_store(str(tmp_path / "store"))
    folder = materialise(store, save_checkpoint(store, "run", step, model, tokenizer), tmp_path / "work")
    return model, folder


def logits(model, ids):
    with torch.no_grad():
        return model(ids).logits


def test_a_checkpoint_of_the_hub_form_is_in_the_hub_form(tiny_qwen35_hub_dir, tmp_path):
    from transformers import AutoModelForCausalLM, Qwen3_5ForConditionalGeneration

    model, folder = trained_checkpoint(tiny_qwen35_hub_dir, tmp_path, 1)
    config = json.loads((folder / "config.json").read_text())
    assert config["architectures"] == ["Qwen3_5ForConditionalGeneration"]
    assert "vision_config" in config and "linear_attention" in config["text_config"]["layer_types"]

    source, saved = tensors(tiny_qwen35_hub_dir), tensors(folder)
    assert set(saved) == set(source)  # every tensor of the hub's checkpoint, no other
    index = json.loads((folder / "model.safetensors.index.json").read_text())["weight_map"]
    assert set(index) == set(source)
    vision = [name for name in source if name.startswith("model.visual.")]
    assert vision and all(index[name] == UNTRAINED_FILE for name in vision)
    assert all(torch.equal(saved[name], source[name]) for name in vision)  # the tower as it was
    trained = "model.language_model.layers.0.linear_attn.in_proj_qkv.weight"
    assert not torch.equal(saved[trained], source[trained])  # the language model as trained
    processor = "preprocessor_config.json"  # a server builds its multimodal processor from it
    assert (folder / processor).read_bytes() == (tiny_qwen35_hub_dir / processor).read_bytes()

    ids = torch.randint(0, model.config.vocab_size, (1, 23))
    multimodal, info = Qwen3_5ForConditionalGeneration.from_pretrained(folder, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"]
    assert torch.allclose(logits(multimodal, ids), logits(model, ids), atol=1e-5)
    language = AutoModelForCausalLM.from_pretrained(folder)
    assert type(language).__name__ == "Qwen3_5ForCausalLM"
    assert torch.allclose(logits(language, ids), logits(model, ids), atol=1e-5)


def test_a_checkpoint_of_a_checkpoint_keeps_the_form(tiny_qwen35_hub_dir, tmp_path):
    _, first = trained_checkpoint(tiny_qwen35_hub_dir, tmp_path / "a", 1)
    _, second = trained_checkpoint(first, tmp_path / "b", 2)
    assert json.loads((second / "config.json").read_text())["architectures"] == ["Qwen3_5ForConditionalGeneration"]
    source, saved = tensors(tiny_qwen35_hub_dir), tensors(second)
    assert set(saved) == set(source)
    assert all(torch.equal(saved[n], source[n]) for n in source if n.startswith("model.visual."))
    assert (second / "preprocessor_config.json").read_bytes() == (
        tiny_qwen35_hub_dir / "preprocessor_config.json"
    ).read_bytes()


def test_a_text_only_model_is_checkpointed_as_it_is(tiny_qwen35_dir, tmp_path):
    model, folder = trained_checkpoint(tiny_qwen35_dir, tmp_path, 1)
    assert model.whale_hub_form is None
    assert json.loads((folder / "config.json").read_text())["architectures"] == ["Qwen3_5ForCausalLM"]
    assert not (folder / UNTRAINED_FILE).exists()
