"""The synthetic domain's h0 and the tiny model agree on the prompt, and h0 shows the tag's format by example."""

from __future__ import annotations

import ast

from synthetic import tasks
from whale import plugins


def h0_system_prompt() -> str:
    """h0's ``SYSTEM_PROMPT``, read from its source (a harness file is never imported here)."""
    tree = ast.parse(plugins.load("synthetic").h0_path().read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and [getattr(t, "id", None) for t in node.targets] == ["SYSTEM_PROMPT"]:
            return ast.literal_eval(node.value)
    raise AssertionError("h0 has no SYSTEM_PROMPT")


def test_h0_asks_with_the_prompt_the_tiny_model_learns() -> None:
    assert h0_system_prompt() == tasks.SYSTEM_PROMPT


def test_h0_shows_one_worked_reply_in_the_tag() -> None:
    # what makes a small instruction-tuned model (SmolLM2, docs/local.md) write the tag at all
    assert tasks.extract_answer(h0_system_prompt()) == "3"
