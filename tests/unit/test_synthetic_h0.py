"""The synthetic domain's h0: the tiny model's instruction, then one worked reply that shows the tag's format."""

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


def test_h0_starts_with_the_instruction_the_tiny_model_learns() -> None:
    # the tiny model is taught the format on the bare instruction; h0 adds the worked reply after it
    assert h0_system_prompt().startswith(tasks.SYSTEM_PROMPT + " ")


def test_h0_shows_one_worked_reply_in_the_tag() -> None:
    # what makes a small instruction-tuned model (SmolLM2, docs/local.md) write the tag at all
    assert tasks.extract_answer(h0_system_prompt()) == "3"
