"""The in-process transformers backend: batching, n samples, token accounting, sharing weights with
a trainer (sampling follows in-place weight updates), training mode preserved."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from tests.fixtures.models import load_tiny
from whale.inference.base import InferenceError, SamplingParams
from whale.inference.transformers_backend import TransformersClient

MESSAGES = [{"role": "system", "content": "You play."}, {"role": "user", "content": "Guess a number"}]


@pytest.fixture()
def fresh(tiny_qwen3_dir: Path) -> tuple[Any, Any]:
    """A private copy of the tiny model (these tests change weights or wrap generate)."""
    return load_tiny(tiny_qwen3_dir)


async def test_concurrent_requests_share_one_generate_call(fresh: tuple[Any, Any]) -> None:
    model, tokenizer = fresh
    calls: list[int] = []
    original = model.generate

    def counting_generate(**kwargs: Any) -> Any:
        calls.append(kwargs["input_ids"].shape[0])
        return original(**kwargs)

    model.generate = counting_generate
    client = TransformersClient(model, tokenizer, max_batch_size=8, batch_wait_s=0.2)
    sampling = SamplingParams(max_tokens=5)
    try:
        results = await asyncio.gather(*[client.chat(MESSAGES, sampling, n=2) for _ in range(4)])
    finally:
        await client.aclose()
    assert calls == [8]
    for result in results:
        assert len(result.completions) == 2
        assert result.prompt_tokens > 0
        assert result.completion_tokens == sum(len(c.token_ids or []) for c in result.completions)
        assert all(c.completion_tokens <= 5 for c in result.completions)


async def test_different_sampling_params_are_not_mixed_in_a_batch(fresh: tuple[Any, Any]) -> None:
    model, tokenizer = fresh
    seen: list[tuple[int, bool]] = []
    original = model.generate

    def spy(**kwargs: Any) -> Any:
        seen.append((kwargs["input_ids"].shape[0], kwargs["do_sample"]))
        return original(**kwargs)

    model.generate = spy
    client = TransformersClient(model, tokenizer, max_batch_size=8, batch_wait_s=0.2)
    try:
        await asyncio.gather(
            client.chat(MESSAGES, SamplingParams(temperature=0.0, max_tokens=3)),
            client.chat(MESSAGES, SamplingParams(temperature=1.0, max_tokens=3)),
            client.chat(MESSAGES, SamplingParams(temperature=0.0, max_tokens=3)),
        )
    finally:
        await client.aclose()
    assert sorted(seen) == [(1, True), (2, False)]


async def test_sampling_follows_weights_changed_in_place_by_a_trainer(fresh: tuple[Any, Any]) -> None:
    import torch

    model, tokenizer = fresh
    model.train()  # a trainer's model
    client = TransformersClient(model, tokenizer, max_batch_size=4)
    greedy = SamplingParams(temperature=0.0, max_tokens=4)
    try:
        before = (await client.chat(MESSAGES, greedy)).completions[0]
        target = tokenizer.convert_tokens_to_ids("<|im_end|>")
        with client.lock, torch.no_grad():  # an "optimizer step" that makes the stop token win
            model.lm_head.weight[target] += 50.0 * model.model.norm.weight.sign()
        after = (await client.chat(MESSAGES, greedy)).completions[0]
    finally:
        await client.aclose()
    assert model.training is True
    assert before.finish_reason == "length" and before.completion_tokens == 4
    assert (after.finish_reason, after.message["content"], after.token_ids) == ("stop", "", [target])


async def test_tool_calls_are_parsed_when_tools_are_offered(fresh: tuple[Any, Any]) -> None:
    model, tokenizer = fresh
    client = TransformersClient(model, tokenizer)
    assert client.tool_parser == "hermes"  # the tiny Qwen3 template writes hermes blocks
    text = 'ok<tool_call>{"name": "hint", "arguments": {}}</tool_call>'
    ids = tokenizer(text, add_special_tokens=False)["input_ids"] + [tokenizer.convert_tokens_to_ids("<|im_end|>")]
    completion = client._completion(ids, tools=[])
    assert completion.finish_reason == "tool_calls"
    assert completion.message["content"] == "ok"
    assert completion.message["tool_calls"][0]["function"] == {"name": "hint", "arguments": "{}"}
    assert "tool_calls" not in client._completion(ids, tools=None).message


async def test_qwen3_coder_tool_calls_with_the_parser_named(fresh: tuple[Any, Any]) -> None:
    model, tokenizer = fresh
    client = TransformersClient(model, tokenizer, tool_parser="qwen3_coder")
    tools = [
        {
            "type": "function",
            "function": {"name": "guess", "parameters": {"type": "object", "properties": {"n": {"type": "integer"}}}},
        }
    ]
    end = [tokenizer.convert_tokens_to_ids("<|im_end|>")]
    text = "try\n<tool_call>\n<function=guess>\n<parameter=n>\n7\n</parameter>\n</function>\n</tool_call>"
    completion = client._completion(tokenizer(text, add_special_tokens=False)["input_ids"] + end, tools=tools)
    assert completion.finish_reason == "tool_calls" and completion.message["content"] == "try"
    assert completion.message["tool_calls"][0]["function"] == {"name": "guess", "arguments": '{"n": 7}'}
    broken = "<tool_call>\n<function=>\n</function>\n</tool_call>"
    plain = client._completion(tokenizer(broken, add_special_tokens=False)["input_ids"] + end, tools=tools)
    assert (plain.finish_reason, plain.message) == ("stop", {"role": "assistant", "content": broken})
    with pytest.raises(ValueError, match="unknown tool-call parser"):
        TransformersClient(model, tokenizer, tool_parser="mistral")


async def test_a_broken_chat_template_is_an_inference_error(fresh: tuple[Any, Any]) -> None:
    model, tokenizer = fresh
    tokenizer.chat_template = "{{ raise_exception('no') }}"
    client = TransformersClient(model, tokenizer)
    try:
        with pytest.raises(InferenceError, match="chat template failed"):
            await client.chat(MESSAGES, SamplingParams(max_tokens=2))
    finally:
        await client.aclose()


async def test_one_bad_prompt_fails_only_its_own_request(fresh: tuple[Any, Any]) -> None:
    model, tokenizer = fresh
    client = TransformersClient(model, tokenizer, max_batch_size=8, batch_wait_s=0.2)
    bad = [{"role": "user", "content": "x " * 5000}]  # longer than the tiny model's 4096 positions
    try:
        good, failed = await asyncio.gather(
            client.chat(MESSAGES, SamplingParams(max_tokens=2)),
            client.chat(bad, SamplingParams(max_tokens=2)),
            return_exceptions=True,
        )
    finally:
        await client.aclose()
    assert len(good.completions) == 1
    assert isinstance(failed, InferenceError)


async def test_the_hybrid_qwen35_generates_before_and_after_the_trainer_prepares_it(tiny_qwen35_dir: Path) -> None:
    """Qwen3.5's linear-attention layers generate with their recurrent cache in the in-process backend, and
    still do once the trainer has swapped in its packed path (which only a packed row's boundaries take): the
    same greedy tokens, batched with a padded neighbour or alone."""
    from whale.rsft.config import RSFTConfig
    from whale.rsft.trainer import prepare_model

    model, tokenizer = load_tiny(tiny_qwen35_dir)
    assert model.config.layer_types.count("linear_attention") == 3
    greedy = SamplingParams(temperature=0.0, max_tokens=6)
    longer = [*MESSAGES[:1], {"role": "user", "content": "Guess a number between 1 and 100, then say why"}]
    client = TransformersClient(model, tokenizer, max_batch_size=4, batch_wait_s=0.2)
    try:
        alone = (await client.chat(MESSAGES, greedy)).completions[0]
        prepare_model(model, RSFTConfig(pack_sequences=True))
        batched, _ = await asyncio.gather(client.chat(MESSAGES, greedy), client.chat(longer, greedy))
    finally:
        await client.aclose()
    assert alone.completion_tokens == 6 or alone.finish_reason == "stop"
    assert batched.completions[0].token_ids == alone.token_ids
