"""One math episode: the problem, a Python code-interpreter tool, and the strict ``\\boxed{}`` verifier.

The environment action is the model's final reply (text); the episode ends there and the reward is the
verifier on that reply, under ``spec.experiment.domainOptions.mathAnswer`` (``dapo``, the paper's, by default). The
``code_interpreter`` tool runs model code in a sandbox (``whale.tools.code``, locally or through the
deployed ``/run`` service); any run that did not end cleanly — an exception, a timeout, a memory bomb,
too much output — is a tool error the model sees.
"""

from __future__ import annotations

from typing import Any

from math_reasoning import tool
from math_reasoning.verifier import AnswerMatch, extracted_answer, score
from whale.domain import CodeRunner, DomainError, Environment, StepResult, UnknownToolError

TOOL_NAME = tool.TOOL_NAME
TOOL_SPEC: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": TOOL_NAME,
        "description": (
            "Run Python 3 code in a fresh sandbox (30 s, 1 GiB, no network, no files kept between calls) "
            "and return what it prints. The value of a final bare expression is printed too. "
            "numpy and sympy are available."
        ),
        "parameters": {
            "type": "object",
            "properties": {"code": {"type": "string", "description": "the Python source to run"}},
            "required": ["code"],
        },
    },
}
EMPTY_OUTPUT = tool.EMPTY_OUTPUT


class ToolError(DomainError):
    """A tool call that failed; the runtime shows the message to the model as the tool error."""


class MathEnvironment(Environment):
    def __init__(self, item: dict[str, Any], runner: CodeRunner, match: AnswerMatch = "dapo"):
        self.item = item
        self.runner = runner
        #: how the final reply is scored (spec.experiment.domainOptions.mathAnswer)
        self.match: AnswerMatch = match
        self.final_reply: str | None = None

    def reset(self) -> dict[str, Any]:
        return {"id": self.item["id"], "problem": self.item["problem"], "question": self.item["problem"]}

    def step(self, action: Any) -> StepResult:
        """The final reply: text, or ``{"answer": text}``. Ends the episode."""
        text = action.get("answer") if isinstance(action, dict) else action
        self.final_reply = "" if text is None else str(text)
        boxed = extracted_answer(self.final_reply, self.match)
        return StepResult(
            observation={"answer": self.final_reply, "boxed": boxed},
            done=True,
            info={"boxed": boxed, "gold": self.item["answer"], "match": self.match},
            graded=(boxed,) if boxed else (),
        )

    def call_tool(self, name: str, arguments: dict[str, Any]) -> str:
        if name != TOOL_NAME:
            raise UnknownToolError(name, [TOOL_NAME])
        try:
            return tool.answer(arguments, self._run)
        except tool.CodeToolError as exc:
            raise ToolError(str(exc)) from None

    def _run(self, code: str) -> tuple[str, str | None]:
        result = self.runner.run(code)
        return result.output, result.error

    def gold_answers(self) -> tuple[str, ...]:
        return (str(self.item["answer"]),)

    def reward(self) -> float:
        return score(self.final_reply, self.item["answer"], self.match)
