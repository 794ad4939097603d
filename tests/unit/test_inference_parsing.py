"""Request building and response parsing of the inference clients (pure), and backend choice."""

from __future__ import annotations

import json

import pytest

from whale.core.spec import WhaleRunSpec
from whale.inference.base import InferenceError, SamplingParams
from whale.inference.factory import backend_kind, inference_url
from whale.inference.openai_http import OpenAIClient, parse_response
from whale.inference.toolcalls import assistant_message, parse_tool_calls, parser_for_template


def test_sampling_params_reject_bad_values() -> None:
    with pytest.raises(ValueError, match="top_p"):
        SamplingParams(top_p=0)
    with pytest.raises(ValueError, match="temperature"):
        SamplingParams(temperature=-1)


async def test_request_body_carries_sampling_n_tools_and_top_k() -> None:
    client = OpenAIClient("http://127.0.0.1:9/v1", model="m")
    tools = [{"type": "function", "function": {"name": "search"}}]
    body = client.request_body(
        [{"role": "user", "content": "q"}], SamplingParams(0.7, 0.9, 20, 64, seed=3, stop=("</a>",)), 4, tools
    )
    assert body == {
        "model": "m",
        "messages": [{"role": "user", "content": "q"}],
        "n": 4,
        "temperature": 0.7,
        "top_p": 0.9,
        "max_tokens": 64,
        "top_k": 20,
        "seed": 3,
        "stop": ["</a>"],
        "tools": tools,
    }
    assert "top_k" not in client.request_body([], SamplingParams(top_k=-1), 1, None)
    await client.aclose()


def test_parse_response_orders_choices_and_splits_usage() -> None:
    body = {
        "choices": [
            {"index": 1, "message": {"content": "b"}, "finish_reason": "length"},
            {"index": 0, "message": {"content": None, "tool_calls": [{"id": "x"}]}, "finish_reason": "tool_calls"},
        ],
        "usage": {"prompt_tokens": 11, "completion_tokens": 7},
    }
    result = parse_response(body, 0.5)
    assert [c.message for c in result.completions] == [
        {"role": "assistant", "content": "", "tool_calls": [{"id": "x"}]},
        {"role": "assistant", "content": "b"},
    ]
    assert (result.prompt_tokens, result.completion_tokens) == (11, 7)
    assert [c.completion_tokens for c in result.completions] == [4, 3]


def test_parse_response_counts_each_choice_by_its_own_token_ids() -> None:
    """Choices of one request stop at different lengths: with every choice's token ids adding up to the usage, each
    completion counts its own (the even split gave a choice that stopped at once as many as a long one)."""
    body = {
        "choices": [
            {"index": 0, "message": {"content": "a"}, "finish_reason": "stop", "token_ids": [5, 2]},
            {"index": 1, "message": {"content": "bbb"}, "finish_reason": "length", "token_ids": [6, 6, 6, 6, 6, 6]},
        ],
        "usage": {"prompt_tokens": 3, "completion_tokens": 8},
    }
    result = parse_response(body, 0.1)
    assert [c.completion_tokens for c in result.completions] == [2, 6]
    assert result.completion_tokens == 8
    # ids that do not add up to the usage (a server that leaves the stop token out): the usage, split as before
    body["usage"] = {"prompt_tokens": 3, "completion_tokens": 10}
    assert [c.completion_tokens for c in parse_response(body, 0.1).completions] == [5, 5]


def test_parse_response_without_choices_is_an_inference_error() -> None:
    with pytest.raises(InferenceError, match="no choices"):
        parse_response({"error": "x"}, 0.0)


def test_parse_hermes_tool_calls() -> None:
    text = 'Let me look.<tool_call>\n{"name": "search", "arguments": {"query": "whale"}}\n</tool_call><tool_call>garbage</tool_call>'
    calls = parse_tool_calls(text)
    assert len(calls) == 1 and calls[0]["function"] == {"name": "search", "arguments": '{"query": "whale"}'}


GUESS_TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "guess",
            "parameters": {
                "type": "object",
                "properties": {
                    "n": {"type": "integer"},
                    "p": {"type": "number"},
                    "sure": {"type": "boolean"},
                    "tags": {"type": "array"},
                    "note": {"type": "string"},
                },
            },
        },
    }
]
CODER_CALL = (
    "I will guess.\n<tool_call>\n<function=guess>\n<parameter=n>\n7\n</parameter>\n<parameter=p>\n0.5\n"
    '</parameter>\n<parameter=sure>\nTrue\n</parameter>\n<parameter=tags>\n["a", "b"]\n</parameter>\n'
    "<parameter=note>\n  two\nlines\n</parameter>\n</function>\n</tool_call>"
)


