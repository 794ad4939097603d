"""The varlen attention path (``rsft.packSequences`` + ``rsft.attention``): packed rows train exactly
like unpacked ones (flex, varlen, sdpa; rows on the bucket ladder or of one fixed size, ``rsft.packTokens``),
the block mask marks exactly the blocks a sequence reaches, the varlen offsets are exactly the sequences,
the flex kernel with the mask equals dense document attention (the varlen kernel too, on a GPU), and the
model still generates as before."""

from __future__ import annotations

import random
import warnings

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from tests.fixtures.tolerance import assert_reordered_close, reorder_tol  # noqa: E402
from whale.core.convert import convert_v1alpha1  # noqa: E402
from whale.rsft import attention as attn  # noqa: E402
from whale.rsft.collate import IGNORE_INDEX, Example, collate_micro  # noqa: E402
from whale.rsft.config import RSFTConfig  # noqa: E402
from whale.rsft.trainer import SFTTrainer, collate_tensors, prepare_model, token_loss_sum  # noqa: E402

CPU = torch.device("cpu")
#: lengths that put boundaries inside blocks, sequences spanning several blocks, and one of a single block
LENGTHS = (150, 7, 300, 129, 64, 2, 256)


def tiny_model(seed: int = 0, **config):
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(seed)
    shape = {
        "vocab_size": 97,
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 8,
        "max_position_embeddings": 1024,
    }
    return Qwen3ForCausalLM(Qwen3Config(**{**shape, **config}))


def make_examples(lengths=LENGTHS, seed: int = 0) -> list[Example]:
    rng = random.Random(seed)
    out = []
    for n in lengths:
        ids = tuple(rng.randrange(97) for _ in range(n))
        labels = (IGNORE_INDEX,) + tuple(t if rng.random() < 0.7 else IGNORE_INDEX for t in ids[1:])
        out.append(Example(ids, labels))
    return out


def dense_document_mask(position_ids: torch.Tensor) -> torch.Tensor:
    doc = attn.document_ids(position_ids)[0]
    n = doc.numel()
    return (doc[:, None] == doc[None, :]) & torch.ones(n, n, dtype=torch.bool).tril()


def packed_positions(lengths, width) -> torch.Tensor:
    pos = [p for n in lengths for p in range(n)]
    return torch.tensor([pos + list(range(width - len(pos)))])


def kv_blocks(num: torch.Tensor, idx: torch.Tensor, n: int) -> torch.Tensor:
    """[nq, nk] bool of the blocks a (num, indices) pair lists."""
    out = torch.zeros(n, n, dtype=torch.bool)
    for q in range(n):
        out[q, idx[0, 0, q, : int(num[0, 0, q])].long()] = True
    return out


