"""Answer provenance: what a verifier grades must be text the model wrote in that episode.

One rule for every domain. A harness chooses which model reply is final and may cut the answer out of
it (chess: the move inside ``<move>``; synthetic: the digit the model names), but it cannot write the
answer itself: every answer a step submits for grading (:attr:`whale.domain.StepResult.graded`, the
spellings the verifier reads, e.g. a move's UCI and SAN) must occur, normalised, as a whole token
sequence in some model reply of the episode (its content, reasoning or tool-call arguments: every
string of the assistant message the runtime appended from the completion, never a message a hook
added). An episode that submits an answer the model did not write scores 0.

Answer injection: a harness that puts the gold answer into the prompt makes the model copy it, and
the rule above passes. So the gold answers (:meth:`whale.domain.Environment.gold_answers`) are looked
for in the context the harness authored (the messages its hooks added), in order: a gold answer
found there before any model reply wrote it, where no text the environment gave the episode (the
task, observations, tool results) showed it before that message, marks the episode ``answer_injected``.

Normalisation: Unicode NFKC, case folded, whitespace runs collapsed to one space. "Whole token": the
characters beside a match are not letters or digits where the answer's own edge is one (``204`` is
not found in ``2045``). Limits (docs/security.md): a short answer the model wrote anywhere passes (a
harness may pick a number the model mentioned); a harness may still choose among replies; the
injection check sees literal gold only (an encoded hint is not found). Pure: texts in, a verdict out.
"""

from __future__ import annotations

import dataclasses
import unicodedata
from collections.abc import Iterable, Sequence
from typing import Any

#: at most this many characters of a text are searched (the runner bounds messages well below this)
MAX_TEXT_CHARS = 4 << 20


def normalise(text: str) -> str:
    """NFKC, case folded, whitespace collapsed (the form answers and texts are compared in)."""
    return " ".join(unicodedata.normalize("NFKC", text[:MAX_TEXT_CHARS]).casefold().split())


def occurs(answer: str, text: str) -> bool:
    """Whether normalised ``answer`` occurs in normalised ``text`` as a whole token sequence."""
    if not answer:
        return False
    start = text.find(answer)
    while start != -1:
        end = start + len(answer)
        before_ok = not answer[0].isalnum() or start == 0 or not text[start - 1].isalnum()
        after_ok = not answer[-1].isalnum() or end == len(text) or not text[end].isalnum()
        if before_ok and after_ok:
            return True
        start = text.find(answer, start + 1)
    return False


def strings(value: Any) -> Iterable[str]:
    """Every string inside a JSON value (a message's content, tool-call arguments, an observation)."""
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for key, item in value.items():
            if key != "role":
                yield from strings(item)
    elif isinstance(value, list):
        for item in value:
            yield from strings(item)


def text_of(value: Any) -> str:
    """The normalised text of a JSON value (its strings joined by newlines)."""
    return normalise("\n".join(strings(value)))


@dataclasses.dataclass(frozen=True)
class Verdict:
    """One episode's provenance."""

    #: answers submitted for grading (each a tuple of spellings)
    graded: int = 0
    #: submitted answers no model reply of the episode contains (first spelling of each)
    not_model: tuple[str, ...] = ()
    #: gold answers found in the harness's context before any model reply wrote them
    injected: tuple[str, ...] = ()

    @property
    def reason(self) -> str | None:
        """One line for the trace, None when nothing is wrong."""
        parts = []
        if self.not_model:
            parts.append(f"graded answer {self.not_model[0][:80]!r} is in no model reply of the episode (scored 0)")
        if self.injected:
            parts.append("the harness's own messages hold the gold answer before the model wrote it")
        return "; ".join(parts) or None


def check(
    messages: Sequence[dict[str, Any]],
    model_indices: Iterable[int],
    env_texts: Iterable[tuple[int, Any]],
    graded: Iterable[Sequence[str]],
    gold: Sequence[str],
) -> Verdict:
    """The provenance of one episode.

    ``messages``: the conversation in order; ``model_indices``: which of them the runtime appended
    from a model completion; ``env_texts``: what the environment gave (task, observations, tool
    results; any JSON), each with the number of messages the episode had when it came; ``graded``: the spellings of every answer submitted for grading;
    ``gold``: the item's gold answers (empty: no injection check)."""
    submitted = [tuple(s for s in (normalise(x) for x in spellings) if s) for spellings in graded]
    submitted = [s for s in submitted if s]
    golds = [g for g in dict.fromkeys(normalise(g) for g in gold) if g]
    if not submitted and not golds:
        return Verdict()
    by_model = set(model_indices)
    texts = [text_of(m) for m in messages]  # each message normalised once
    model_text = "\n".join(texts[i] for i in sorted(by_model) if 0 <= i < len(messages))
    not_model = tuple(s[0] for s in submitted if not any(occurs(x, model_text) for x in s))
    injected: list[str] = []
    if golds:
        env = sorted(((position, text_of(value)) for position, value in env_texts), key=lambda e: e[0])
        for g in golds:
            # the first message that holds it; the environment must not have shown it before that message
            first = next((i for i, text in enumerate(texts) if occurs(g, text)), None)
            if first is None or first in by_model:
                continue
            if not any(position <= first and occurs(g, text) for position, text in env):
                injected.append(g)
    return Verdict(graded=len(submitted), not_model=not_model, injected=tuple(injected))
