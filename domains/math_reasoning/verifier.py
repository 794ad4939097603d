"""Scoring the final reply of a math episode against the gold answer, two ways (``spec.experiment.domainOptions.mathAnswer``).

* ``dapo`` (the paper's, the default): the reference code's reward, verl's ``math_dapo.compute_score`` with
  ``strict_box_verify=True`` made binary — of the final reply's **last 100 characters**, the content of the
  last ``\\boxed{`` (braces counted from there, no escapes; an unclosed last box is no answer), compared
  with the gold answer **as strings, exactly**: ``\\boxed{204}`` matches ``204``; ``\\boxed{ 204 }``,
  ``\\boxed{204.}``, ``\\boxed{0.5}`` for ``\\frac{1}{2}`` do not.
* ``mathVerify``: the last complete ``\\boxed{}``/``\\fbox{}`` anywhere in the final reply (escaped braces
  skipped, an unclosed box passed over) compared by math-verify's symbolic equivalence (``\\frac{1}{2}`` ==
  ``0.5``, ``1,000`` == ``1000``); boxed answers longer than ``MAX_ANSWER_CHARS`` score 0.

Either way: no box in the final reply scores 0, whatever the rest of the reply says (h0 asks for the box).
"""

from __future__ import annotations

import re
import threading
from typing import Literal

import math_verify

#: spec.experiment.domainOptions.mathAnswer
AnswerMatch = Literal["dapo", "mathVerify"]
ANSWER_MATCHES: tuple[AnswerMatch, ...] = ("dapo", "mathVerify")

BOX_COMMANDS = ("\\boxed", "\\fbox")
MAX_ANSWER_CHARS = 300  # longer "answers" are not answers; also bounds the checker's work
_THOUSANDS = re.compile(r"(?<=\d)(?:\\,|\{,\}|\\!|\\ )(?=\d{3}\b)")


def last_boxed(text: str) -> str | None:
    """Contents of the last ``\\boxed{...}`` (nested braces allowed), or None when there is no complete box."""
    best = None
    for cmd in BOX_COMMANDS:
        start = text.rfind(cmd + "{")
        while start != -1:
            depth, i = 0, start + len(cmd)
            end = None
            while i < len(text):
                ch = text[i]
                if ch == "\\" and i + 1 < len(text):
                    i += 2
                    continue
                if ch == "{":
                    depth += 1
                elif ch == "}":
                    depth -= 1
                    if depth == 0:
                        end = i
                        break
                i += 1
            if end is not None:
                if best is None or start > best[0]:
                    best = (start, text[start + len(cmd) + 1 : end])
                break
            start = text.rfind(cmd + "{", 0, start)  # unbalanced box: try the one before it
    return None if best is None else best[1].strip()


def _timeouts() -> int | None:
    # math-verify's timeouts use SIGALRM, which exists only in the main thread.
    return 5 if threading.current_thread() is threading.main_thread() else None


def is_equivalent(pred: str, gold: str) -> bool:
    """math-verify equivalence of two LaTeX answers (thousands separators like ``1\\,000`` dropped first)."""
    if not pred or len(pred) > MAX_ANSWER_CHARS:
        return False
    t = _timeouts()
    pred = _THOUSANDS.sub("", pred)
    gold_p = math_verify.parse(f"${gold}$", parsing_timeout=t)
    pred_p = math_verify.parse(f"$\\boxed{{{pred}}}$", parsing_timeout=t)
    if not gold_p or not pred_p:
        return False
    return bool(math_verify.verify(gold_p, pred_p, timeout_seconds=t))


def math_verify_score(final_reply: str | None, gold: str) -> float:
    """1.0 when the last box of the final reply is math-verify-equivalent to the gold answer, else 0.0."""
    boxed = last_boxed(final_reply or "")
    if boxed is None:
        return 0.0
    return 1.0 if is_equivalent(boxed, str(gold)) else 0.0


# ----- the strict DAPO match (verl's math_dapo with strict_box_verify; the paper's) ----------------------

#: verl's compute_score keeps the solution's last 300 characters and is_correct_strict_box the last 100 of
#: those: only a box in the last 100 characters of the final reply counts
DAPO_TAIL_CHARS = 100
_DAPO_BOX = "\\boxed{"


def dapo_last_boxed(text: str) -> str | None:
    """The content of the text's last ``\\boxed{``, braces counted from it (no escapes, no ``\\fbox``);
    None when there is none or when that last box never closes (DAPO does not look further back)."""
    start = text.rfind(_DAPO_BOX)
    if start < 0:
        return None
    depth = 0
    for i in range(start + len(_DAPO_BOX) - 1, len(text)):
        if text[i] == "{":
            depth += 1
        elif text[i] == "}":
            depth -= 1
            if depth == 0:
                return text[start + len(_DAPO_BOX) : i]
    return None


def dapo_score(final_reply: str | None, gold: str) -> float:
    """1.0 when the last box of the reply's last 100 characters is exactly the gold answer's string
    (no normalisation at all: ``\\boxed{ 204 }`` is not ``204``), else 0.0."""
    boxed = dapo_last_boxed((final_reply or "")[-DAPO_TAIL_CHARS:])
    return 1.0 if boxed is not None and boxed == str(gold) else 0.0


def extracted_answer(final_reply: str | None, match: AnswerMatch = "dapo") -> str | None:
    """The boxed answer the verifier reads under ``match`` (for traces); None when there is none."""
    if match == "dapo":
        return dapo_last_boxed((final_reply or "")[-DAPO_TAIL_CHARS:])
    return last_boxed(final_reply or "")


def score(final_reply: str | None, gold: str, match: AnswerMatch = "dapo") -> float:
    """The reward of a final reply: 1.0 when its boxed answer matches the gold answer under ``match``."""
    if match == "dapo":
        return dapo_score(final_reply, gold)
    if match == "mathVerify":
        return math_verify_score(final_reply, gold)
    raise ValueError(f"unknown answer match {match!r}; use one of {', '.join(ANSWER_MATCHES)}")
