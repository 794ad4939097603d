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
        # the attack report's way in: non-dunder module internals
        ("import random\nx = random._os", "private-attribute", 2),
        ("import collections\nx = collections._sys", "private-attribute", 2),
        ("import re\nx = re._compiler", "private-attribute", 2),
        ("import re._parser", "forbidden-import", 1),
        ("import statistics\nx = statistics.sys", "module-attribute", 2),
        ("import re\nx = re.enum.sys", "module-attribute", 2),
        ("from statistics import sys", "module-attribute", 1),
        ("from whale.harness.api import json", "module-attribute", 1),
        ("import whale.harness.api\nx = whale.harness.sandbox", "module-attribute", 2),
        ("from math import *", "star-import", 1),
        ("import random\nm = random", "module-value", 2),
        ("import random\nx = [random]", "module-value", 2),
        ("import random\nx = getattr(random.Random(), '_randbelow')", "private-attribute", 2),
        ("name = 'x'\nx = getattr(1, name)", "dynamic-attribute", 2),
        ("g = getattr", "dynamic-attribute", 1),
        ("x = list(map(getattr, [1], ['real']))", "dynamic-attribute", 1),
        ("x = '{0._os}'.format(1)", "format-attribute", 1),
        ("x = '{0.__class__}'.format(1)", "format-attribute", 1),
        ("x = '{0:{1._os}}'.format(1, 2)", "format-attribute", 1),
        ("x = '{0.gi_frame}'.format(1)", "format-attribute", 1),
        ("from string import Formatter", "module-attribute", 1),
        ("x = (i for i in [1]).gi_frame", "introspection-attribute", 1),
        ("x = (1).f_back", "introspection-attribute", 1),
        ("x = vars()", "forbidden-name", 1),
        ("x = dir()", "forbidden-name", 1),
        ("x = __build_class__", "forbidden-name", 1),
        ("def f(self):\n    return self._x", "private-attribute", 2),
        ("f = lambda self: self._x", "private-attribute", 1),
        ("class C:\n    def m(self):\n        self = 1", "self-rebind", 3),
        ("class C:\n    def m(self):\n        return [(self := 2)]", "self-rebind", 3),
        ("class C:\n    def m(self):\n        for self in []:\n            pass", "self-rebind", 3),
        ("try:\n    pass\nexcept Exception as self:\n    pass", "self-rebind", 3),
    ],
)
def test_rule_fires(snippet: str, rule: str, line: int) -> None:
    violations = check_source(
        snippet + "\n" + GOOD, CHESS_ALLOWED | {"string"} if "string" in snippet else CHESS_ALLOWED
    )
    assert any(v.rule == rule and v.line == line for v in violations), violations


@pytest.mark.parametrize(
    "snippet",
    [
        "class C:\n    def m(self):\n        return self._cache",
        "class C:\n    @classmethod\n    def m(cls):\n        return cls._registry",
        "class C:\n    def m(self):\n        return super()._helper()",
        "class C:\n    def m(self):\n        def inner():\n            return self._cache\n        return inner",
        "import collections.abc\nx = collections.abc.Mapping",
        "from json import decoder\nx = decoder.JSONDecoder",
        "import re\nx = re.compile('a', re.IGNORECASE | re.DOTALL)",
        "x = getattr(1, 'real', None)",
        "x = '{fen} {a[0]} {b.real}'.format(fen=1, a=[1], b=2)",
        "import whale.harness.api\nx = whale.harness.api.BaseHarness",
        "import string\nx = string.Template('$a').substitute(a=1) + string.ascii_letters",
    ],
)
def test_legitimate_code_passes(snippet: str) -> None:
    assert check_source(snippet + "\n" + GOOD, CHESS_ALLOWED | {"json", "string"}) == []


def test_every_h0_and_fixture_harness_passes() -> None:
    from tests.fixtures.guess_domain import GuessNumberDomainDouble
    from whale import domains

    harnesses = [domains.load(name) for name in ("chess_puzzles", "math_reasoning", "search_qa", "synthetic")]
    for domain in [*harnesses, GuessNumberDomainDouble()]:
        assert check_source(domain.h0_path().read_text(encoding="utf-8"), domain.allowed_imports) == [], domain.name


def test_missing_class() -> None:
    violations = check_source(
        "from whale.harness.api import BaseHarness\nclass Other(BaseHarness):\n    pass\n", CHESS_ALLOWED
    )
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
        (
            "return env_action(match.group(1)) if match else None",
            "return env_action(match.group(1).lower()) if match else None",
            13,
        ),
        ('SYSTEM_PROMPT = "Play."', "SYSTEM_PROMPT = 'P' + 'lay.'", 9),
    ],
)
def test_prompt_only_rejects_other_changes(old: str, new: str, line: int) -> None:
    violations = check_prompt_only(GOOD.replace(old, new), GOOD)
    assert violations and violations[0].rule == "prompt-only" and violations[0].line == line


def test_prompt_only_rejects_added_statements() -> None:
    violations = check_prompt_only(GOOD + "\nEXTRA = 1\n", GOOD)
    assert [v.rule for v in violations] == ["prompt-only"]
