"""``model.enableThinking`` reaches every request: the HTTP client sends vLLM's
``chat_template_kwargs`` (recorded by a server double), the project's OpenAI-compatible server passes
them to the in-process backend (a tiny real model with a Qwen3.5-style thinking template), the
in-process backend renders with them, and RSFT's trajectories carry them for re-rendering."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from tests.fixtures.servers import FailureServerDouble
from tests.fixtures.thinking import THINKING_TEMPLATE
from whale.core.spec import WhaleRunSpec
from whale.inference.factory import make_client, sampling_for
from whale.inference.openai_http import OpenAIClient
from whale.inference.server import create_app, serve_in_thread
from whale.inference.transformers_backend import TransformersClient

MESSAGES = [{"role": "user", "content": "Guess a number between 1 and 100."}]


def run_spec(**model: Any) -> WhaleRunSpec:
    return WhaleRunSpec.model_validate(
        {
            "domain": "synthetic",
            "condition": "rsft_only",
            "model": {"name": "m", **model},
            "schedule": {"totalSteps": 1},
            "inference": {"backend": "openai"},
            "rsft": {"sampling": {"maxResponseTokens": 64, "episodeTokenBudget": 100}},
        }
    )


@pytest.mark.parametrize("thinking", [True, False])
async def test_every_http_request_carries_enable_thinking(failures: FailureServerDouble, thinking: bool) -> None:
    spec = run_spec(enableThinking=thinking)
    client = make_client(spec, environ={"WHALE_INFERENCE_URL": failures.url})
    assert isinstance(client, OpenAIClient) and client.max_model_len == spec.experiment.model.max_model_len
    async with client:
        await client.chat(MESSAGES, sampling_for(spec), n=2)
        await client.chat(MESSAGES, sampling_for(spec, temperature=0.0))
    assert [r["chat_template_kwargs"] for r in failures.requests] == [{"enable_thinking": thinking}] * 2
    # the episode budget is the runner's business: never sent to the server
    assert all("episode" not in "".join(r) for r in failures.requests)
    assert failures.requests[0]["max_tokens"] == 64


def test_the_default_is_the_papers_thinking_on() -> None:
    spec = run_spec()
    assert spec.experiment.model.enable_thinking is True and spec.execution.inference.reasoning_parser is None
    assert sampling_for(spec).template_kwargs == {"enable_thinking": True}


@pytest.fixture(scope="module")
def thinking_client(tiny_qwen3_dir) -> TransformersClient:
    from tests.fixtures.models import load_tiny

    model, tok = load_tiny(tiny_qwen3_dir)
    tok.chat_template = THINKING_TEMPLATE
    return TransformersClient(model, tok, max_batch_size=4, model_name="tiny-thinking")


async def test_in_process_backend_renders_with_the_requests_kwargs(thinking_client: TransformersClient) -> None:
    on = sampling_for(run_spec(enableThinking=True))
    off = sampling_for(run_spec(enableThinking=False))
    assert thinking_client.render(MESSAGES, None, on.template_kwargs).endswith("assistant\n<think>\n")
    assert thinking_client.render(MESSAGES, None, off.template_kwargs).endswith("<think>\n\n</think>\n\n")
    counted = (
        await thinking_client.count_prompt_tokens(MESSAGES, None, on),
        await thinking_client.count_prompt_tokens(MESSAGES, None, off),
    )
    result_on = await thinking_client.chat(MESSAGES, dataclasses.replace(on, max_tokens=2))
    result_off = await thinking_client.chat(MESSAGES, dataclasses.replace(off, max_tokens=2))
    assert (result_on.prompt_tokens, result_off.prompt_tokens) == counted
    assert counted[1] > counted[0]  # the empty think block is in the prompt only with thinking off


async def test_the_openai_compatible_server_passes_the_kwargs_through(thinking_client: TransformersClient) -> None:
    with serve_in_thread(create_app(thinking_client, "tiny-thinking")) as url:
        async with OpenAIClient(url, model="tiny-thinking") as http:
            prompts = {}
            for thinking in (True, False):
                sampling = sampling_for(run_spec(enableThinking=thinking))
                result = await http.chat(MESSAGES, dataclasses.replace(sampling, max_tokens=2))
                prompts[thinking] = result.prompt_tokens
    on = sampling_for(run_spec(enableThinking=True))
    off = sampling_for(run_spec(enableThinking=False))
    assert prompts == {
        True: await thinking_client.count_prompt_tokens(MESSAGES, None, on),
        False: await thinking_client.count_prompt_tokens(MESSAGES, None, off),
    }
    assert prompts[False] > prompts[True]


def test_rsft_trajectories_carry_the_kwargs_generation_used(thinking_client: TransformersClient) -> None:
    from tests.fixtures.guess_domain import GuessNumberDomainDouble
    from whale.rsft.sampling import HarnessSampler

    domain = GuessNumberDomainDouble()
    with HarnessSampler(
        domain, domain.h0_path(), thinking_client, sampling_for(run_spec(enableThinking=False))
    ) as sampler:
        [trajectory] = sampler.sample([domain.items[0]], [0], rollouts=1, seed=0)
    assert trajectory.template_kwargs == {"enable_thinking": False}