@pytest.mark.parametrize("lengths", [LENGTHS, (128, 128, 256), (1000,), (5, 3, 2, 1, 9)])
def test_the_block_mask_lists_exactly_the_blocks_a_sequence_reaches(lengths):
    width = -(-sum(lengths) // 128) * 128
    pos = packed_positions(lengths, width)
    mask = attn.document_block_mask(pos)
    dense = dense_document_mask(pos)
    n = width // 128
    tiles = dense.view(n, 128, n, 128).permute(0, 2, 1, 3)
    reached, whole = tiles.any(-1).any(-1), tiles.all(-1).all(-1)
    full = kv_blocks(mask.full_kv_num_blocks, mask.full_kv_indices, n)
    partial = kv_blocks(mask.kv_num_blocks, mask.kv_indices, n)
    assert torch.equal(full | partial, reached)  # no block a token needs is skipped, none is visited for nothing
    assert not (full & partial).any()
    # a full block skips the mask function: it must hold no masked pair (off the diagonal, all are whole)
    assert torch.equal(full, whole & ~torch.eye(n, dtype=torch.bool))
    # and the mask function is the document-causal mask, token by token
    from torch.nn.attention.flex_attention import create_mask

    # (create_mask's device defaults to cuda: the mask function's tensors live on the CPU here)
    assert torch.equal(create_mask(mask.mask_mod, 1, None, width, width, device="cpu")[0, 0], dense)


def test_the_flex_kernel_with_the_block_mask_is_dense_document_attention():
    from torch.nn.attention.flex_attention import flex_attention

    pos = packed_positions(LENGTHS, 1024)
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(1, 4, 1024, 8, generator=gen)
    k, v = torch.randn(1, 2, 1024, 8, generator=gen), torch.randn(1, 2, 1024, 8, generator=gen)
    with warnings.catch_warnings():  # the eager CPU kernel warns that it is not the fused one
        warnings.simplefilter("ignore")
        out = flex_attention(q, k, v, block_mask=attn.document_block_mask(pos), enable_gqa=True)
    expected = torch.nn.functional.scaled_dot_product_attention(
        q, k.repeat_interleave(2, 1), v.repeat_interleave(2, 1), attn_mask=dense_document_mask(pos)
    )
    assert_reordered_close(out, expected, terms=1024)
    # and the trainer's CPU stand-in computes the same
    stand_in = attn._dense_document_attention(q, k, v, attn.document_block_mask(pos), None, True)
    assert_reordered_close(stand_in, expected, terms=1024)


def test_mixed_dtypes_under_autocast_meet_in_the_autocast_dtype():
    """Qwen3's q/k come out of an fp32 RMSNorm while v is bf16 under autocast: SDPA casts them itself (an
    autocast op); flex attention does not (older torch refuses the mix, newer computes in the query's
    fp32, off the bf16 tensor cores), so the flex path casts to the autocast dtype first."""
    from torch.nn.attention.flex_attention import flex_attention

    pos = packed_positions((100, 28), 128)
    q = torch.randn(1, 4, 128, 8)
    k, v = torch.randn(1, 2, 128, 8), torch.randn(1, 2, 128, 8).bfloat16()
    mask = attn.document_block_mask(pos)
    with warnings.catch_warnings(), torch.autocast("cpu", dtype=torch.bfloat16):
        warnings.simplefilter("ignore")
        same = attn.one_dtype(q, k, v)
        assert {t.dtype for t in same} == {torch.bfloat16}
        out = flex_attention(*same, block_mask=mask, enable_gqa=True)
        layer_out, _ = attn.whale_flex_attention(torch.nn.Module(), q, k, v, mask, scaling=None)
    assert layer_out.dtype == torch.bfloat16 and layer_out.shape == (1, 128, 4, 8)
    torch.testing.assert_close(layer_out, out.transpose(1, 2), rtol=2e-2, atol=2e-2)
    assert {t.dtype for t in attn.one_dtype(q, k, v)} == {torch.bfloat16}  # no autocast: v's dtype
    assert {t.dtype for t in attn.one_dtype(q, k, v.float())} == {torch.float32}


def test_packed_collation_pads_to_the_flex_block_and_the_bucket_ladder():
    exs = make_examples()
    total = sum(len(e) for e in exs)  # 1008
    row = collate_micro(exs, 0, padding="longest", pack=True, multiple_of=128)
    assert len(row["input_ids"][0]) == 1024 and len(row["position_ids"][0]) == 1024
    assert row["position_ids"][0][total:] == list(range(1024 - total))  # the padding is a sequence of its own
    assert row["labels"][0][total:] == [IGNORE_INDEX] * (1024 - total)
    assert len(collate_micro(exs, 0, padding="longest", pack=True)["input_ids"][0]) == total
    bucket = collate_micro(exs, 0, padding="bucket", pack=True, per_octave=4, multiple_of=128)
    assert len(bucket["input_ids"][0]) == 1024  # the rung at or above 1008, already a multiple of 128
    assert (
        len(collate_micro(exs[:2], 0, padding="bucket", pack=True, per_octave=4, multiple_of=128)["input_ids"][0])
        == 256
    )
    cfg = RSFTConfig(precision="fp32", pack_sequences=True)
    batch = collate_tensors(exs, cfg, 0, CPU)
    full = batch["attention_mask"]["full_attention"]  # the full-attention layers' mask, by layer type
    assert cfg.attention_kernel == "flex" and full.shape == (1, 1, 1024, 1024)


def loss_and_grads(cfg: RSFTConfig, exs, **model_config):
    model = tiny_model(**model_config)
    prepare_model(model, cfg)
    loss, n = token_loss_sum(model, collate_tensors(exs, cfg, 0, CPU))
    loss.backward()
    return loss.item(), n, [p.grad.clone() for p in model.parameters()]


@pytest.mark.parametrize(
    "attention,padding,pack_tokens",
    [
        ("flex", "longest", None),
        ("auto", "bucket", None),
        ("sdpa", "longest", None),
        ("varlen", "longest", None),
        ("varlen", "bucket", None),
        ("varlen", "longest", 1500),
        ("varlen", "bucket", 1010),
        ("flex", "bucket", 1010),
    ],
)
def test_packed_rows_give_the_loss_and_gradients_of_unpacked_ones(attention, padding, pack_tokens):
    exs = make_examples()
    ref_loss, ref_n, ref_grads = loss_and_grads(RSFTConfig(precision="fp32", padding="masked"), exs)
    cfg = RSFTConfig(
        precision="fp32", pack_sequences=True, attention=attention, padding=padding, pack_tokens=pack_tokens
    )
    if pack_tokens:  # the row's width: its total (longest), or its rung (1024) capped at packTokens
        width = collate_tensors(exs, cfg, 0, CPU)["input_ids"].shape[1]
        assert width == {"longest": 908, "bucket": 1024 if attention == "flex" else 1010}[padding]
    loss, n, grads = loss_and_grads(cfg, exs)
    assert n == ref_n == sum(e.n_target for e in exs)
    terms = sum(len(e) for e in exs)  # the row's tokens: what a weight's gradient sums over
    assert loss == pytest.approx(ref_loss, rel=reorder_tol(terms))
    for a, b in zip(grads, ref_grads, strict=True):
        assert_reordered_close(a, b, terms)


def test_varlen_offsets_are_the_packed_sequences():
    lengths = (150, 7, 300, 1)
    pos = packed_positions(lengths, 512)  # padding: one more sequence of 54 positions
    mask = attn.varlen_mask(pos)
    assert mask.cu_seqlens.dtype == torch.int32
    assert mask.cu_seqlens.tolist() == [0, 150, 157, 457, 458, 512] and mask.max_len == 300
    two_rows = attn.varlen_mask(torch.cat([packed_positions((3, 5), 8), packed_positions((8,), 8)]))
    assert two_rows.cu_seqlens.tolist() == [0, 3, 8, 16] and two_rows.max_len == 8  # rows flatten end to end
    with pytest.raises(ValueError, match="first position id must be 0"):
        attn.varlen_mask(torch.tensor([[1, 0, 1]]))
    with pytest.raises(ValueError, match=r"\[batch, length\]"):
        attn.varlen_mask(torch.arange(4))


def test_the_varlen_stand_in_is_dense_document_attention():
    pos = packed_positions(LENGTHS, 1024)
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(1, 4, 1024, 8, generator=gen)
    k, v = torch.randn(1, 2, 1024, 8, generator=gen), torch.randn(1, 2, 1024, 8, generator=gen)
    out, _ = attn.whale_flex_attention(torch.nn.Module(), q, k, v, attn.varlen_mask(pos), scaling=None)
    expected = torch.nn.functional.scaled_dot_product_attention(
        q, k.repeat_interleave(2, 1), v.repeat_interleave(2, 1), attn_mask=dense_document_mask(pos)
    )
    assert out.shape == (1, 1024, 4, 8)
    assert_reordered_close(out, expected.transpose(1, 2), terms=1024)


def test_rows_filled_by_tokens_hold_every_sequence_once_within_the_budget():
    from whale.rsft.collate import micro_batches

    exs = make_examples() * 3
    micros = micro_batches(exs, 2, row_tokens=700)
    assert sorted(id(e) for m in micros for e in m) == sorted(id(e) for e in exs)
    assert all(sum(len(e) for e in m) <= 700 for m in micros)
    # first fit, longest first: no two micro-batches could have been one
    loads = sorted(sum(len(e) for e in m) for m in micros)
    assert loads[0] + loads[1] > 700 and len(micros) == -(-sum(len(e) for e in exs) // 700)
    # a sequence longer than the budget takes a row of its own; the other rows keep within it
    micros = micro_batches(exs, 2, row_tokens=200)
    assert sorted(id(e) for m in micros for e in m) == sorted(id(e) for e in exs)
    for m in micros:
        assert len(m) == 1 or sum(len(e) for e in m) <= 200
    assert [len(m[0]) for m in micros if len(m[0]) > 200] == sorted((len(e) for e in exs if len(e) > 200), reverse=True)


def test_the_check_sees_attention_across_a_boundary():
    """The same packed row under a causal mask that ignores the boundaries: a different loss, so the test
    above would catch a document mask that lets tokens see the sequence before theirs."""
    exs = make_examples()
    cfg = RSFTConfig(precision="fp32", pack_sequences=True)
    model = tiny_model()
    prepare_model(model, cfg)
    batch = collate_tensors(exs, cfg, 0, CPU)
    exact, _ = token_loss_sum(model, batch)
    width = batch["input_ids"].shape[1]
    batch["attention_mask"] = attn.document_block_mask(torch.arange(width)[None])  # one document: plain causal
    leaky, _ = token_loss_sum(model, batch)
    # over three times the tolerance the exactness test allows (reorder_tol(1024) = 3.1e-5; the leak: 3.2e-4)
    assert abs(leaky.item() - exact.item()) > 1e-4 * abs(exact.item())
    # and for varlen: offsets of one sequence over the whole row
    cfg = RSFTConfig(precision="fp32", pack_sequences=True, attention="varlen")
    model = tiny_model()
    prepare_model(model, cfg)
    batch = collate_tensors(exs, cfg, 0, CPU)
    assert token_loss_sum(model, batch)[0].item() == pytest.approx(exact.item(), rel=reorder_tol(width))
    batch["attention_mask"] = {"full_attention": attn.varlen_mask(torch.arange(batch["input_ids"].shape[1])[None])}
    assert abs(token_loss_sum(model, batch)[0].item() - exact.item()) > 1e-4 * abs(exact.item())


@pytest.mark.parametrize("attention,pack_tokens", [("auto", None), ("varlen", 800), ("flex", 640)])
def test_a_packed_trainer_makes_the_update_of_a_padded_one(attention, pack_tokens):
    """The loss is the token mean over each minibatch whatever its micro-batches: rows of a fixed token
    budget (a varying number of sequences each) make the same update as padded micro-batches of 3."""
    exs = make_examples() * 2
    states = []
    for pack in (False, True):
        model = tiny_model()
        cfg = RSFTConfig(
            precision="fp32",
            mini_batch_size=7,
            micro_batch_size_per_gpu=3,
            learning_rate=1e-2,
            pack_sequences=pack,
            padding="masked",
            attention=attention if pack else "auto",
            pack_tokens=pack_tokens,
        )
        stats = SFTTrainer(model, cfg, device=CPU, pad_id=0).train(exs, lr=1e-2, seed=3)
        assert stats.updates == 2
        states.append((stats.loss, model.state_dict()))
    assert states[1][0] == pytest.approx(states[0][0], rel=reorder_tol(sum(len(e) for e in exs)))
    # AdamW's step is about lr whatever the gradient, except for a gradient near zero, whose rounding decides
    # its step (measured: 9e-5 of a step per update, flex-640): the weights agree to 1% of the steps taken,
    # a wrong update moves them by whole steps
    for key, value in states[0][1].items():
        torch.testing.assert_close(states[1][1][key], value, rtol=0, atol=0.01 * 1e-2 * stats.updates)
    assert not torch.equal(states[0][1]["model.norm.weight"], tiny_model().state_dict()["model.norm.weight"])


@pytest.mark.parametrize("attention,implementation", [("flex", attn.WHALE_FLEX), ("varlen", attn.WHALE_VARLEN)])
def test_the_model_still_generates_as_with_sdpa(attention, implementation):
    """The flex and varlen implementations are SDPA for everything but packed training rows: in-process
    sampling shares the model, so a left-padded batch must decode the same tokens."""
    prompts = torch.tensor([[0, 0, 5, 6, 7], [1, 2, 3, 4, 5]])
    mask = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1]])
    outputs = []
    for pack in (False, True):
        model = tiny_model().eval()
        prepare_model(model, RSFTConfig(precision="fp32", pack_sequences=pack, attention=attention if pack else "auto"))
        assert model.config._attn_implementation == (implementation if pack else "sdpa")
        outputs.append(
            model.generate(input_ids=prompts, attention_mask=mask, max_new_tokens=6, do_sample=False, pad_token_id=0)
        )
    assert torch.equal(outputs[0], outputs[1])


