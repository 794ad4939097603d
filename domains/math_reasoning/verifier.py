"""Scoring the final reply of a math episode against the gold answer, two ways (``spec.verifier.mathAnswer``).

* ``dapo`` (the paper's, the default): the strict DAPO string match of verl's ``math_dapo`` reward — the
  last 300 characters of the final reply, the content of their last ``\\boxed{`` (braces counted from
  there; an unclosed last box is no answer), both it and the gold answer normalised the Minerva way
  (``normalize_final_answer``: the part after the last ``=``, spaces, ``\\text{}``/units/``\\$``
  removed, thousands commas dropped, ``\\fracab`` -> ``\\frac{a}{b}``), then compared as strings:
  ``\\frac{1}{2}`` is not ``0.5``.
* ``mathVerify``: the last complete ``\\boxed{}``/``\\fbox{}`` (escaped braces skipped, an unclosed box
  passed over) compared by math-verify's symbolic equivalence (``\\frac{1}{2}`` == ``0.5``,
  ``1,000`` == ``1000``).

Either way: no box in the final reply scores 0, whatever the rest of the reply says (h0 asks for the box),
and a boxed answer longer than ``MAX_ANSWER_CHARS`` (300) scores 0 (``dapo``: it cannot fit in the tail).
"""

from __future__ import annotations

import re
import threading
from typing import Literal

import math_verify

#: spec.verifier.mathAnswer
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


# ----- the strict DAPO match (verl's math_dapo; the paper's) -------------------------------------------

#: verl's compute_score scores only the end of a solution ("the longest answer in MATH-500 has 159 characters")
DAPO_TAIL_CHARS = 300
_DAPO_BOX = "\\boxed{"
#: normalize_final_answer's plain replacements, in its order (after these, every space is gone)
DAPO_SUBSTITUTIONS: tuple[tuple[str, str], ...] = (
    ("an ", ""), ("a ", ""), (".$", "$"), ("\\$", ""), ("\\ ", ""), (" ", ""), ("mbox", "text"),
    (",\\text{and}", ","), ("\\text{and}", ","), ("\\text{m}", "\\text{}"),
)
#: ... then the words and marks it deletes, in its order
DAPO_REMOVED: tuple[str, ...] = (
    "square", "ways", "integers", "dollars", "mph", "inches", "hours", "km", "units", "\\ldots", "sue",
    "points", "feet", "minutes", "digits", "cents", "degrees", "cm", "gm", "pounds", "meters", "meals", "edges",
    "students", "childrentickets", "multiples", "\\text{s}", "\\text{.}", "\\text{\ns}", "\\text{}^2",
    "\\text{}^3", "\\text{\n}", "\\text{}", "\\mathrm{th}", "^\\circ", "^{\\circ}", "\\;", ",\\!", "{,}",
    '"', "\\dots",
)
#: ... then these rewrites, in its order
_DAPO_REWRITES: tuple[tuple[re.Pattern[str], str], ...] = tuple((re.compile(p), r) for p, r in (
    (r"(.*?)(\$)(.*?)(\$)(.*)", r"$\3$"),  # keep what is inside the first $...$
    (r"(\\text\{)(.*?)(\})", r"\2"),
    (r"(\\textbf\{)(.*?)(\})", r"\2"),
    (r"(\\overline\{)(.*?)(\})", r"\2"),
    (r"(\\boxed\{)(.*)(\})", r"\2"),
    (r"(frac)([^{])(.)", r"frac{\2}{\3}"),  # \fracab -> \frac{a}{b}
    (r"(sqrt)([^{])", r"sqrt{\2}"),  # \sqrta -> \sqrt{a}
))


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
                return text[start + len(_DAPO_BOX):i]
    return None


def dapo_normalize(answer: str) -> str:
    """DAPO's (Minerva's) ``normalize_final_answer``: the canonical string two answers are compared by."""
    answer = answer.split("=")[-1]
    for before, after in DAPO_SUBSTITUTIONS:
        answer = answer.replace(before, after)
    for mark in DAPO_REMOVED:
        answer = answer.replace(mark, "")
    for pattern, repl in _DAPO_REWRITES:
        answer = pattern.sub(repl, answer)
    answer = answer.replace("$", "")
    if answer.replace(",", "").isdigit():
        answer = answer.replace(",", "")
    return answer.strip()


def dapo_score(final_reply: str | None, gold: str) -> float:
    """1.0 when the normalised last box of the reply's last 300 characters equals the normalised gold."""
    boxed = dapo_last_boxed((final_reply or "")[-DAPO_TAIL_CHARS:])  # shorter than 300 characters, then
    if boxed is None:
        return 0.0
    return 1.0 if dapo_normalize(boxed) == dapo_normalize(str(gold)) else 0.0


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
