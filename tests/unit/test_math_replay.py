"""math_reasoning episodes with scripted replies, through the real runtime (h0 in its sandboxed process)."""

from __future__ import annotations

import asyncio
import json

import pytest

from math_reasoning import MathReasoning
from whale.domain import default_data_root
from whale.harness.runner import run_episodes
from whale.inference.base import SamplingParams
from whale.inference.scripted import ScriptedClient
from whale.tools.code import CodeLimits, LocalCodeRunner

AIME = default_data_root() / "math_reasoning" / "aime_2024.jsonl"


@pytest.fixture(scope="module")
def domain():
    return MathReasoning(runner=LocalCodeRunner(CodeLimits(timeout_s=2)))


@pytest.fixture(scope="module")
def raw_row():
    row = json.loads(AIME.open().readline())
    return {"id": row["id"], "problem": row["problem"], "answer": row["answer"]}


def tool_call(code: str, call_id: str = "call_1") -> dict:
    return {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {
                "id": call_id,
                "type": "function",
                "function": {"name": "code_interpreter", "arguments": json.dumps({"code": code})},
            }
        ],
    }


def play(domain, raw, replies):
    item = domain.item_from_raw(raw)
    client = ScriptedClient(replies)
    episodes = asyncio.run(run_episodes(domain, domain.h0_path(), client, [item], SamplingParams()))
    return episodes[0], client


def test_tool_then_boxed_answer_scores_one(domain, raw_row):
    gold = raw_row["answer"]
    ep, client = play(domain, raw_row, [tool_call(f"x = {gold}\nx"), f"The code says {gold}, so \\boxed{{{gold}}}."])
    assert ep.reward == 1.0 and ep.turns == 2 and ep.error is None
    first_prompt = client.prompts[0]
    assert [m["role"] for m in first_prompt] == ["user"]  # no system prompt
    assert first_prompt[0]["content"].endswith("The answer format must be: \\boxed{'The final answer goes here.'}")
    tool_msgs = [m for m in ep.messages if m["role"] == "tool"]
    assert tool_msgs and tool_msgs[0]["content"] == f"{gold}\n"


def test_math_h0_stops_after_a_tool_less_first_reply(domain, raw_row):
    """The paper's h0: a first reply that calls no tool IS the answer; the episode ends, no nudge, no
    second model call (a candidate may add a nudge)."""
    gold = raw_row["answer"]
    ep, client = play(domain, raw_row, [f"\\boxed{{{gold}}}", "I am not sure."])
    assert ep.turns == 1 and ep.reward == 1.0 and ep.error is None
    assert len(client.prompts) == 1  # the second scripted reply was never asked for
    assert [m["role"] for m in ep.messages] == ["user", "assistant"]
    ep, client = play(domain, raw_row, ["Let me think.", f"\\boxed{{{gold}}}"])
    assert ep.turns == 1 and ep.reward == 0.0 and len(client.prompts) == 1  # strict: that reply has no box


def test_only_the_final_reply_counts(domain, raw_row):
    gold = raw_row["answer"]
    ep, _ = play(domain, raw_row, [tool_call(f"print({gold})"), "I am not sure."])
    assert ep.turns == 2 and ep.reward == 0.0
    ep, _ = play(domain, raw_row, [tool_call("print(1)"), tool_call("print(2)")])  # the last turn is the answer
    assert ep.turns == 2 and ep.reward == 0.0 and ep.error is None


def test_wrong_answer_and_too_few_replies(domain, raw_row):
    ep, _ = play(domain, raw_row, [tool_call("print(1)"), "\\boxed{1}"])
    assert ep.reward == 0.0
    ep, _ = play(domain, raw_row, [])  # empty replies: no box, no credit, no crash
    assert ep.reward == 0.0 and ep.error is None


@pytest.mark.parametrize(
    ("code", "expected"),
    [
        ("1/0", "ZeroDivisionError"),
        ("x = bytearray(8 * 1024**3)", "Memory limit"),
        ("while True:\n    pass", "Timeout"),
    ],
)
def test_hostile_tool_code_is_a_tool_error_and_the_episode_goes_on(domain, raw_row, code, expected):
    gold = raw_row["answer"]
    ep, client = play(domain, raw_row, [tool_call(code), f"\\boxed{{{gold}}}"])
    tool_msg = next(m for m in client.prompts[1] if m["role"] == "tool")
    assert tool_msg["content"].startswith("Error:") and expected in tool_msg["content"]
    assert ep.reward == 1.0 and ep.error is None


def test_whale_replay_with_raw_rows(raw_row):
    """``whale.replay`` through the registry, the item as a raw row, replies as plain strings."""
    from whale.replay import replay

    gold = raw_row["answer"]
    ep = replay("math_reasoning", raw_row, [f"I will not use tools. Final: \\boxed{{{gold}}}", "unused"])
    assert ep["reward"] == 1.0 and ep["turns"] == 1 and ep["replies_used"] == 1
    ep = replay("math_reasoning", raw_row, [f"\\boxed{{{int(gold) + 1}}}", f"\\boxed{{{int(gold) + 1}}}"])
    assert ep["reward"] == 0.0
    with pytest.raises(ValueError, match="problem"):
        replay("math_reasoning", {"id": "x", "answer": "1"}, [])


def test_whale_replay_cli(tmp_path, raw_row):
    from typer.testing import CliRunner

    from whale.cli import app

    item = tmp_path / "item.json"
    item.write_text(json.dumps(raw_row))
    gold = raw_row["answer"]
    result = CliRunner().invoke(app, ["replay", "math_reasoning", "--item", str(item), "--", f"hmm \\boxed{{{gold}}}"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["reward"] == 1.0
