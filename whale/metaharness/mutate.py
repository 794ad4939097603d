"""Blind search over a harness's declared knobs: the edits of the ``mutate`` proposer backend. Pure: a harness's
source and a seeded ``random.Random`` in, a new source and what changed out.

The knobs are the literal class constants of ``class Harness`` (what a harness declares, not its code):

- **prompts** — ``SYSTEM_PROMPT``, ``USER_TEMPLATE``, ``FORMAT_RETRY_MESSAGE`` (string literals): a sentence from
  :data:`PROMPT_FRAGMENTS` added at the end or the start, or one sentence dropped; a ``USER_TEMPLATE`` keeps every
  ``{field}`` it had (a sentence holding one is never dropped);
- **integers** — ``MAX_TURNS`` (turn limit), ``MAX_FORMAT_RETRIES`` (retry rule) and every other int constant
  (tool budgets such as search_qa's ``TOPK`` and ``MAX_DOC_TOKENS``): a step up or down (±1, ±2, x2, /2),
  kept within ``[floor, max(4, 4 x the incoming value)]`` (floor 1 for ``MAX_TURNS``, else 0), so a candidate
  cannot ask for unbounded turns or tokens (the episode bounds and the domain's turn limit still apply).

Each candidate changes 1 or 2 knobs of the incoming harness; the code is spliced at the literal's exact source
span, so everything else (methods, comments) stays byte for byte. No model: it is the baseline that says whether
an LLM proposer beats random search over the same space.
"""

from __future__ import annotations

import ast
import dataclasses
import random
import re
import string

from whale.harness.api import PROMPT_CONSTANTS

#: string knobs: the prompts and the retry message
STRING_KNOBS = (*PROMPT_CONSTANTS, "FORMAT_RETRY_MESSAGE")
#: domain-neutral instructions a prompt knob may gain (the blind search's prompt variants)
PROMPT_FRAGMENTS = (
    "Think step by step before you answer.",
    "Be concise.",
    "Check your answer before you reply.",
    "Follow the required answer format exactly.",
    "Reply with the final answer only.",
    "Read the question carefully.",
    "If you are unsure, give your best guess.",
)
#: the lowest value of an integer knob (MAX_TURNS must stay >= 1)
_FLOORS = {"MAX_TURNS": 1}
_SENTENCE = re.compile(r"(?<=[.!?])\s+")


@dataclasses.dataclass(frozen=True)
class Knob:
    """One literal class constant of ``class Harness`` and where its value sits in the source."""

    name: str
    value: str | int
    #: 1-based line / 0-based column of the value's start and end (ast positions)
    start: tuple[int, int]
    end: tuple[int, int]


@dataclasses.dataclass(frozen=True)
class Mutation:
    """A candidate's source and its changes, one ``NAME: old -> new`` line each."""

    code: str
    changes: tuple[str, ...]


def knobs(code: str) -> list[Knob]:
    """The literal str/int class constants of ``class Harness`` (empty when there is no such class or it
    does not parse: nothing to mutate)."""
    try:
        tree = ast.parse(code)
    except SyntaxError:
        return []
    cls = next((n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Harness"), None)
    out: list[Knob] = []
    for node in cls.body if cls is not None else []:
        if not isinstance(node, ast.Assign) or len(node.targets) != 1 or not isinstance(node.targets[0], ast.Name):
            continue
        name, value = node.targets[0].id, node.value
        if not isinstance(value, ast.Constant) or value.end_lineno is None or value.end_col_offset is None:
            continue
        literal = value.value
        knob: str | int | None = None
        if isinstance(literal, int) and not isinstance(literal, bool) and name.isupper():
            knob = literal
        if isinstance(literal, str) and name in STRING_KNOBS:
            knob = literal
        if knob is not None:
            out.append(Knob(name, knob, (value.lineno, value.col_offset), (value.end_lineno, value.end_col_offset)))
    return out


def _fields(text: str) -> set[str]:
    return {f for _, f, _, _ in string.Formatter().parse(text) if f}


def mutate_string(name: str, value: str, rng: random.Random) -> str:
    sentences = [s for s in _SENTENCE.split(value.strip()) if s]
    fields = _fields(value) if name == "USER_TEMPLATE" else set()
    droppable = [i for i, s in enumerate(sentences) if len(sentences) > 1 and not (_fields(s) & fields)]
    fresh = [f for f in PROMPT_FRAGMENTS if f not in value]
    ops = ["append", "prepend"] if fresh else []
    if droppable:
        ops.append("drop")
    if not ops:
        return value
    op = rng.choice(ops)
    if op == "drop":
        del sentences[rng.choice(droppable)]
        return " ".join(sentences)
    fragment = rng.choice(fresh)
    if not value.strip():
        return fragment
    sep = "\n" if "\n" in value else " "
    return f"{value.rstrip()}{sep}{fragment}" if op == "append" else f"{fragment}{sep}{value.lstrip()}"


def mutate_int(name: str, value: int, rng: random.Random) -> int:
    floor = _FLOORS.get(name, 0)
    ceiling = max(4, 4 * value)
    steps = [value + 1, value + 2, value - 1, value - 2, value * 2, value // 2]
    options = sorted({min(max(v, floor), ceiling) for v in steps} - {value})
    return rng.choice(options) if options else value


def _offset(lines: list[str], pos: tuple[int, int]) -> int:
    """A character offset from an ast (line, column) pair; ast columns count UTF-8 bytes."""
    line, col = pos
    before = sum(len(x) for x in lines[: line - 1])
    return before + len(lines[line - 1].encode("utf-8")[:col].decode("utf-8"))


def mutate(code: str, rng: random.Random, *, max_knobs: int = 2, attempts: int = 8) -> Mutation | None:
    """A candidate: 1..``max_knobs`` knobs of ``code`` changed at random; None when nothing can change."""
    found = knobs(code)
    if not found:
        return None
    for _ in range(attempts):
        chosen = rng.sample(found, k=rng.randint(1, min(max_knobs, len(found))))
        edits: list[tuple[Knob, str | int]] = []
        for k in chosen:
            new = mutate_int(k.name, k.value, rng) if isinstance(k.value, int) else mutate_string(k.name, k.value, rng)
            if new != k.value:
                edits.append((k, new))
        if not edits:
            continue
        lines = code.splitlines(keepends=True)
        out = code
        for k, new in sorted(edits, key=lambda e: e[0].start, reverse=True):  # from the end: offsets stay valid
            a, b = _offset(lines, k.start), _offset(lines, k.end)
            out = out[:a] + repr(new) + out[b:]
        ast.parse(out)  # a literal replaced by a literal: raises only on a bug here
        return Mutation(out, tuple(f"{k.name}: {k.value!r} -> {new!r}" for k, new in edits))
    return None
