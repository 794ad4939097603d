"""The synthetic domain's h0: the bare instruction, then one worked reply that shows the tag's format; the tiny
model is taught under exactly that prompt."""

from __future__ import annotations

import ast
from pathlib import Path

from synthetic import tasks, tiny_model
from whale import plugins

LENIENT = Path(__file__).resolve().parents[2] / "manifests/examples/local/synthetic-lenient.py"


def system_prompt(path: Path) -> str:
    """A harness's ``SYSTEM_PROMPT``, read from its source (a harness file is never imported here)."""
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and [getattr(t, "id", None) for t in node.targets] == ["SYSTEM_PROMPT"]:
            return ast.literal_eval(node.value)
    raise AssertionError(f"{path} has no SYSTEM_PROMPT")


def h0_system_prompt() -> str:
    return system_prompt(plugins.load("synthetic").h0_path())


def test_h0_starts_with_the_bare_instruction() -> None:
    assert h0_system_prompt().startswith(tasks.SYSTEM_PROMPT + " ")


def test_h0_shows_one_worked_reply_in_the_tag() -> None:
    # what makes a small instruction-tuned model (SmolLM2, docs/local.md) write the tag at all
    assert tasks.extract_answer(h0_system_prompt()) == "3"


def test_the_tiny_model_is_taught_under_h0s_prompt() -> None:
    # a 2-layer model answers a prompt it was not taught on far worse: the demo's first evaluation (under h0) must
    # ask what the warm-up taught (the demo's best mean@4 fell from 0.48 to 0.23-0.32 when the two drifted apart)
    conversations = tiny_model.format_conversations(4, seed=0, copy_prob=1.0)
    assert {c[0]["content"] for c in conversations} == {h0_system_prompt()}
    assert tiny_model.h0_system_prompt() == h0_system_prompt()


def test_the_demos_lenient_candidate_keeps_h0s_prompt() -> None:
    # the replayed candidate changes only how a reply is read: the prompt the model was taught under stays
    assert system_prompt(LENIENT) == h0_system_prompt()