def test_parse_qwen3_coder_tool_calls_typed_by_the_tool_schema() -> None:
    message = assistant_message(CODER_CALL, "qwen3_coder", GUESS_TOOLS)
    assert message["content"] == "I will guess."
    [call] = message["tool_calls"]
    assert call["function"]["name"] == "guess"
    assert json.loads(call["function"]["arguments"]) == {
        "n": 7,
        "p": 0.5,
        "sure": True,
        "tags": ["a", "b"],
        "note": "  two\nlines",
    }
    # without schemas every value stays text (as vLLM does); auto reads the block the same way
    untyped = parse_tool_calls(CODER_CALL)
    assert json.loads(untyped[0]["function"]["arguments"])["n"] == "7"


def test_qwen3_coder_several_calls_and_a_missing_close_tag() -> None:
    text = (
        "<tool_call>\n<function=a>\n<parameter=x>\n1\n</parameter>\n</function>\n</tool_call>"
        "<tool_call>\n<function=b>\n</function>\n</tool_call>"
        "<tool_call>\n<function=c>\n<parameter=y>\nz\n</tool_call>"
    )
    calls = [c["function"] for c in parse_tool_calls(text, "qwen3_coder")]
    assert calls == [
        {"name": "a", "arguments": '{"x": "1"}'},
        {"name": "b", "arguments": "{}"},
        {"name": "c", "arguments": '{"y": "z"}'},
    ]


@pytest.mark.parametrize(
    "text",
    [
        "<tool_call>\n<function=>\n<parameter=x>\n1\n</parameter>\n</function>\n</tool_call>",  # no name
        "<tool_call>\nnot a call\n</tool_call>",
        "<tool_call>\n<function=guess>\n<parameter=n>\n7",  # cut off: no </tool_call>
        "<function=guess>\n<parameter=n>\n7\n</parameter>\n</function>",  # no <tool_call> around it
    ],
)
def test_malformed_qwen3_coder_replies_stay_plain_text(text: str) -> None:
    for parser in ("auto", "qwen3_coder", "hermes"):
        assert assistant_message(text, parser, GUESS_TOOLS) == {"role": "assistant", "content": text}


def test_a_named_parser_reads_only_its_own_format() -> None:
    hermes = '<tool_call>{"name": "guess", "arguments": {"n": 7}}</tool_call>'
    assert parse_tool_calls(CODER_CALL, "hermes") == [] and parse_tool_calls(hermes, "qwen3_coder") == []
    assert [c["function"]["name"] for c in parse_tool_calls(hermes + CODER_CALL)] == ["guess", "guess"]
    with pytest.raises(ValueError, match="unknown tool-call parser"):
        parse_tool_calls(hermes, "mistral")


def test_parser_follows_the_chat_template() -> None:
    assert parser_for_template("{{- '<tool_call>\\n<function=' + tool_call.name + '>\\n' }}") == "qwen3_coder"
    assert parser_for_template('<tool_call>\n{"name": {{ tool_call.name | tojson }}}') == "hermes"
    assert parser_for_template(None) == "hermes"


def _spec(**inference: object) -> WhaleRunSpec:
    return WhaleRunSpec.model_validate(
        {"domain": "chess_puzzles", "condition": "mh_only", "model": {"name": "m"}, "inference": inference}
    )


@pytest.mark.parametrize(
    ("inference", "env", "kind"),
    [
        ({"backend": "transformers"}, {"WHALE_INFERENCE_URL": "http://x/v1"}, "in-process"),
        ({"backend": "vllm"}, {}, "http"),
        ({"backend": "openai", "baseUrl": "http://x/v1"}, {}, "http"),
        ({"backend": "auto"}, {}, "in-process"),
        ({"backend": "auto"}, {"WHALE_INFERENCE_URL": "http://x/v1"}, "http"),
    ],
)
def test_backend_choice(inference: dict[str, object], env: dict[str, str], kind: str) -> None:
    assert backend_kind(_spec(**inference), env) == kind


def test_http_backend_without_url_says_what_to_set() -> None:
    with pytest.raises(InferenceError, match="baseUrl or \\$WHALE_INFERENCE_URL"):
        inference_url(_spec(backend="vllm"), {})
    assert inference_url(_spec(backend="vllm"), {"WHALE_INFERENCE_URL": "http://h/v1"}) == "http://h/v1"