def test_attention_choices_fail_closed_with_the_fix():
    for kernel in ("flex", "varlen"):
        with pytest.raises(attn.AttentionConfigError, match="sliding.*packSequences: false"):
            prepare_model(
                tiny_model(use_sliding_window=True, sliding_window=16, max_window_layers=0),
                RSFTConfig(pack_sequences=True, attention=kernel),
            )
    import importlib.util

    if importlib.util.find_spec("flash_attn") is None:
        with pytest.raises(attn.AttentionConfigError, match="flash-attn package"):
            prepare_model(tiny_model(), RSFTConfig(pack_sequences=True, attention="flash"))
    with pytest.raises(ValueError, match="multiple of the 128-block"):
        attn.document_block_mask(torch.arange(100)[None])
    model = tiny_model()
    prepare_model(model, RSFTConfig(pack_sequences=False, attention="auto"))
    assert model.config._attn_implementation == "sdpa"  # unpacked: left as loaded


@pytest.mark.gpu
def test_compiled_flex_layers_match_eager_on_the_gpu():
    gpu = torch.device("cuda")
    exs = make_examples(seed=1)
    losses = []
    for compile_layers in (False, True):
        cfg = RSFTConfig(precision="bf16", pack_sequences=True, compile_layers=compile_layers)
        model = tiny_model(head_dim=16).to(gpu)  # the compiled flex kernel needs a head dimension of 16 or more
        prepare_model(model, cfg)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss, _ = token_loss_sum(model, collate_tensors(exs, cfg, 0, gpu))
        losses.append(loss.item())
    ref = loss_and_grads(RSFTConfig(precision="fp32", padding="masked"), exs, head_dim=16)[0]
    assert losses[0] == pytest.approx(ref, rel=2e-2) and losses[1] == pytest.approx(losses[0], rel=2e-2)


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.filterwarnings("ignore:The .grad attribute of a Tensor that is not a leaf:UserWarning")  # dynamo's own
def test_compiled_varlen_layers_compile_once_for_every_row_layout():
    """The offsets reach the kernel outside the compiled graphs: rows of one width (here 1000 tokens each, the
    1024 rung) but different layouts reuse the first one's graphs, with the unpacked loss (the CPU stand-in
    runs where the GPU kernel would)."""
    from torch._dynamo.utils import counters

    layouts = [(150, 7, 300, 543), (600, 2, 9, 40, 349), (1000,), (5, 5, 5, 5, 5, 975)]
    cfg = RSFTConfig(precision="fp32", pack_sequences=True, attention="varlen", compile_layers=True, pack_tokens=1024)
    model = tiny_model()
    prepare_model(model, cfg)
    before = counters["stats"]["unique_graphs"]
    graphs = []
    for i, lengths in enumerate(layouts):
        exs = make_examples(lengths=lengths, seed=i)
        loss, _ = token_loss_sum(model, collate_tensors(exs, cfg, 0, CPU))
        loss.backward()
        graphs.append(counters["stats"]["unique_graphs"])
        ref = loss_and_grads(RSFTConfig(precision="fp32", padding="masked"), exs)[0]
        assert loss.item() == pytest.approx(ref, rel=reorder_tol(sum(lengths)))
    assert graphs[0] > before and graphs == [graphs[0]] * len(layouts), (before, graphs)


