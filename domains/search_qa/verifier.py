"""Normalised exact match of the last ``<answer>`` against any gold answer (the Search-R1 / SQuAD rule).

Normalisation: lowercase, drop punctuation, drop the articles a/an/the, collapse whitespace.
No ``<answer>`` in the final reply scores 0: h0 asks for the tags.
"""

from __future__ import annotations

import re
import string
from collections.abc import Iterable

_ANSWER = re.compile(r"<answer>(.*?)</answer>", re.DOTALL | re.IGNORECASE)
_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCT = str.maketrans("", "", string.punctuation)


def normalize(text: str) -> str:
    text = text.lower().translate(_PUNCT)
    text = _ARTICLES.sub(" ", text)
    return " ".join(text.split())


def last_answer(text: str) -> str | None:
    """The contents of the last complete ``<answer>…</answer>``, or None."""
    found = _ANSWER.findall(text or "")
    return found[-1].strip() if found else None


def exact_match(pred: str, golds: Iterable[str]) -> bool:
    p = normalize(pred)
    return bool(p) and any(p == normalize(str(g)) for g in golds)


def score(final_reply: str | None, golden_answers: Iterable[str]) -> float:
    answer = last_answer(final_reply or "")
    if answer is None:
        return 0.0
    return 1.0 if exact_match(answer, golden_answers) else 0.0
