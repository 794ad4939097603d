"""The LM head's loss: compiled against eager, and through the loss positions the host found."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from tests.fixtures.tolerance import assert_reordered_close  # noqa: E402
from whale.rsft import trainer as trainer_module  # noqa: E402
from whale.rsft.collate import IGNORE_INDEX, Example  # noqa: E402
from whale.rsft.config import RSFTConfig  # noqa: E402
from whale.rsft.trainer import (  # noqa: E402
    collate_tensors,
    compiled_head_cross_entropy,
    head_cross_entropy,
    prepare_model,
    token_loss_sum,
)

CPU = torch.device("cpu")


def tiny_qwen3(vocab: int = 128, hidden: int = 32, max_positions: int = 64) -> torch.nn.Module:
    """A two-layer Qwen3 with random weights (seeded), fp32."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(0)
    config = Qwen3Config(
        vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=hidden // 4, max_position_embeddings=max_positions,
    )  # fmt: skip
    return Qwen3ForCausalLM._from_config(config, dtype=torch.float32)


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
        # fused against eager: the loss sums the tokens' terms, each over the vocabulary's softmax
        assert_reordered_close(got, want, tokens * 97)
        for g, w in zip(got_grads, want_grads, strict=True):
            assert_reordered_close(g, w, tokens * 97)


def test_token_loss_sum_compiled_equals_eager_on_a_model_and_uses_the_compiled_function(monkeypatch):
    model = tiny_qwen3()
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
    assert_reordered_close(fused, eager, n_fused * 128)


def test_loss_positions_are_the_labelled_predictions_in_row_major_order():
    from whale.rsft.trainer import loss_positions

    labels = torch.tensor([[IGNORE_INDEX, IGNORE_INDEX, 5, 6], [IGNORE_INDEX, 7, IGNORE_INDEX, 8]])
    index, target, n = loss_positions(labels)
    # row 0 predicts 5 at t=1 and 6 at t=2; row 1 predicts 7 at t=0 and 8 at t=2 (width 4)
    assert index.tolist() == [1, 2, 4 + 0, 4 + 2] and target.tolist() == [5, 6, 7, 8] and n == 4


@pytest.mark.parametrize("pack", [False, True])
def test_the_hosts_loss_positions_give_the_loss_the_labels_give(pack):
    """collate_tensors finds the loss positions on the host (no GPU read-back to size a boolean mask); the
    loss through them equals the loss from the labels alone, padded and packed."""
    from whale.rsft.trainer import LOSS_INDEX, LOSS_TARGET, LOSS_TOKENS

    model = tiny_qwen3()
    ids = tuple(range(3, 20))
    examples = [
        Example(ids, (IGNORE_INDEX,) * 5 + ids[5:]),
        Example(ids[:9], (IGNORE_INDEX,) * 2 + ids[2:9]),
        Example(ids[:4], (IGNORE_INDEX,) * 4),  # no loss at all
    ]
    cfg = RSFTConfig(precision="fp32", pack_sequences=pack)
    prepare_model(model, cfg)  # packed rows: the document-masking attention kernel
    batch = collate_tensors(examples, cfg, 0, CPU)
    assert batch[LOSS_TOKENS] == 12 + 7 and batch[LOSS_TARGET].tolist() == list(ids[5:]) + list(ids[2:9])
    from_host, n_host = token_loss_sum(model, batch)
    labels_only = {k: v for k, v in batch.items() if k not in (LOSS_INDEX, LOSS_TARGET, LOSS_TOKENS)}
    from_labels, n_labels = token_loss_sum(model, labels_only)
    assert n_host == n_labels == 19
    torch.testing.assert_close(from_host, from_labels, rtol=0, atol=0)


@pytest.mark.gpu
def test_a_micro_batchs_forward_and_backward_never_wait_for_the_gpu():
    """Opt-in (--run-gpu): with the loss positions found on the host and the batch copied from pinned memory,
    the forward, the compiled loss and the backward of a packed micro-batch make no device-to-host sync, so
    the host prepares the next micro-batch while the GPU runs this one."""
    gpu = torch.device("cuda")
    model = tiny_qwen3(vocab=512, hidden=64, max_positions=512).to(gpu)
    cfg = RSFTConfig(precision="bf16", pack_sequences=True, compile_layers=True, pack_tokens=512)
    prepare_model(model, cfg)
    ids = tuple(range(3, 200))
    examples = [Example(ids, (IGNORE_INDEX,) * 50 + ids[50:]), Example(ids[:90], (IGNORE_INDEX,) * 9 + ids[9:90])]
    for attempt in range(2):  # the first compiles (compilation may read back); the second must not
        batch = collate_tensors(examples, cfg, 0, gpu)
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error" if attempt else "default")
        try:
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss, n = token_loss_sum(model, batch, compiled=True)
            loss.backward()
        finally:
            torch.cuda.set_sync_debug_mode("default")
        assert n == 147 + 81 and torch.isfinite(loss).item()