@pytest.mark.gpu
def test_the_varlen_kernel_is_dense_document_attention_on_the_gpu():
    """torch's flash varlen kernel (bf16) with the offsets of a packed row, GQA included: forward and the
    gradients of q, k and v against the dense document-causal attention in fp32 on the same bf16 inputs.

    The bound is FlashAttention's own test rule: the kernel's error may be at most twice that of the plain
    bf16 computation of the same attention (SDPA's math in bf16, the same mask) plus a few fp32 ulps. A fixed
    absolute tolerance (0.03) failed on an H200 for 4 of 262,144 elements (0.062): the kernel rounds the
    probabilities to bf16 before P·V and its backward sums over up to 300 keys, so its largest elementwise
    error scales with the values, not a constant."""
    gpu = torch.device("cuda")
    pos = packed_positions(LENGTHS, 1024)
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(1, 4, 1024, 64, generator=gen).bfloat16().to(gpu)
    k = torch.randn(1, 2, 1024, 64, generator=gen).bfloat16().to(gpu)
    v = torch.randn(1, 2, 1024, 64, generator=gen).bfloat16().to(gpu)
    mask = dense_document_mask(pos).to(gpu)
    results = {}
    for kernel, dtype in (("varlen", torch.bfloat16), ("dense", torch.float32), ("dense", torch.bfloat16)):
        qq, kk, vv = (t.detach().to(dtype).clone().requires_grad_(True) for t in (q, k, v))
        if kernel == "varlen":
            out, _ = attn.whale_flex_attention(torch.nn.Module(), qq, kk, vv, attn.varlen_mask(pos, gpu), scaling=None)
        else:
            with torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.MATH):
                out = torch.nn.functional.scaled_dot_product_attention(
                    qq, kk.repeat_interleave(2, 1), vv.repeat_interleave(2, 1), attn_mask=mask
                ).transpose(1, 2)
        out.float().square().sum().backward()
        results[(kernel, dtype)] = [t.detach().float() for t in (out, qq.grad, kk.grad, vv.grad)]
    reference = results[("dense", torch.float32)]
    for name, got, plain, want in zip(
        ("out", "dq", "dk", "dv"),
        results[("varlen", torch.bfloat16)],
        results[("dense", torch.bfloat16)],
        reference,
        strict=True,
    ):
        kernel_error = float((got - want).abs().max())
        plain_error = float((plain - want).abs().max())
        assert kernel_error <= 2 * plain_error + 4 * torch.finfo(torch.float32).eps * float(want.abs().max()), (
            name,
            kernel_error,
            plain_error,
        )


