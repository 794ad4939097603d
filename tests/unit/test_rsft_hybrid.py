"""Qwen3.5's hybrid layers (gated delta-net linear attention + gated full attention) train exactly when
packed or padded: each sequence's loss and gradients are its unpacked, unpadded ones and do not change with
its neighbours (the linear layers' conv window and recurrent state restart at every sequence:
:mod:`whale.rsft.linear_attention`). The same checks, with the real GPU kernels (flash-linear-attention),
run under ``-m gpu``.

Tolerances: every comparison is of two fp32 computations of one sum, in another order; they are bounded
by :func:`fp32_tolerance` (tests.fixtures.tolerance: a few ulps times the square root of the number of terms),
not a fixed constant.
"""

from __future__ import annotations

import random

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from tests.fixtures.models import build_tiny_qwen35  # noqa: E402
from tests.fixtures.tolerance import reorder_tol  # noqa: E402
from whale.rsft import linear_attention as la  # noqa: E402
from whale.rsft.attention import AttentionConfigError, packing_problem  # noqa: E402
from whale.rsft.collate import IGNORE_INDEX, Example  # noqa: E402
from whale.rsft.config import RSFTConfig  # noqa: E402
from whale.rsft.trainer import collate_tensors, prepare_model, token_loss_sum  # noqa: E402

CPU = torch.device("cpu")
VOCAB = 97
#: boundaries inside conv windows and chunks (the chunked rule's 64), one-token and chunk-sized sequences
LENGTHS = (150, 7, 300, 129, 64, 2, 256)


def fp32_tolerance(reference: torch.Tensor, terms: int, dtype: torch.dtype = torch.float32) -> float:
    """The absolute gap allowed between two computations of ``reference`` that sum ``terms`` values in another
    order (:func:`tests.fixtures.tolerance.reorder_tol`, against the largest magnitude)."""
    return reorder_tol(terms, dtype) * max(float(reference.abs().max()), 1.0)


def make_examples(lengths=LENGTHS, seed: int = 0) -> list[Example]:
    rng = random.Random(seed)
    out = []
    for n in lengths:
        ids = tuple(rng.randrange(VOCAB) for _ in range(n))
        labels = (IGNORE_INDEX,) + tuple(t if rng.random() < 0.7 else IGNORE_INDEX for t in ids[1:])
        out.append(Example(ids, labels))
    return out


def loss_and_grads(cfg: RSFTConfig, examples, *, seed: int = 0, device=CPU, dtype=None, **shape):
    model = build_tiny_qwen35(VOCAB, seed=seed, **shape).to(device)
    prepare_model(model, cfg)
    batch = collate_tensors(examples, cfg, 0, device)
    with torch.autocast(device.type, dtype=dtype) if dtype else torch.autocast(device.type, enabled=False):
        loss, n = token_loss_sum(model, batch)
    loss.backward()
    return loss.detach().double(), n, [p.grad.detach().clone() for p in model.parameters()]


def unpacked_reference(examples, *, device=CPU, **shape):
    """The sum over sequences of each one's loss and gradients, every sequence alone (no padding)."""
    cfg = RSFTConfig(precision="fp32", padding="longest")
    parts = [loss_and_grads(cfg, [e], device=device, **shape) for e in examples]
    loss = sum(p[0] for p in parts)
    grads = [torch.stack(g).sum(0) for g in zip(*(p[2] for p in parts), strict=True)]
    return loss, sum(p[1] for p in parts), grads


def assert_same_training(actual, reference) -> None:
    (loss, n, grads), (ref_loss, ref_n, ref_grads) = actual, reference
    assert n == ref_n
    terms = sum(LENGTHS)
    assert abs(float(loss - ref_loss)) <= fp32_tolerance(ref_loss, terms)
    for got, want in zip(grads, ref_grads, strict=True):
        torch.testing.assert_close(got, want, rtol=0, atol=fp32_tolerance(want, terms))


@pytest.fixture(scope="module")
def reference():
    return unpacked_reference(make_examples())


def test_the_tiny_model_is_a_hybrid():
    model = build_tiny_qwen35(VOCAB)
    assert model.config.layer_types == ["linear_attention"] * 3 + ["full_attention"]
    assert la.linear_layer_count(model.config) == 3
    assert packing_problem(model.config) is None
    assert la.install(model) == 3 and la.install(model) == 3  # idempotent


