"""The varlen attention path (``rsft.packSequences`` + ``rsft.attention``): packed rows train exactly
like unpacked ones, the block mask marks exactly the blocks a sequence reaches, the flex kernel with it
equals dense document attention, and the model still generates as before."""

from __future__ import annotations

import random
import warnings

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

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
    return Qwen3ForCausalLM(
        Qwen3Config(
            vocab_size=97,
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=8,
            max_position_embeddings=1024,
            **config,
        )
    )


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

    assert torch.equal(create_mask(mask.mask_mod, 1, None, width, width)[0, 0], dense)


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
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)
    # and the trainer's CPU stand-in computes the same
    stand_in = attn._dense_document_attention(q, k, v, attn.document_block_mask(pos), None, True)
    torch.testing.assert_close(stand_in, expected, rtol=1e-5, atol=1e-5)


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
    assert cfg.attention_kernel == "flex" and batch["attention_mask"].shape == (1, 1, 1024, 1024)


def loss_and_grads(cfg: RSFTConfig, exs, **model_config):
    model = tiny_model(**model_config)
    prepare_model(model, cfg)
    loss, n = token_loss_sum(model, collate_tensors(exs, cfg, 0, CPU))
    loss.backward()
    return loss.item(), n, [p.grad.clone() for p in model.parameters()]


@pytest.mark.parametrize("attention,padding", [("flex", "longest"), ("auto", "bucket"), ("sdpa", "longest")])
def test_packed_rows_give_the_loss_and_gradients_of_unpacked_ones(attention, padding):
    exs = make_examples()
    ref_loss, ref_n, ref_grads = loss_and_grads(RSFTConfig(precision="fp32", padding="masked"), exs)
    cfg = RSFTConfig(precision="fp32", pack_sequences=True, attention=attention, padding=padding)
    loss, n, grads = loss_and_grads(cfg, exs)
    assert n == ref_n == sum(e.n_target for e in exs)
    assert loss == pytest.approx(ref_loss, rel=1e-6)
    for a, b in zip(grads, ref_grads, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


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
    # a hundred times the tolerance the exactness test allows (rel 1e-6)
    assert abs(leaky.item() - exact.item()) > 1e-4 * abs(exact.item())


def test_a_packed_trainer_makes_the_update_of_a_padded_one():
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
        )
        stats = SFTTrainer(model, cfg, device=CPU, pad_id=0).train(exs, lr=1e-2, seed=3)
        assert stats.updates == 2
        states.append((stats.loss, model.state_dict()))
    assert states[1][0] == pytest.approx(states[0][0], rel=1e-6)
    for key, value in states[0][1].items():
        torch.testing.assert_close(states[1][1][key], value, rtol=1e-5, atol=1e-6)
    assert not torch.equal(states[0][1]["model.norm.weight"], tiny_model().state_dict()["model.norm.weight"])


def test_the_model_still_generates_as_with_sdpa():
    """The flex implementation is SDPA for everything but packed training rows: in-process sampling shares
    the model, so a left-padded batch must decode the same tokens."""
    prompts = torch.tensor([[0, 0, 5, 6, 7], [1, 2, 3, 4, 5]])
    mask = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1]])
    outputs = []
    for pack in (False, True):
        model = tiny_model().eval()
        prepare_model(model, RSFTConfig(precision="fp32", pack_sequences=pack))
        assert model.config._attn_implementation == (attn.WHALE_FLEX if pack else "sdpa")
        outputs.append(
            model.generate(input_ids=prompts, attention_mask=mask, max_new_tokens=6, do_sample=False, pad_token_id=0)
        )
    assert torch.equal(outputs[0], outputs[1])


def test_attention_choices_fail_closed_with_the_fix():
    with pytest.raises(attn.AttentionConfigError, match="sliding-window"):
        prepare_model(
            tiny_model(use_sliding_window=True, sliding_window=16, max_window_layers=0),
            RSFTConfig(pack_sequences=True, attention="flex"),
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
        model = tiny_model().to(gpu)
        prepare_model(model, cfg)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss, _ = token_loss_sum(model, collate_tensors(exs, cfg, 0, gpu))
        losses.append(loss.item())
    ref = loss_and_grads(RSFTConfig(precision="fp32", padding="masked"), exs)[0]
    assert losses[0] == pytest.approx(ref, rel=2e-2) and losses[1] == pytest.approx(losses[0], rel=2e-2)


def test_the_spec_field_is_strict_and_reaches_the_config():
    from whale.manifest import parse_document
    from whale.protocol import WeightPhaseArgs
    from whale.spec import WhaleRunSpec

    base = {"domain": "synthetic", "condition": "rsft_only", "model": {"name": "m"}, "schedule": {"totalSteps": 4}}
    spec = WhaleRunSpec.model_validate({**base, "rsft": {"packSequences": True, "attention": "flex"}})
    args = WeightPhaseArgs(cycle=1, harness=None, from_checkpoint=None, from_step=0, target_step=1, steps_per_epoch=4)
    cfg = RSFTConfig.from_spec(spec, args)
    assert (cfg.attention, cfg.attention_kernel, cfg.pack_sequences) == ("flex", "flex", True)
    assert RSFTConfig.from_spec(WhaleRunSpec.model_validate(base), args).attention_kernel == "sdpa"
    doc = {
        "apiVersion": "whale.dev/v1alpha1",
        "kind": "WhaleRun",
        "metadata": {"name": "r"},
        "spec": {**base, "rsft": {"attention": "flex"}},
    }
    from whale.manifest import ManifestError

    with pytest.raises(ManifestError) as info:
        parse_document(doc)
    assert any("rsft" in p and "packSequences: true" in p for p in info.value.problems)
    doc["spec"]["rsft"] = {"packSequences": True, "attention": "xformers"}
    with pytest.raises(ManifestError) as info:
        parse_document(doc)
    assert any("rsft.attention" in p for p in info.value.problems)