@pytest.mark.gpu
@pytest.mark.parametrize("pack_tokens", [None, 1536])
def test_compiled_varlen_layers_match_eager_on_the_gpu(pack_tokens):
    gpu = torch.device("cuda")
    exs = make_examples(seed=1)
    losses = []
    for compile_layers in (False, True):
        cfg = RSFTConfig(
            precision="bf16",
            pack_sequences=True,
            attention="varlen",
            compile_layers=compile_layers,
            pack_tokens=pack_tokens,
        )
        model = tiny_model(head_dim=16).to(gpu)
        prepare_model(model, cfg)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss, _ = token_loss_sum(model, collate_tensors(exs, cfg, 0, gpu))
        loss.backward()
        losses.append(loss.item())
    ref = loss_and_grads(RSFTConfig(precision="fp32", padding="masked"), exs, head_dim=16)[0]
    assert losses[0] == pytest.approx(ref, rel=2e-2) and losses[1] == pytest.approx(losses[0], rel=2e-2)


def test_the_spec_field_is_strict_and_reaches_the_config():
    from whale.core.protocol import WeightPhaseArgs
    from whale.core.spec import WhaleRunSpec
    from whale.manifest import parse_document

    base = {"domain": "synthetic", "condition": "rsft_only", "model": {"name": "m"}, "schedule": {"totalSteps": 4}}
    spec = WhaleRunSpec.model_validate({**base, "rsft": {"packSequences": True, "attention": "flex"}})
    args = WeightPhaseArgs(
        cycle=1, harness=None, from_checkpoint=None, from_step=0, target_step=1, steps_per_epoch=4, total_steps=4
    )
    cfg = RSFTConfig.from_spec(spec, args)
    assert (cfg.attention, cfg.attention_kernel, cfg.pack_sequences) == ("flex", "flex", True)
    assert RSFTConfig.from_spec(WhaleRunSpec.model_validate(base), args).attention_kernel == "sdpa"
    doc = convert_v1alpha1(
        {
            "apiVersion": "whale.dev/v1alpha1",
            "kind": "WhaleRun",
            "metadata": {"name": "r"},
            "spec": {**base, "rsft": {"attention": "flex"}},
        }
    )
    from whale.manifest import ManifestError

    with pytest.raises(ManifestError) as info:
        parse_document(doc)
    assert any("rsft" in p and "packSequences: true" in p for p in info.value.problems)
    doc["spec"]["experiment"]["rsft"] = {"attention": "varlen"}
    with pytest.raises(ManifestError) as info:
        parse_document(doc)
    assert any("rsft" in p and "packSequences: true" in p for p in info.value.problems)
    doc["spec"]["experiment"]["rsft"] = {"packTokens": 8192}
    with pytest.raises(ManifestError) as info:
        parse_document(doc)
    assert any("packTokens" in p and "packSequences: true" in p for p in info.value.problems)
    spec = WhaleRunSpec.model_validate(
        {**base, "rsft": {"packSequences": True, "attention": "varlen", "packTokens": 16384}}
    )
    cfg = RSFTConfig.from_spec(spec, args)
    assert (cfg.attention_kernel, cfg.pack_tokens, cfg.row_tokens) == ("varlen", 16384, 16384)
    doc["spec"]["experiment"]["rsft"] = {"packSequences": True, "attention": "xformers"}
    with pytest.raises(ManifestError) as info:
        parse_document(doc)
    assert any("rsft.attention" in p for p in info.value.problems)
