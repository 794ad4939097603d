"""Candidate validation: the runtime's static rules plus promptOnly against the incoming harness."""

from whale.metaharness.validate import MAX_CANDIDATE_BYTES, candidate_problems

ALLOWED = frozenset({"re", "collections"})
INCOMING = """import re

from whale.harness.api import BaseHarness, env_action


class Harness(BaseHarness):
    SYSTEM_PROMPT = "Answer inside <answer></answer>."
    USER_TEMPLATE = "{question}"
    MAX_TURNS = 1

    def parse_action(self, text, state):
        return env_action(text)
"""


def problems(code, prompt_only=False):
    return candidate_problems(code, incoming=INCOMING, allowed_imports=ALLOWED, prompt_only=prompt_only)


def test_incoming_itself_is_valid_in_both_modes():
    assert problems(INCOMING) == []
    assert problems(INCOMING, prompt_only=True) == []


def test_static_rules_come_from_the_runtime():
    assert "[syntax]" in problems("class Harness(:\n")[0]
    assert any("[forbidden-import]" in p for p in problems(INCOMING.replace("import re", "import os")))
    assert any("[hook-signature]" in p for p in problems(INCOMING.replace("(self, text, state)", "(self, text)")))


def test_prompt_only_allows_prompts_and_refuses_code():
    prompts = INCOMING.replace("Answer inside", "Reply only inside").replace('"{question}"', '"Q: {question}"')
    assert problems(prompts, prompt_only=True) == []
    code = INCOMING.replace("return env_action(text)", "return env_action(text.strip())")
    found = problems(code, prompt_only=True)
    assert found and "[prompt-only]" in found[0] and "harness.py:11" in found[0]  # the def that differs
    assert problems(code) == []  # fine outside promptOnly
    computed = INCOMING.replace('"{question}"', '"{question}" * 2')
    assert any("plain string literals" in p for p in problems(computed, prompt_only=True))


def test_prompt_only_compares_with_the_incoming_harness_not_h0():
    incoming2 = INCOMING.replace("return env_action(text)", "return env_action(text.strip())")
    cand = incoming2.replace("Answer inside", "Reply inside")
    assert candidate_problems(cand, incoming=incoming2, allowed_imports=ALLOWED, prompt_only=True) == []


def test_size_cap():
    huge = INCOMING + "#" * (MAX_CANDIDATE_BYTES + 1)
    assert "[size]" in problems(huge)[0]
