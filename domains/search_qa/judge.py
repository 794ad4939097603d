"""The LLM judge of search-QA answers (``spec.experiment.domainOptions.searchAnswer: llmJudge``), an option; the default is EM.

The reference's ``docs/data.md`` names an LLM judge (``gpt-5.4-mini``) as the study's verifier, while its scripts
default to exact match (``LLM_JUDGE=0``); its judge (``verl/utils/reward_score/llm_judge.py``) asks an
OpenAI-compatible chat API, temperature 0, at most 256 completion tokens, whether the extracted answer names
the same entity as any gold answer, reads the first word of the reply (CORRECT / INCORRECT), retries three
times with a doubling pause, falls back to exact match when every attempt fails, and scores 1 or 0 (no
0.25 tag-spam rule). This module does the same with this project's own prompt stating the same rules.

:func:`judge_prompt` and :func:`parse_verdict` are pure; :class:`Judge` does the HTTP.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import httpx

#: the rules the reference's judge prompt states (its "V11"), in this project's words
_RULES = """You judge answers to factual questions against reference answers.

Say CORRECT when the predicted answer names the same entity, value or fact as one of the references. That
includes: a difference in case, articles or punctuation; an alias, abbreviation, or a full versus short name;
an added or dropped qualifier ("the actor X" for "X"); a less specific date or place contained in the
reference ("1962" for "September 10, 1962"); the same number or unit written differently ("four" for "4");
another description of the same geographic feature; and an answer that weighs alternatives but settles on one
that matches.

Say INCORRECT when it names a different person, place, work, team, company or year; a number or date that
neither contains nor is contained in the reference; the opposite meaning; a different kind of thing (a city
for a stadium, an episode title for an episode number); no committed answer (only an explanation or a
disclaimer); several distinct candidates joined by slashes, bars, commas or "or", even if one matches; or a
passage of text (several sentences, or retrieved "Doc N (Title: ...)" text) that merely contains the reference.

Question: {question}
Reference answer(s): {gold}
Predicted answer: {prediction}

Reply with one word: CORRECT or INCORRECT."""

_WORD = re.compile(r"[A-Za-z]+")


def judge_prompt(question: str, golds: Iterable[str], prediction: str) -> str:
    """The one user message the judge gets (the gold answers joined with `` | ``, as the reference's)."""
    return _RULES.format(question=question, gold=" | ".join(str(g) for g in golds), prediction=prediction)


def parse_verdict(text: str | None) -> bool | None:
    """The reply's first word: CORRECT -> True, INCORRECT -> False, anything else -> None (unreadable)."""
    found = _WORD.search(text or "")
    word = found.group(0).upper() if found else ""
    return {"CORRECT": True, "INCORRECT": False}.get(word)


@dataclass
class Judge:
    """An OpenAI-compatible chat endpoint asked for a verdict, with the reference's retries."""

    base_url: str
    model: str = "gpt-5.4-mini"
    api_key: str | None = None
    attempts: int = 3
    #: the first pause between attempts (doubled each time: 1 s, 2 s as the reference)
    backoff_s: float = 1.0
    timeout_s: float = 60.0
    sleep: Callable[[float], None] = time.sleep
    #: unreadable or failed attempts so far (the workload reports how often EM stood in)
    failures: int = field(default=0, init=False)

    def verdict(self, question: str, golds: Iterable[str], prediction: str) -> bool | None:
        """True / False; None when every attempt failed or was unreadable (the caller falls back to EM)."""
        body = {
            "model": self.model,
            "messages": [{"role": "user", "content": judge_prompt(question, golds, prediction)}],
            "temperature": 0.0,
            "max_completion_tokens": 256,
        }
        headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
        pause = self.backoff_s
        for attempt in range(self.attempts):
            try:
                resp = httpx.post(
                    self.base_url.rstrip("/") + "/chat/completions", json=body, headers=headers, timeout=self.timeout_s
                )
                resp.raise_for_status()
                found = parse_verdict(resp.json()["choices"][0]["message"].get("content"))
            except (httpx.HTTPError, ValueError, KeyError, IndexError, TypeError, AttributeError):
                found = None
            if found is not None:
                return found
            self.failures += 1
            if attempt + 1 < self.attempts:
                self.sleep(pause)
                pause *= 2
        return None
