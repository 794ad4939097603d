"""search_qa episodes with scripted replies, through the real runtime (h0 in its sandboxed process)
and the real BM25 index over the shared corpus."""

from __future__ import annotations

import asyncio
import json

import pytest

from search_qa import SearchQA
from search_qa.tool import SearchArgumentError, parse_arguments
from whale.domain import default_data_root
from whale.harness.runner import run_episodes
from whale.inference.base import SamplingParams
from whale.inference.scripted import ScriptedClient

EVAL = default_data_root() / "search_qa" / "eval"


@pytest.fixture(scope="module")
def domain(bm25_retriever):
    return SearchQA(retriever=bm25_retriever)


def raw(name: str, row_id: str | None = None) -> dict:
    with (EVAL / name).open() as fh:
        for line in fh:
            row = json.loads(line)
            if row_id is None or row["id"] == row_id:
                return {"id": row["id"], "question": row["question"], "golden_answers": row["golden_answers"]}
    raise LookupError(row_id)


def search_call(args: dict, call_id: str = "call_1") -> dict:
    return {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {"id": call_id, "type": "function", "function": {"name": "search", "arguments": json.dumps(args)}}
        ],
    }


def play(domain, row, replies):
    client = ScriptedClient(replies)
    item = domain.item_from_raw(row)
    episodes = asyncio.run(run_episodes(domain, domain.h0_path(), client, [item], SamplingParams()))
    return episodes[0], client


def test_forced_top1_search_then_answer(domain):
    row = raw("popqa_hipporag1000.jsonl")
    gold = row["golden_answers"][0]
    ep, client = play(
        domain,
        row,
        [
            search_call({"query_list": [row["question"], "second query is dropped"], "topk": 5}),
            f"<answer>{gold}</answer>",
        ],
    )
    assert ep.reward == 1.0 and ep.turns == 2 and ep.error is None
    first = client.prompts[0]
    assert first[0] == {"role": "system", "content": "Answer factual questions using search when needed."}
    assert first[1]["content"].startswith(f"Question: {row['question']}\n")
    tool_msg = next(m for m in client.prompts[1] if m["role"] == "tool")
    result = json.loads(tool_msg["content"])["result"]  # {"result": ...} as the reference's search tool
    assert result.startswith("Doc 1(Title:") and "Doc 2" not in result
    assert "Query:" not in result  # one query only
    assert len(result.split()) <= 200 + 4  # passage cut to 200 words (+ "Doc 1(Title: t)")
    action = next(s for s in ep.steps if s["type"] == "action" and s["action"]["kind"] == "tool")
    assert action["action"]["arguments"] == {"query_list": [row["question"]], "topk": 1, "max_doc_tokens": 200}


def test_answer_without_search_and_wrong_answers(domain):
    row = raw("nq_test.jsonl", "test_0")
    ep, _ = play(domain, row, ["<answer>December 1972</answer>"])
    assert ep.reward == 1.0 and ep.turns == 1
    ep, _ = play(domain, row, ["<answer>1969</answer>"])
    assert ep.reward == 0.0
    ep, _ = play(domain, row, ["December 1972"])  # no tags
    assert ep.reward == 0.0


def test_bad_search_arguments_are_tool_errors(domain):
    row = raw("bamboogle_test.jsonl", "test_0")
    ep, client = play(domain, row, [search_call({"query_list": []}), "<answer>x</answer>"])
    tool_msg = next(m for m in client.prompts[1] if m["role"] == "tool")
    assert tool_msg["content"].startswith("Error:") and "query_list" in tool_msg["content"]
    assert ep.error is None and ep.reward == 0.0


@pytest.mark.parametrize(
    ("args", "match"),
    [
        ({}, "non-empty list"),
        ({"query_list": ["  "]}, "empty"),
        ({"query_list": ["q"] * 9}, "at most 8"),
        ({"query_list": ["q" * 501]}, "500 characters"),
        ({"query_list": ["q"], "topk": 0}, "topk"),
        ({"query_list": ["q"], "topk": "many"}, "topk"),
        ({"query_list": ["q"], "max_doc_tokens": 10**6}, "max_doc_tokens"),
    ],
)
def test_argument_bounds(args, match):
    with pytest.raises(SearchArgumentError, match=match):
        parse_arguments(args)


def test_a_single_string_query_is_accepted():
    assert parse_arguments({"query_list": "Paris", "topk": "2"}) == (["Paris"], 2, 200)


def test_whale_replay_with_raw_rows():
    """``whale.replay`` through the registry, the item as a raw row, replies as plain strings."""
    from whale.replay import replay

    row = raw("hotpotqa_dev_r1searcher500.jsonl")
    gold = row["golden_answers"][0]
    ep = replay("search_qa", row, [f"It is <answer>{gold}</answer>"])
    assert ep["reward"] == 1.0 and ep["turns"] == 1
    ep = replay("search_qa", row, ["<answer>certainly not this</answer>"])
    assert ep["reward"] == 0.0
    with pytest.raises(ValueError, match="golden_answers"):
        replay("search_qa", {"id": "x", "question": "q"}, [])
