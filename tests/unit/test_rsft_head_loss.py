"""The compiled LM-head cross-entropy (used with compiled decoder layers) against the eager one."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from whale.rsft import trainer as trainer_module  # noqa: E402
from whale.rsft.collate import IGNORE_INDEX, Example  # noqa: E402
from whale.rsft.config import RSFTConfig  # noqa: E402
from whale.rsft.trainer import (  # noqa: E402
    collate_tensors,
    compiled_head_cross_entropy,
    head_cross_entropy,
    token_loss_sum,
)

CPU = torch.device("cpu")


def test_compiled_head_loss_matches_eager_loss_and_gradients_over_varying_token_counts():
    torch.manual_seed(0)
    weight = torch.randn(97, 16, requires_grad=True)
    compiled = compiled_head_cross_entropy()
    assert compiled is compiled_head_cross_entropy()  # compiled once per process
    for tokens in (5, 13, 40):  # one dynamic graph serves every count
        hidden = torch.randn(tokens, 16, requires_grad=True)
        target = torch.randint(0, 97, (tokens,))
        got = compiled(hidden, weight, None, target)
        got_grads = torch.autograd.grad(got, (hidden, weight))
        want = head_cross_entropy(hidden, weight, None, target)
        want_grads = torch.autograd.grad(want, (hidden, weight))
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
        for g, w in zip(got_grads, want_grads, strict=True):
            torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5)


def test_token_loss_sum_compiled_equals_eager_on_a_model_and_uses_the_compiled_function(monkeypatch):
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(0)
    config = Qwen3Config(
        vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=8, max_position_embeddings=64,
    )  # fmt: skip
    model = Qwen3ForCausalLM._from_config(config, dtype=torch.float32)
    ids = tuple(range(3, 15))
    examples = [Example(ids, (IGNORE_INDEX,) * 4 + ids[4:]), Example(ids[:7], (IGNORE_INDEX,) * 2 + ids[2:7])]
    batch = collate_tensors(examples, RSFTConfig(precision="fp32"), 0, CPU)
    eager, n_eager = token_loss_sum(model, batch)
    calls: list[int] = []
    real = trainer_module.compiled_head_cross_entropy

    def counting():
        calls.append(1)
        return real()

    monkeypatch.setattr(trainer_module, "compiled_head_cross_entropy", counting)
    fused, n_fused = token_loss_sum(model, batch, compiled=True)
    assert calls == [1]
    assert n_fused == n_eager == 8 + 5
    torch.testing.assert_close(fused, eager, rtol=1e-5, atol=1e-5)
