"""The ``search`` tool's answer, standard library only: one implementation for the harness's environment
(``search_qa.env``) and the proposer's prototyping kit (``proto/search_qa/tool.py``, this file's source, run by
the agent's ``python3``), so what the proposer tries is what a candidate's episodes get.

:func:`answer` checks the call's arguments, asks a retriever (a function the caller gives: the environment's
index or service client, the kit's HTTP client) and renders the passages as Search-R1 does — ``Doc i(Title: t)
text``, one per line, queries of a multi-query call joined under ``Query: q`` — inside the reference's
``{"result": ...}`` JSON. Passages are cut to ``max_doc_tokens`` tokens of the policy's tokenizer by a retriever
that can (a service started with ``--tokenizer``), else to that many whitespace words here.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any

MAX_QUERIES = 8
MAX_QUERY_CHARS = 500
MAX_TOPK = 10
DEFAULT_TOPK = 3
DEFAULT_DOC_TOKENS = 200
MAX_DOC_TOKENS = 2000

#: one passage as the tool renders it: (title, text)
Passage = tuple[str, str]
#: the retriever the caller gives: (queries, topk, max_doc_tokens or None) -> per query, its passages;
#: ``max_doc_tokens`` is given only when :func:`answer` was told the retriever cuts in tokens
Retrieve = Callable[[list[str], int, "int | None"], Sequence[Sequence[Passage]]]


class SearchToolError(ValueError):
    """A call that failed; the message is what the model reads as the tool error."""


class SearchArgumentError(SearchToolError):
    """The call's arguments are out of bounds."""


def cut(text: str, max_words: int | None) -> str:
    """The first ``max_words`` words (None: the passage as it came, already cut by the service)."""
    words = text.split()
    return text if max_words is None or len(words) <= max_words else " ".join(words[:max_words]) + " ..."


def format_hits(passages: Sequence[Passage], max_words: int | None) -> str:
    """Search-R1's passage rendering: ``Doc i(Title: t) text``, one per line; ``max_words``: a cut in words."""
    if not passages:
        return "No results found."
    return "\n".join(f"Doc {i}(Title: {title}) {cut(text, max_words)}" for i, (title, text) in enumerate(passages, 1))


def as_result(text: str) -> str:
    """The tool message the model reads: ``{"result": text}`` as JSON, as the reference's search tool answers
    (docs/reproducing.md)."""
    return json.dumps({"result": text}, ensure_ascii=False)


def _int_arg(arguments: dict[str, Any], name: str, default: int, high: int) -> int:
    value = arguments.get(name, default)
    try:
        value = int(value)
    except (TypeError, ValueError):
        raise SearchArgumentError(f"search: `{name}` must be an integer from 1 to {high}, got {value!r}") from None
    if not 1 <= value <= high:
        raise SearchArgumentError(f"search: `{name}` must be from 1 to {high}, got {value}")
    return value


def parse_arguments(arguments: dict[str, Any]) -> tuple[list[str], int, int]:
    """(queries, topk, max_doc_tokens) of a call; :class:`SearchArgumentError` naming the argument."""
    queries = arguments.get("query_list", arguments.get("query"))
    if isinstance(queries, str):
        queries = [queries]
    if not isinstance(queries, list) or not queries:
        raise SearchArgumentError("search: `query_list` must be a non-empty list of strings")
    cleaned = [str(q).strip() for q in queries if str(q).strip()]
    if not cleaned:
        raise SearchArgumentError("search: every query in `query_list` is empty")
    if len(cleaned) > MAX_QUERIES:
        raise SearchArgumentError(f"search: at most {MAX_QUERIES} queries per call, got {len(cleaned)}")
    if any(len(q) > MAX_QUERY_CHARS for q in cleaned):
        raise SearchArgumentError(f"search: a query may have at most {MAX_QUERY_CHARS} characters")
    topk = _int_arg(arguments, "topk", DEFAULT_TOPK, MAX_TOPK)
    doc_tokens = _int_arg(arguments, "max_doc_tokens", DEFAULT_DOC_TOKENS, MAX_DOC_TOKENS)
    return cleaned, topk, doc_tokens


def render(queries: Sequence[str], rows: Sequence[Sequence[Passage]], max_words: int | None) -> str:
    """The tool message for ``rows`` (one list of passages per query)."""
    blocks = [format_hits(passages, max_words) for passages in rows]
    if len(queries) == 1:
        return as_result(blocks[0])
    return as_result("\n---\n".join(f"Query: {q}\n{b}" for q, b in zip(queries, blocks, strict=True)))


def answer(arguments: dict[str, Any], retrieve: Retrieve, cuts_tokens: Callable[[], bool]) -> str:
    """The tool message for one ``search`` call. ``cuts_tokens()``: whether ``retrieve`` cuts passages in the
    policy's tokens (asked only once the arguments are valid: an environment resolves its retriever lazily).
    :class:`SearchToolError` for the tool error: bad arguments, or any failure of the retriever
    (``search failed: ...``, e.g. a service that does not answer)."""
    queries, topk, doc_tokens = parse_arguments(arguments)
    try:
        in_tokens = bool(cuts_tokens())
        rows = retrieve(queries, topk, doc_tokens if in_tokens else None)
        return render(queries, rows, None if in_tokens else doc_tokens)
    except Exception as exc:  # any retriever failure is the model's tool error
        raise SearchToolError(f"search failed: {exc}") from exc
