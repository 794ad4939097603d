"""Static harness checks: every rule fires on a minimal bad file and names its line."""

from __future__ import annotations

import pytest

from whale.harness.validate import HarnessValidationError, check_prompt_only, check_source, validate_source

CHESS_ALLOWED = {"collections", "itertools", "math", "random", "re", "statistics"}

GOOD = '''"""A fine harness."""
import re
from collections import Counter

from whale.harness.api import BaseHarness, env_action


class Harness(BaseHarness):
    SYSTEM_PROMPT = "Play."
    USER_TEMPLATE = "{fen}"
    MAX_TURNS = 9

    def parse_action(self, text, state):
        match = re.search(r"<move>(.*?)</move>", text)
        return env_action(match.group(1)) if match else None

    def __init__(self):
        super().__init__()
'''


def test_good_harness_passes() -> None:
    assert check_source(GOOD, CHESS_ALLOWED) == []


@pytest.mark.parametrize(
    ("snippet", "rule", "line"),
    [
        ("import os", "forbidden-import", 1),
        ("import re\nfrom subprocess import run", "forbidden-import", 2),
        ("import os.path", "forbidden-import", 1),
        ("from whale.harness import sandbox", "forbidden-import", 1),
        ("from . import sibling", "relative-import", 1),
        ("x = eval('1')", "forbidden-name", 1),
        ("x = __import__('os')", "forbidden-name", 1),
        ("f = open", "forbidden-name", 1),
        ("g = globals()", "forbidden-name", 1),
        ("x = (1).__class__.__subclasses__()", "dunder-attribute", 1),
        ("x = getattr(len, '__self__')", "dunder-attribute", 1),
        ("def f(\n", "syntax", 1),
    ],
)
def test_rule_fires(snippet: str, rule: str, line: int) -> None:
    violations = check_source(snippet + "\n" + GOOD, CHESS_ALLOWED)
    assert any(v.rule == rule and v.line == line for v in violations), violations


def test_missing_class() -> None:
    violations = check_source("from whale.harness.api import BaseHarness\nclass Other(BaseHarness):\n    pass\n", CHESS_ALLOWED)
    assert [v.rule for v in violations] == ["missing-class"]


@pytest.mark.parametrize(
    ("member", "rule"),
    [
        ("    def parse_action(self, reply, state):\n        return None", "hook-signature"),
        ("    def observe(self, results):\n        return None", "hook-signature"),
        ("    def start(self, task, state, *extra):\n        return None", "hook-signature"),
        ("    async def parse(self, reply, state):\n        return None", "async-hook"),
        ("    MAX_TURNS = 0", "constant-type"),
        ("    MAX_TURNS = True", "constant-type"),
        ("    SYSTEM_PROMPT = 5", "constant-type"),
        ("    TOOLS = 'search'", "constant-type"),
    ],
)
def test_class_rules(member: str, rule: str) -> None:
    source = f"from whale.harness.api import BaseHarness\nclass Harness(BaseHarness):\n{member}\n"
    violations = check_source(source, CHESS_ALLOWED)
    assert [v.rule for v in violations] == [rule]
    assert violations[0].line == 3


def test_error_message_names_file_line_rule_and_fix() -> None:
    with pytest.raises(HarnessValidationError) as info:
        validate_source("import socket\n" + GOOD, CHESS_ALLOWED, filename="cand.py")
    text = str(info.value)
    assert text.startswith("cand.py:1: [forbidden-import] import of 'socket' is not allowed; allowed: collections")


def test_per_domain_allow_list() -> None:
    source = "import json\n" + GOOD
    assert check_source(source, CHESS_ALLOWED)
    assert check_source(source, CHESS_ALLOWED | {"json"}) == []


def test_prompt_only_accepts_prompt_changes_and_docstrings() -> None:
    candidate = GOOD.replace('"Play."', '"Think, then play the best move."').replace("{fen}", "Position: {fen}")
    candidate = candidate.replace('"""A fine harness."""', '"""Another docstring."""')
    assert check_prompt_only(candidate, GOOD) == []


@pytest.mark.parametrize(
    ("old", "new", "line"),
    [
        ("MAX_TURNS = 9", "MAX_TURNS = 12", 11),
        ("return env_action(match.group(1)) if match else None", "return env_action(match.group(1).lower()) if match else None", 13),
        ('SYSTEM_PROMPT = "Play."', "SYSTEM_PROMPT = 'P' + 'lay.'", 9),
    ],
)
def test_prompt_only_rejects_other_changes(old: str, new: str, line: int) -> None:
    violations = check_prompt_only(GOOD.replace(old, new), GOOD)
    assert violations and violations[0].rule == "prompt-only" and violations[0].line == line


def test_prompt_only_rejects_added_statements() -> None:
    violations = check_prompt_only(GOOD + "\nEXTRA = 1\n", GOOD)
    assert [v.rule for v in violations] == ["prompt-only"]
