"""The SFT step on a tiny real model: masked tokens carry no loss, token-mean normalisation,
no accepted trajectory = no change at all, packing = padding = maskless/bucketed padding."""

from __future__ import annotations

import copy

import pytest

torch = pytest.importorskip("torch")

from tests.fixtures.tolerance import assert_reordered_close, reorder_tol  # noqa: E402
from whale.rsft.collate import IGNORE_INDEX, encode_trajectory, pad_collate  # noqa: E402
from whale.rsft.config import RSFTConfig  # noqa: E402
from whale.rsft.rejection import Trajectory  # noqa: E402
from whale.rsft.trainer import SFTTrainer, token_loss_sum  # noqa: E402


@pytest.fixture(scope="module")
def tok():
    from synthetic.tiny_model import build_tokenizer

    return build_tokenizer()


@pytest.fixture()
def model(tok):
    from synthetic.tiny_model import build_model

    return build_model(len(tok), seed=0)


def examples(tok, n=6):
    out = []
    for i in range(n):
        msgs = (
            {"role": "system", "content": "Answer inside <answer></answer>."},
            {"role": "user", "content": f"Repeat the digit {i % 10}." + " pad" * i},
            {"role": "assistant", "content": f"<answer>{i % 10}</answer>"},
            {"role": "tool", "content": "observation " * (i + 1)},
            {"role": "assistant", "content": "done" * (1 + i % 3)},
        )
        out += encode_trajectory(tok, Trajectory(i, msgs, 1.0))
    return out


def trainer(model, tok, **kw):
    cfg = RSFTConfig(
        **{"mini_batch_size": 8, "micro_batch_size_per_gpu": 8, "learning_rate": 1e-3, "precision": "fp32", **kw}
    )
    return SFTTrainer(model, cfg, device=torch.device("cpu"), pad_id=tok.pad_token_id)


def test_masked_tokens_carry_no_loss(model, tok):
    exs = examples(tok, 3)
    batch = {k: torch.tensor(v) for k, v in pad_collate(exs, tok.pad_token_id).items()}
    seen = []
    hook = model.get_output_embeddings().register_forward_hook(lambda m, inp, out: seen.append(inp[0].shape[0]))
    loss, n = token_loss_sum(model, batch)
    hook.remove()
    # only the hidden states that predict an assistant token ever reach the LM head
    assert seen == [n] and n == sum(e.n_target for e in exs)
    # reference: every position's log-prob from the full logits, summed over the assistant tokens only
    with torch.no_grad():
        logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    logp = torch.log_softmax(logits[:, :-1].double(), -1)
    target = batch["labels"][:, 1:]
    ref = 0.0
    for b, t in zip(*torch.nonzero(target != IGNORE_INDEX, as_tuple=True), strict=True):
        ref -= float(logp[b, t, target[b, t]])
    # fp32 against float64 log-probs: the rounding of an n-term sum of vocab-wide log-sum-exps
    assert loss.item() == pytest.approx(ref, rel=reorder_tol(n * model.config.vocab_size))


def test_no_examples_leave_weights_and_optimizer_untouched(model, tok):
    before = copy.deepcopy(model.state_dict())
    tr = trainer(model, tok, weight_decay=0.1)
    stats = tr.train([], lr=1e-3, seed=0)
    masked_only = [e for e in examples(tok, 2)]
    masked_only = [type(e)(e.input_ids, (IGNORE_INDEX,) * len(e)) for e in masked_only]
    stats2 = tr.train(masked_only, lr=1e-3, seed=0)
    assert stats.updates == stats2.updates == 0 and stats.loss is None
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert tr.optimizer.state_dict()["state"] == {}


def test_training_moves_the_weights_and_lowers_the_loss(model, tok):
    tr = trainer(model, tok)
    exs = examples(tok)
    before = copy.deepcopy(model.state_dict())
    first = tr.train(exs, lr=1e-2, seed=0)
    for i in range(5):
        last = tr.train(exs, lr=1e-2, seed=i)
    assert first.updates == 1 and first.tokens == sum(e.n_target for e in exs)
    assert last.loss < first.loss
    assert any(not torch.equal(before[k], v) for k, v in model.state_dict().items())


def test_the_update_is_a_token_mean_whatever_the_micro_batch(tok):
    from synthetic.tiny_model import build_model

    exs = examples(tok)
    results = []
    # masked padding is the reference; dropping the mask (right padding, causal attention) or padding
    # to a bucket width must not change the loss or a gradient of the update
    for micro, pack, padding in [
        (8, False, "masked"),
        (1, False, "masked"),
        (3, True, "masked"),
        (3, False, "longest"),
        (3, False, "bucket"),
        (8, False, "bucket"),
    ]:
        m = build_model(len(tok), seed=0)
        tr = trainer(m, tok, micro_batch_size_per_gpu=micro, pack_sequences=pack, padding=padding, max_grad_norm=0.0)
        grads = []
        tr.optimizer.step = lambda *a, _m=m, _g=grads, **k: _g.append([p.grad.clone() for p in _m.parameters()])
        stats = tr.train(exs, lr=1e-3, seed=0)
        results.append((stats.loss, grads[0]))
    assert len({len(e) for e in exs}) > 1  # the micro-batches really are padded
    terms = sum(len(e) for e in exs)  # the update's tokens: what a weight's gradient sums over
    for loss, params in results[1:]:
        assert loss == pytest.approx(results[0][0], rel=reorder_tol(terms))
        for a, b in zip(params, results[0][1], strict=True):
            assert_reordered_close(a, b, terms)
