"""The synthetic tasks: items generated from the data seed, answered inside ``<answer></answer>``.

``repeat`` (the default, ``spec.experiment.domainOptions.syntheticTask``) asks to repeat a digit. It exists so that the whole WHALE loop
(sampling, rejection, SFT, weight sync, harness search) can run on a laptop CPU with a tiny model in seconds, and so
that "training reward rises" is a check that can fail: a tiny model that knows the answer format but not the task
starts near 10 % (one digit in ten) and only rises if RSFT really trains on the accepted answers.

``addition`` asks for the sum of two digits (``What is 3 + 5?``). It is the harder task of the local SmolLM2
comparison (docs/local.md): the repeat task saturates there (a 135M model knows every digit; once RSFT teaches the
tag, every condition reaches 100 %), while SmolLM2-135M states the right sum in only about half of its replies, so
neither learning the tag nor reading the answer from the words can alone reach 100 % (two-digit operands were too
hard: the right sum appeared in 8 % of its replies). There are no raw files. Pure: no I/O.
"""

from __future__ import annotations

import enum
import random
import re
from typing import Any

SPLIT_SIZES = {"weight": 1000, "harness": 256, "test": 200}
_SPLIT_SALT = {"weight": 0, "harness": 1, "test": 2}
ANSWER_RE = re.compile(r"<answer>\s*(.*?)\s*</answer>", re.DOTALL)
#: the bare instruction; h0 adds one worked reply after it (for real models), and the tiny model is taught under h0's
#: whole prompt (:func:`synthetic.tiny_model.h0_system_prompt`)
SYSTEM_PROMPT = "Answer inside <answer></answer>."
USER_TEMPLATE = "Repeat the digit {digit}."
ADDITION_TEMPLATE = "What is {a} + {b}?"
#: the addition task's operands are drawn from this range (both ends included)
ADDITION_OPERANDS = (0, 9)


class Task(enum.StrEnum):
    """The synthetic domain's tasks (``spec.experiment.domainOptions.syntheticTask``)."""

    REPEAT = "repeat"
    ADDITION = "addition"


def make_item(split: str, index: int, seed: int, task: Task = Task.REPEAT) -> dict[str, Any]:
    """Item ``index`` of ``split``: a deterministic function of (split, index, seed, task)."""
    if split not in _SPLIT_SALT:
        raise ValueError(f"unknown split {split!r}; use one of {sorted(_SPLIT_SALT)}")
    if task is Task.ADDITION:
        rng = random.Random(f"whale-synthetic-addition:{seed}:{split}:{index}")
        a, b = (rng.randint(*ADDITION_OPERANDS) for _ in range(2))
        return addition_item(f"{split}-{index:05d}", a, b)
    rng = random.Random(f"whale-synthetic:{seed}:{split}:{index}")
    digit = rng.randrange(10)
    return {"id": f"{split}-{index:05d}", "digit": digit, "answer": str(digit)}


def addition_item(item_id: str, a: int, b: int) -> dict[str, Any]:
    """An addition item: its operands and their sum as the answer."""
    return {"id": item_id, "a": a, "b": b, "answer": str(a + b)}


def make_split(split: str, size: int, seed: int, task: Task = Task.REPEAT) -> list[dict[str, Any]]:
    return [make_item(split, i, seed, task) for i in range(size)]


def user_prompt(item: dict[str, Any]) -> str:
    """The question an item asks (its task is known by its fields: ``a`` and ``b`` for addition)."""
    if "a" in item:
        return ADDITION_TEMPLATE.format(a=item["a"], b=item["b"])
    return USER_TEMPLATE.format(digit=item["digit"])


def extract_answer(text: str) -> str | None:
    """The last ``<answer>`` of a reply (None: no answer tag)."""
    found = ANSWER_RE.findall(text or "")
    return found[-1].strip() if found else None


def score(reply: str, item: dict[str, Any]) -> float:
    """1.0 when the last ``<answer>`` equals the item's answer, else 0.0."""
    return 1.0 if extract_answer(reply) == item["answer"] else 0.0
