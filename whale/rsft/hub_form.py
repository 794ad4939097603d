"""A checkpoint of a language model trained out of a multimodal checkpoint keeps that checkpoint's form.

The paper's models are multimodal on the hub (``Qwen3_5ForConditionalGeneration``: the language model under
``model.language_model``, a vision tower beside it); the train workload trains the language model alone
(``Qwen3_5ForCausalLM``). transformers saves that model's tensors back under the hub's names but writes the
language model's own config (``architectures: [Qwen3_5ForCausalLM]``, ``model_type: qwen3_5_text``), which vLLM
0.24 does not serve: its registry has only the multimodal architecture for Qwen3.5, and every later phase's server
starts from a checkpoint. So each checkpoint gets the source's config, with the trained language model's config
as its ``text_config``, and the source's tensors that training does not hold (the vision tower), copied into a file
of their own and named in the index: the folder is a drop-in for the hub's checkpoint (vLLM serves it; the train
workload loads the language model out of it as it did from the hub). The source's processor configs (the image and
video preprocessors') are copied too: vLLM 0.24 builds the multimodal processor at start-up and refuses a folder
without them (seen on the H200: ``Can't load image processor``).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["PROCESSOR_FILES", "UNTRAINED_FILE", "HubForm", "hub_form_of", "restore_hub_form"]

#: the file of a checkpoint that holds the source's tensors the language model does not (the vision tower)
UNTRAINED_FILE = "model-untrained.safetensors"
#: the trained tensors' file where ``save_pretrained`` wrote one file (renamed: beside a single file, the index
#: that names the untrained one would not be read)
TRAINED_FILE = "model-trained.safetensors"
INDEX_FILE = "model.safetensors.index.json"
SINGLE_FILE = "model.safetensors"
#: the processor configs a multimodal checkpoint carries beside its model (a server builds its processor from them)
PROCESSOR_FILES = ("preprocessor_config.json", "video_preprocessor_config.json", "processor_config.json")


@dataclass(frozen=True)
class HubForm:
    """What a checkpoint needs to be written in its source's form: the source's config and where each tensor the
    trained model does not hold lives in the source folder."""

    config: dict[str, Any]
    untrained: dict[str, Path]  # tensor name -> the source file that holds it
    processor: dict[str, bytes] = field(default_factory=dict)  # file name -> its bytes (:data:`PROCESSOR_FILES`)


def _tensor_files(folder: Path) -> dict[str, Path]:
    """Every tensor name of a safetensors checkpoint folder -> its file (the index, or the one file)."""
    index = folder / INDEX_FILE
    if index.is_file():
        weight_map = json.loads(index.read_text())["weight_map"]
        return {name: folder / file for name, file in weight_map.items()}
    single = folder / SINGLE_FILE
    if not single.is_file():
        return {}
    from safetensors import safe_open

    with safe_open(str(single), "pt") as f:
        return dict.fromkeys(f.keys(), single)


def hub_form_of(source: Path, model: Any, saved: Iterable[str]) -> HubForm | None:
    """The form to keep when ``model`` (a language model) was loaded out of the multimodal checkpoint at
    ``source``; None when the source is the model's own form (nothing to keep). ``saved``: the names the model's
    tensors are saved under (:func:`whale.rsft.sync.saved_names`)."""
    config_file = source / "config.json"
    if not config_file.is_file():
        return None
    config = json.loads(config_file.read_text())
    if "text_config" not in config or getattr(model.config, "model_type", None) == config.get("model_type"):
        return None
    written = set(saved)
    untrained = {name: file for name, file in _tensor_files(source).items() if name not in written}
    processor = {name: (source / name).read_bytes() for name in PROCESSOR_FILES if (source / name).is_file()}
    return HubForm(config, untrained, processor)


def _write_bytes(path: Path, data: bytes) -> None:
    """``data`` as ``path``, whole or not at all (a temporary file beside it, renamed over it)."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def _write_json(path: Path, value: Any) -> None:
    _write_bytes(path, (json.dumps(value, indent=2, sort_keys=True) + "\n").encode())


def restore_hub_form(folder: Path, form: HubForm) -> None:
    """After ``save_pretrained`` wrote the language model into ``folder``: its config becomes the source's, with
    the saved one as ``text_config``, the source's untrained tensors join it (:data:`UNTRAINED_FILE`, in the
    index), and so do its processor configs."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    saved_config = json.loads((folder / "config.json").read_text())
    text = {k: v for k, v in saved_config.items() if k not in ("architectures", "transformers_version")}
    config = {**form.config, "text_config": {**form.config.get("text_config", {}), **text}}
    if "dtype" in saved_config:  # the trained tensors' dtype: what a server loading the folder reads first
        config["dtype"] = saved_config["dtype"]
    if form.untrained:
        weight_map = {name: file.name for name, file in _tensor_files(folder).items()}
        if (folder / SINGLE_FILE).is_file():  # an index is read only where no single file is (transformers)
            os.replace(folder / SINGLE_FILE, folder / TRAINED_FILE)
            weight_map = dict.fromkeys(weight_map, TRAINED_FILE)
        tensors: dict[str, Any] = {}
        by_file: dict[Path, list[str]] = {}
        for name, file in form.untrained.items():
            by_file.setdefault(file, []).append(name)
        for file, names in by_file.items():
            with safe_open(str(file), "pt") as f:
                tensors.update({name: f.get_tensor(name) for name in names})
        tmp = folder / f".{UNTRAINED_FILE}.tmp"
        save_file(tensors, str(tmp), metadata={"format": "pt"})
        os.replace(tmp, folder / UNTRAINED_FILE)
        weight_map.update(dict.fromkeys(tensors, UNTRAINED_FILE))
        total = sum((folder / f).stat().st_size for f in set(weight_map.values()))
        _write_json(
            folder / INDEX_FILE, {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
        )
    for name, data in form.processor.items():
        _write_bytes(folder / name, data)
    _write_json(folder / "config.json", config)
