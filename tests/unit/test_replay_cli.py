"""`whale replay` on each domain from the command line, tool calls included (written as the model
would generate them: hermes-style or qwen3_coder <tool_call> blocks)."""

from __future__ import annotations

import asyncio
import json

from typer.testing import CliRunner

from whale.cli import app
from whale.inference.base import SamplingParams
from whale.inference.scripted import ScriptedClient

cli = CliRunner()
CODE_CALL = '<tool_call>{"name": "code_interpreter", "arguments": {"code": "print(6*7)"}}</tool_call>'


def test_scripted_reply_with_tool_call_text_becomes_a_tool_call():
    client = ScriptedClient([f"Let me compute. {CODE_CALL}"])
    result = asyncio.run(client.chat([{"role": "user", "content": "q"}], SamplingParams()))
    message = result.completions[0].message
    assert message["content"] == "Let me compute."
    call = message["tool_calls"][0]["function"]
    assert call["name"] == "code_interpreter" and json.loads(call["arguments"]) == {"code": "print(6*7)"}
    assert result.completions[0].finish_reason == "tool_calls"


def test_math_replay_with_a_tool_call(tmp_path):
    item = tmp_path / "item.json"
    item.write_text(json.dumps({"id": "t1", "problem": "What is 6 times 7?", "answer": "42"}))
    res = cli.invoke(app, ["replay", "math_reasoning", "--item", str(item), "--", CODE_CALL, r"So \boxed{42}"])
    assert res.exit_code == 0, res.output
    episode = json.loads(res.output)
    assert episode["reward"] == 1.0 and episode["turns"] == 2
    tool_messages = [m for m in episode["messages"] if m["role"] == "tool"]
    assert tool_messages and tool_messages[0]["content"].strip() == "42"


def test_math_replay_with_a_qwen3_coder_tool_call(tmp_path):
    item = tmp_path / "item.json"
    item.write_text(json.dumps({"id": "t1", "problem": "What is 6 times 7?", "answer": "42"}))
    call = "<tool_call>\n<function=code_interpreter>\n<parameter=code>\nprint(6*7)\n</parameter>\n</function>\n</tool_call>"
    res = cli.invoke(app, ["replay", "math_reasoning", "--item", str(item), "--", call, r"So \boxed{42}"])
    assert res.exit_code == 0, res.output
    episode = json.loads(res.output)
    assert episode["reward"] == 1.0 and episode["turns"] == 2
    assert [m["content"].strip() for m in episode["messages"] if m["role"] == "tool"] == ["42"]


def test_search_replay_answers_from_a_raw_row(tmp_path):
    item = tmp_path / "item.json"
    item.write_text(json.dumps({"id": "q1", "question": "Who wrote Hamlet?", "golden_answers": ["Shakespeare"]}))
    rewards = {}
    for reply in ("<answer>The Shakespeare</answer>", "<answer>William Shakespeare</answer>"):
        res = cli.invoke(app, ["replay", "search_qa", "--item", str(item), "--", reply])
        assert res.exit_code == 0, res.output
        episode = json.loads(res.output)
        assert (
            episode["messages"][-1] == {"role": "assistant", "content": reply}
            or episode["messages"][-1]["content"] == reply
        )
        rewards[reply] = episode["reward"]
    # normalised exact match: articles are stripped, but a longer name is not the gold answer
    assert rewards == {"<answer>The Shakespeare</answer>": 1.0, "<answer>William Shakespeare</answer>": 0.0}


def test_bad_item_is_a_clear_error(tmp_path):
    item = tmp_path / "item.json"
    item.write_text(json.dumps({"id": "t1"}))
    res = cli.invoke(app, ["replay", "math_reasoning", "--item", str(item), "--", "x"])
    assert res.exit_code == 1 and "Traceback" not in res.output
    assert "problem" in res.output