@pytest.mark.parametrize(
    "attention,padding,pack_tokens",
    [
        ("auto", "longest", None),
        ("flex", "bucket", None),
        ("sdpa", "longest", None),
        ("varlen", "longest", None),
        ("varlen", "bucket", 1010),
        ("flex", "bucket", 1010),
    ],
)
def test_packed_rows_train_each_sequence_as_if_alone(reference, attention, padding, pack_tokens):
    cfg = RSFTConfig(
        precision="fp32", pack_sequences=True, attention=attention, padding=padding, pack_tokens=pack_tokens
    )
    assert_same_training(loss_and_grads(cfg, make_examples()), reference)


@pytest.mark.parametrize("padding", ["longest", "bucket", "masked"])
def test_padded_micro_batches_train_each_sequence_as_if_alone(reference, padding):
    cfg = RSFTConfig(precision="fp32", padding=padding, micro_batch_size_per_gpu=len(LENGTHS))
    assert_same_training(loss_and_grads(cfg, make_examples()), reference)


def _last_sequence_loss(cfg: RSFTConfig, before: list[Example], target: Example, *, whale_masks: bool = True) -> float:
    """The loss of ``target``'s tokens in a packed row after ``before`` (their labels dropped)."""
    silent = [Example(e.input_ids, (IGNORE_INDEX,) * len(e)) for e in before]
    model = build_tiny_qwen35(VOCAB)
    prepare_model(model, cfg)
    batch = collate_tensors([*silent, target], cfg, 0, CPU)
    if not whale_masks:  # the linear layers get no boundaries: transformers' own forward over the whole row
        batch["attention_mask"] = {**batch["attention_mask"], la.LINEAR_ATTENTION: None}
    with torch.no_grad():
        loss, _ = token_loss_sum(model, batch)
    return float(loss)


def test_a_sequence_loss_does_not_change_with_its_neighbours():
    cfg = RSFTConfig(precision="fp32", pack_sequences=True, attention="flex")
    first, second, target = make_examples((90, 70, 120), seed=3)
    alone = _last_sequence_loss(cfg, [], target)
    after_first = _last_sequence_loss(cfg, [first], target)
    after_both = _last_sequence_loss(cfg, [second, first], target)
    tolerance = fp32_tolerance(torch.tensor(alone), len(target))
    assert abs(after_first - alone) <= tolerance and abs(after_both - alone) <= tolerance
    # the same check sees the leak of the linear layers' own forward (conv window and state across the row)
    leaked = _last_sequence_loss(cfg, [first], target, whale_masks=False)
    assert abs(leaked - alone) > 100 * tolerance


def test_the_packed_conv_is_the_conv_of_each_sequence_alone():
    gen = torch.Generator().manual_seed(0)
    lengths = (5, 1, 9, 3)
    x = torch.randn(2, 6, sum(lengths), generator=gen)
    weight, bias = torch.randn(6, 4, generator=gen), torch.randn(6, generator=gen)
    pos = torch.tensor([[p for n in lengths for p in range(n)]] * 2)
    out = la.segment_conv1d(x, weight, bias, pos, torch.nn.functional.silu)
    pieces = []
    for piece in x.split(lengths, dim=-1):
        full = torch.nn.functional.conv1d(piece, weight.unsqueeze(1), bias, padding=3, groups=6)[..., : piece.shape[-1]]
        pieces.append(torch.nn.functional.silu(full))
    torch.testing.assert_close(out, torch.cat(pieces, dim=-1))


def test_boundaries_are_the_packed_sequences():
    pos = torch.tensor([[0, 1, 2, 0, 0, 1, 0, 1, 2, 3]])
    b = la.sequence_boundaries(pos)
    assert b.lengths == (3, 1, 2, 4) and b.cu_seqlens.tolist() == [0, 3, 4, 6, 10]
    with pytest.raises(ValueError, match="must start a sequence"):
        la.sequence_boundaries(torch.tensor([[1, 0, 1]]))


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.filterwarnings("ignore:The .grad attribute of a Tensor that is not a leaf:UserWarning")  # dynamo's own
def test_compiled_packed_layers_train_each_sequence_as_if_alone_and_compile_once(reference):
    """Compiled decoder layers: the unpacked training, and a second row layout of the same width reuses the
    graphs (the boundaries reach the gated delta rule outside the graph, so their values add no guard)."""
    from torch._dynamo.utils import counters

    cfg = RSFTConfig(
        precision="fp32",
        pack_sequences=True,
        attention="varlen",
        padding="bucket",
        compile_layers=True,
        pack_tokens=1024,
    )
    model = build_tiny_qwen35(VOCAB)
    prepare_model(model, cfg)
    graphs = []
    for lengths in ((150, 7, 300, 129, 64, 2, 256), (600, 2, 9, 40, 257)):  # 908 and 908 tokens: the 1024 rung
        examples = make_examples(lengths)
        model.zero_grad()
        loss, n = token_loss_sum(model, collate_tensors(examples, cfg, 0, CPU))
        loss.backward()
        graphs.append(counters["stats"]["unique_graphs"])
        if lengths == LENGTHS:
            actual = (loss.detach().double(), n, [p.grad.detach().clone() for p in model.parameters()])
            assert_same_training(actual, reference)
    assert graphs[1] == graphs[0]


