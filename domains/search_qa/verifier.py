"""Normalised exact match of the last ``<answer>`` against any gold answer (the Search-R1 / SQuAD rule).

Normalisation: lowercase, drop punctuation, drop the articles a/an/the, collapse whitespace.
No ``<answer>`` in the final reply scores 0: h0 asks for the tags. A correct answer in a reply with more than
10 opening or 10 closing ``<answer>`` tags scores 0.25, verl's Search-R1 rule against tag spam
(``search_r1_like_qa_em.compute_score``, the reference's default EM reward; docs/reproducing.md). The LLM-judge
option reads the answer its own way, as the reference's judge does (:func:`judged_answer`).
"""

from __future__ import annotations

import re
import string
from collections.abc import Iterable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from search_qa.judge import Judge

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


#: more opening or closing answer tags than this in the reply: a correct answer earns SPAM_CREDIT only
MAX_ANSWER_TAGS = 10
SPAM_CREDIT = 0.25


def score(final_reply: str | None, golden_answers: Iterable[str]) -> float:
    text = final_reply or ""
    answer = last_answer(text)
    if answer is None or not exact_match(answer, golden_answers):
        return 0.0
    spam = text.count("<answer>") > MAX_ANSWER_TAGS or text.count("</answer>") > MAX_ANSWER_TAGS
    return SPAM_CREDIT if spam else 1.0


def judged_answer(text: str) -> str | None:
    """The answer the LLM judge reads, paired as the reference's judge pairs it (``llm_judge.extract_solution``):
    the last ``</answer>`` with the nearest ``<answer>`` before it, so ``<answer>junk<answer>x</answer>`` gives
    ``x``, not ``junk<answer>x``; tags in lower case, as there. None when there is no such pair; an empty pair
    is an answer (``""``, which the judge is asked about, as there)."""
    close = text.rfind("</answer>")
    if close < 0:
        return None
    opening = text.rfind("<answer>", 0, close)
    if opening < 0:
        return None
    return text[opening + len("<answer>") : close].strip()


def judged_score(final_reply: str | None, golden_answers: Iterable[str], question: str, judge: Judge) -> float:
    """``domainOptions.searchAnswer: llmJudge``: 1 when the judge says :func:`judged_answer` names a gold answer, else 0
    (no tag-spam rule, as the reference's judge); no answer pair: 0 without asking; exact match when the judge
    gives no verdict."""
    answer = judged_answer(final_reply or "")
    if answer is None:
        return 0.0
    golds = [str(g) for g in golden_answers]
    verdict = judge.verdict(question, golds, answer)
    return 1.0 if (exact_match(answer, golds) if verdict is None else verdict) else 0.0
