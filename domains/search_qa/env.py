"""One search-QA episode: the question, a ``search`` tool over the local Wikipedia corpus, and the
normalised exact-match verifier.

The environment action is the model's final reply (text); the reward is the verifier on its last
``<answer>``. ``search(query_list, topk, max_doc_tokens)`` returns the top passages for each query,
each cut to ``max_doc_tokens`` tokens of the policy's tokenizer by the retriever service when it has one
(``--tokenizer``, as the reference's server cuts), else to that many whitespace words (the in-process index
and a service without a tokenizer: the environment does not hold the policy's tokenizer). Retrieval runs through ``$WHALE_RETRIEVER_URL`` when set (the cluster's ``/retrieve``
service), else an in-process BM25 index. Bad arguments and retriever failures are tool errors.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from search_qa.verifier import judged_score, last_answer, score
from whale.domain import DomainError, Environment, Hit, Retriever, StepResult, UnknownToolError

if TYPE_CHECKING:
    from search_qa.judge import Judge

TOOL_NAME = "search"
MAX_QUERIES = 8
MAX_QUERY_CHARS = 500
MAX_TOPK = 10
DEFAULT_TOPK = 3
DEFAULT_DOC_TOKENS = 200
MAX_DOC_TOKENS = 2000
TOOL_SPEC: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": TOOL_NAME,
        "description": "Search Wikipedia. Returns the top passages for each query.",
        "parameters": {
            "type": "object",
            "properties": {
                "query_list": {"type": "array", "items": {"type": "string"}, "description": "search queries"},
                "topk": {"type": "integer", "description": f"passages per query (1-{MAX_TOPK})"},
                "max_doc_tokens": {"type": "integer", "description": "cut each passage to this many tokens"},
            },
            "required": ["query_list"],
        },
    },
}


class ToolError(DomainError):
    """A tool call that failed; the runtime shows the message to the model as the tool error."""


def cut(text: str, max_tokens: int | None) -> str:
    """The first ``max_tokens`` words (None: the passage as it came, already cut by the service)."""
    words = text.split()
    return text if max_tokens is None or len(words) <= max_tokens else " ".join(words[:max_tokens]) + " ..."


def format_hits(hits: list[Hit], max_tokens: int | None) -> str:
    """Search-R1's passage rendering: ``Doc i(Title: t) text``, one per line; ``max_tokens``: a cut in words."""
    if not hits:
        return "No results found."
    return "\n".join(
        f"Doc {i}(Title: {h.passage.title}) {cut(h.passage.text, max_tokens)}" for i, h in enumerate(hits, 1)
    )


def as_result(text: str) -> str:
    """The tool message the model reads: ``{"result": text}`` as JSON, as the reference's search tool answers
    (docs/reproducing.md)."""
    return json.dumps({"result": text}, ensure_ascii=False)


def _int_arg(arguments: dict[str, Any], name: str, default: int, high: int) -> int:
    value = arguments.get(name, default)
    try:
        value = int(value)
    except (TypeError, ValueError):
        raise ToolError(f"search: `{name}` must be an integer from 1 to {high}, got {value!r}") from None
    if not 1 <= value <= high:
        raise ToolError(f"search: `{name}` must be from 1 to {high}, got {value}")
    return value


def parse_arguments(arguments: dict[str, Any]) -> tuple[list[str], int, int]:
    queries = arguments.get("query_list", arguments.get("query"))
    if isinstance(queries, str):
        queries = [queries]
    if not isinstance(queries, list) or not queries:
        raise ToolError("search: `query_list` must be a non-empty list of strings")
    cleaned = [str(q).strip() for q in queries if str(q).strip()]
    if not cleaned:
        raise ToolError("search: every query in `query_list` is empty")
    if len(cleaned) > MAX_QUERIES:
        raise ToolError(f"search: at most {MAX_QUERIES} queries per call, got {len(cleaned)}")
    if any(len(q) > MAX_QUERY_CHARS for q in cleaned):
        raise ToolError(f"search: a query may have at most {MAX_QUERY_CHARS} characters")
    topk = _int_arg(arguments, "topk", DEFAULT_TOPK, MAX_TOPK)
    doc_tokens = _int_arg(arguments, "max_doc_tokens", DEFAULT_DOC_TOKENS, MAX_DOC_TOKENS)
    return cleaned, topk, doc_tokens


class SearchEnvironment(Environment):
    def __init__(
        self, item: dict[str, Any], retriever: Retriever | Callable[[], Retriever], judge: Judge | None = None
    ):
        """``retriever``: the retriever, or a function giving it (an index is built on the first search
        only, so episodes that never search cost nothing); ``judge``: score with the LLM judge instead of EM."""
        self.item = item
        self._retriever = retriever
        self._judge = judge
        self.final_reply: str | None = None

    def reset(self) -> dict[str, Any]:
        return {"id": self.item["id"], "question": self.item["question"]}

    def step(self, action: Any) -> StepResult:
        """The final reply: text, or ``{"answer": text}``. Ends the episode."""
        text = action.get("answer") if isinstance(action, dict) else action
        self.final_reply = "" if text is None else str(text)
        answer = last_answer(self.final_reply)
        return StepResult(
            observation={"answer": answer},
            done=True,
            info={"answer": answer, "golden_answers": list(self.item["golden_answers"])},
            graded=(answer,) if answer else (),
        )

    def call_tool(self, name: str, arguments: dict[str, Any]) -> str:
        if name != TOOL_NAME:
            raise UnknownToolError(name, [TOOL_NAME])
        queries, topk, doc_tokens = parse_arguments(arguments)
        try:
            retriever = self._retriever if hasattr(self._retriever, "search") else self._retriever()
            in_tokens = bool(getattr(retriever, "cuts_tokens", False))  # the service cuts in the policy's tokens
            results = (
                retriever.search(queries, topk, max_doc_tokens=doc_tokens)  # type: ignore[call-arg]  # a RetrieverClient
                if in_tokens
                else retriever.search(queries, topk)
            )
        except Exception as exc:  # any retriever failure is the model's tool error
            raise ToolError(f"search failed: {exc}") from exc
        blocks = [format_hits(hits, None if in_tokens else doc_tokens) for hits in results]
        if len(queries) == 1:
            return as_result(blocks[0])
        return as_result("\n---\n".join(f"Query: {q}\n{b}" for q, b in zip(queries, blocks, strict=True)))

    def gold_answers(self) -> tuple[str, ...]:
        return tuple(str(g) for g in self.item["golden_answers"])

    def reward(self) -> float:
        if self._judge is not None:
            return judged_score(self.final_reply, self.item["golden_answers"], str(self.item["question"]), self._judge)
        return score(self.final_reply, self.item["golden_answers"])
