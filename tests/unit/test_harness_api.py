"""The default hooks of BaseHarness, the decision checker and the trace record (pure)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from whale.harness.api import BaseHarness, Decision, env_action, fill, tool_action
from whale.harness.process import HarnessError, check_decision
from whale.harness.trace import Episode


class Tagged(BaseHarness):
    SYSTEM_PROMPT = "sys"
    USER_TEMPLATE = "Q: {question} ({missing})"
    MAX_FORMAT_RETRIES = 1

    def parse_action(self, text, state):
        return env_action(text[3:-4]) if text.startswith("<a>") and text.endswith("</a>") else None


def test_start_builds_system_and_user_messages_tolerating_missing_fields() -> None:
    decision = Tagged().start({"question": "2+2?"}, {})
    assert decision == Decision(
        messages=[{"role": "system", "content": "sys"}, {"role": "user", "content": "Q: 2+2? ({missing})"}]
    )


def test_parse_reads_action_then_retries_once_then_gives_up() -> None:
    harness = Tagged()
    state: dict[str, Any] = {}
    assert harness.parse({"content": "<a>4</a>"}, state)["actions"] == [{"kind": "env", "action": "4"}]
    retry = harness.parse({"content": "four"}, state)
    assert retry["messages"][0]["content"] == Tagged.FORMAT_RETRY_MESSAGE and not retry["done"]
    assert state == {"format_retries": 1}
    assert harness.parse({"content": "four"}, state)["done"] is True


def test_native_tool_calls_become_tool_actions_and_results_tool_messages() -> None:
    harness = BaseHarness()
    reply = {
        "content": "",
        "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "search", "arguments": '{"q": "x"}'}},
            {"id": "c2", "type": "function", "function": {"name": "search", "arguments": "not json"}},
        ],
    }
    actions = harness.parse(reply, {})["actions"]
    assert actions == [tool_action("search", {"q": "x"}, "c1"), tool_action("search", {"_raw": "not json"}, "c2")]
    results: list[dict[str, Any]] = [
        {"kind": "tool", "name": "search", "id": "c1", "content": "doc", "error": None},
        {"kind": "tool", "name": "search", "id": "c2", "content": "", "error": "bad args"},
        {"kind": "env", "observation": {"prompt": "next"}, "done": False},
    ]
    messages = harness.observe(results, {})["messages"]
    assert messages == [
        {"role": "tool", "content": "doc", "name": "search", "tool_call_id": "c1"},
        {"role": "tool", "content": "Error: bad args", "name": "search", "tool_call_id": "c2"},
        {"role": "user", "content": "next"},
    ]


def test_fill_keeps_unknown_fields() -> None:
    assert fill("{a} {b}", {"a": 1}) == "1 {b}"


@pytest.mark.parametrize(
    ("decision", "fault"),
    [
        (None, "return Decision"),
        ({"messages": "hi"}, "must be lists"),
        ({"messages": [{"role": "robot", "content": "x"}]}, "needs a role"),
        ({"messages": [{"role": "user", "content": 3}]}, "content must be a string"),
        ({"actions": [{"kind": "env"}]}, "has no 'action'"),
        ({"actions": [{"kind": "tool", "name": 3}]}, "string name"),
        ({"actions": [{"kind": "shell", "cmd": "rm"}]}, "kind 'env' or 'tool'"),
    ],
)
def test_check_decision_rejects_malformed_answers(decision: object, fault: str) -> None:
    with pytest.raises(HarnessError, match=fault):
        check_decision(decision, "parse")


def test_check_decision_normalises() -> None:
    assert check_decision({"done": 1}, "start") == {"messages": [], "actions": [], "done": True}


def test_episode_round_trip_and_views() -> None:
    episode = Episode(
        episode_id="p1#0",
        item_id="p1",
        messages=[{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}],
        steps=[
            {"type": "action", "action": {"kind": "tool", "name": "s", "arguments": {}, "id": None}, "result": {}},
            {"type": "action", "action": {"kind": "env", "action": "a"}, "result": {}},
        ],
        reward=1.0,
        turns=1,
    )
    again = Episode.from_dict(json.loads(episode.to_json()))
    assert again == episode
    assert again.assistant_indices == [1]
    assert [a["kind"] for a in again.actions] == ["tool", "env"]
    assert len(again.tool_calls) == 1
