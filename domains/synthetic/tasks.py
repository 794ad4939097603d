"""The synthetic task: repeat a digit, answered inside ``<answer></answer>``.

It exists so that the whole WHALE loop (sampling, rejection, SFT, weight sync, harness search) can
run on a laptop CPU with a tiny model in seconds, and so that "training reward rises" is a check
that can fail: a tiny model that knows the answer format but not the task starts near 10 % (one
digit in ten) and only rises if RSFT really trains on the accepted answers. Items are generated
from the data seed; there are no raw files. Pure: no I/O.
"""

from __future__ import annotations

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


def make_item(split: str, index: int, seed: int) -> dict[str, Any]:
    """Item ``index`` of ``split``: a deterministic function of (split, index, seed)."""
    if split not in _SPLIT_SALT:
        raise ValueError(f"unknown split {split!r}; use one of {sorted(_SPLIT_SALT)}")
    rng = random.Random(f"whale-synthetic:{seed}:{split}:{index}")
    digit = rng.randrange(10)
    return {"id": f"{split}-{index:05d}", "digit": digit, "answer": str(digit)}


def make_split(split: str, size: int, seed: int) -> list[dict[str, Any]]:
    return [make_item(split, i, seed) for i in range(size)]


def user_prompt(item: dict[str, Any]) -> str:
    return USER_TEMPLATE.format(digit=item["digit"])


def extract_answer(text: str) -> str | None:
    """The last ``<answer>`` of a reply (None: no answer tag)."""
    found = ANSWER_RE.findall(text or "")
    return found[-1].strip() if found else None


def score(reply: str, item: dict[str, Any]) -> float:
    """1.0 when the last ``<answer>`` equals the item's answer, else 0.0."""
    return 1.0 if extract_answer(reply) == item["answer"] else 0.0
