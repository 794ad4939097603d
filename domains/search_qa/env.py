"""One search-QA episode: the question, a ``search`` tool over the local Wikipedia corpus, and the
normalised exact-match verifier.

The environment action is the model's final reply (text); the reward is the verifier on its last
``<answer>``. ``search(query_list, topk, max_doc_tokens)`` returns the top passages for each query,
each cut to ``max_doc_tokens`` tokens of the policy's tokenizer by the retriever service when it has one
(``--tokenizer``, as the reference's server cuts), else to that many whitespace words (the in-process index
and a service without a tokenizer: the environment does not hold the policy's tokenizer). Retrieval runs
through ``$WHALE_RETRIEVER_URL`` when set (the cluster's ``/retrieve`` service), else an in-process BM25 index.
Bad arguments and retriever failures are tool errors. The answer itself is :mod:`search_qa.tool`'s, the code the
proposer's prototyping kit runs too.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from search_qa import tool
from search_qa.verifier import judged_answer, judged_score, last_answer, score
from whale.domain import DomainError, Environment, Retriever, StepResult, UnknownToolError

if TYPE_CHECKING:
    from search_qa.judge import Judge

TOOL_NAME = "search"
TOOL_SPEC: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": TOOL_NAME,
        "description": "Search Wikipedia. Returns the top passages for each query.",
        "parameters": {
            "type": "object",
            "properties": {
                "query_list": {"type": "array", "items": {"type": "string"}, "description": "search queries"},
                "topk": {"type": "integer", "description": f"passages per query (1-{tool.MAX_TOPK})"},
                "max_doc_tokens": {"type": "integer", "description": "cut each passage to this many tokens"},
            },
            "required": ["query_list"],
        },
    },
}


class ToolError(DomainError):
    """A tool call that failed; the runtime shows the message to the model as the tool error."""


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
        # what the verifier grades: the judge pairs the answer tags as the reference's judge, EM as verl's EM
        answer = judged_answer(self.final_reply) if self._judge is not None else last_answer(self.final_reply)
        return StepResult(
            observation={"answer": answer},
            done=True,
            info={"answer": answer, "golden_answers": list(self.item["golden_answers"])},
            graded=(answer,) if answer else (),
        )

    def call_tool(self, name: str, arguments: dict[str, Any]) -> str:
        if name != TOOL_NAME:
            raise UnknownToolError(name, [TOOL_NAME])
        try:
            return tool.answer(arguments, self._search, self._cuts_tokens)
        except tool.SearchToolError as exc:  # bad arguments, or the retriever failed
            raise ToolError(str(exc)) from exc

    def _resolved(self) -> Retriever:
        if hasattr(self._retriever, "search"):
            return self._retriever
        return self._retriever()

    def _cuts_tokens(self) -> bool:
        """Whether the retriever cuts in the policy's tokens (a service started with ``--tokenizer``)."""
        return bool(getattr(self._resolved(), "cuts_tokens", False))

    def _search(self, queries: list[str], topk: int, max_doc_tokens: int | None) -> list[list[tool.Passage]]:
        retriever = self._resolved()
        if max_doc_tokens is None:
            rows = retriever.search(queries, topk)
        else:  # a RetrieverClient whose service cuts
            rows = retriever.search(queries, topk, max_doc_tokens=max_doc_tokens)  # type: ignore[call-arg]
        return [[(h.passage.title, h.passage.text) for h in hits] for hits in rows]

    def gold_answers(self) -> tuple[str, ...]:
        return tuple(str(g) for g in self.item["golden_answers"])

    def reward(self) -> float:
        if self._judge is not None:
            return judged_score(self.final_reply, self.item["golden_answers"], str(self.item["question"]), self._judge)
        return score(self.final_reply, self.item["golden_answers"])
