"""Strict ``\\boxed{}`` scoring: the last box of the final reply, checked against the gold answer.

Locating the box is brace matching (the one thing math-verify does not expose); comparing the boxed
expression with the gold answer is math-verify's job (``\\frac{1}{2}`` == ``0.5``, ``1,000`` == ``1000``).
No box in the final reply scores 0, whatever the rest of the reply says: the h0 prompt asks for the box.
"""

from __future__ import annotations

import re
import threading

import math_verify

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


def score(final_reply: str | None, gold: str) -> float:
    """1.0 when the last box of the final reply equals the gold answer, else 0.0."""
    boxed = last_boxed(final_reply or "")
    if boxed is None:
        return 0.0
    return 1.0 if is_equivalent(boxed, str(gold)) else 0.0
