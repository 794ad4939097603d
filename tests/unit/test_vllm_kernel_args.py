"""The vLLM arguments that keep a Qwen3.5 server alive where FlashInfer is not installed (issue #26)."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import pytest

from whale.inference.vllm_control import linear_attention_kernel_args


def test_without_flashinfer_the_server_is_asked_for_the_triton_gated_delta_kernels(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "flashinfer", None)  # as if absent, whatever this machine has
    assert linear_attention_kernel_args() == ("--gdn-prefill-backend", "triton")


def test_with_flashinfer_installed_vllm_keeps_its_own_choice(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    package = tmp_path / "flashinfer"
    package.mkdir()
    (package / "__init__.py").write_text("")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "flashinfer", raising=False)
    importlib.invalidate_caches()
    assert linear_attention_kernel_args() == ()