def test_a_linear_layer_of_another_layout_is_refused_for_packing():
    model = build_tiny_qwen35(VOCAB)
    del model.model.layers[0].linear_attn.in_proj_z  # the layout of a layer whale does not know
    with pytest.raises(la.PackedLinearAttentionError, match=r"lacks in_proj_z.*packSequences: false"):
        prepare_model(model, RSFTConfig(pack_sequences=True))


def test_sliding_window_layers_are_refused_for_packing_with_the_fix():
    from transformers import Qwen3Config, Qwen3ForCausalLM

    config = Qwen3Config(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        use_sliding_window=True,
        sliding_window=16,
        max_window_layers=1,
    )
    assert "sliding_attention" in (config.layer_types or [])
    for attention in ("sdpa", "flex", "varlen"):
        with pytest.raises(AttentionConfigError, match=r"sliding_attention layers.*packSequences: false"):
            prepare_model(Qwen3ForCausalLM(config), RSFTConfig(pack_sequences=True, attention=attention))


def _relative_error(actual, reference) -> tuple[float, float]:
    """(|loss - reference| / tokens, ||grads - reference|| / ||reference||) over every parameter."""
    (loss, n, grads), (ref_loss, _, ref_grads) = actual, reference
    flat = torch.cat([g.double().flatten() for g in grads])
    ref = torch.cat([g.double().flatten() for g in ref_grads])
    return abs(float(loss - ref_loss)) / n, float((flat - ref).norm() / ref.norm())


@pytest.mark.gpu
@pytest.mark.timeout(900)  # a fresh machine autotunes and compiles fla's Triton and tilelang kernels first
@pytest.mark.parametrize("attention", ["flex", "varlen"])
def test_packed_rows_on_the_gpu_kernels_train_each_sequence_as_if_alone(attention):
    """flash-linear-attention's chunked rule with ``cu_seqlens`` in bf16 autocast, as the trainer runs, against
    the fp32 reference of every sequence alone. bf16 itself moves the gradients by a few per cent on this tiny
    model (measured on an H200: cosine 0.9987 to the bf16 run of each sequence alone), so the bound is that
    floor, measured in the same run: packing may add no more error than running each sequence alone in bf16
    through the same kernels. A leak across a boundary moves them by order one."""
    pytest.importorskip("fla")
    gpu = torch.device("cuda")
    examples = make_examples()
    wide = {"head_dim": 16, "linear_key_head_dim": 16, "linear_value_head_dim": 16}  # compiled flex: head dim >= 16
    exact = unpacked_reference(examples, device=gpu, **wide)
    cfg = RSFTConfig(precision="bf16", pack_sequences=True, attention=attention, compile_layers=True)
    packed = loss_and_grads(cfg, examples, device=gpu, dtype=torch.bfloat16, **wide)
    alone = RSFTConfig(precision="bf16", padding="longest")
    parts = [loss_and_grads(alone, [e], device=gpu, dtype=torch.bfloat16, **wide) for e in examples]
    floor = _relative_error(
        (sum(p[0] for p in parts), exact[1], [torch.stack(g).sum(0) for g in zip(*(p[2] for p in parts), strict=True)]),
        exact,
    )
    assert packed[1] == exact[1]
    loss_error, grad_error = _relative_error(packed, exact)
    # the mean token loss within a few bf16 roundings; the gradients no further off than bf16 alone puts them
    assert loss_error <= max(2 * floor[0], 4 * torch.finfo(torch.bfloat16).eps), (loss_error, floor)
    assert grad_error <= 2 * floor[1] + 1e-6, (grad_error, floor)
    assert floor[1] < 0.1  # the floor itself is bf16 rounding, not a broken reference
