"""The ``code_interpreter`` tool's answer, standard library only: one implementation for the harness's environment
(``math_reasoning.env``) and the proposer's prototyping kit (``proto/math_reasoning/tool.py``, this file's source),
so what the proposer tries is what a candidate's episodes get.

:func:`answer` checks the call's ``code``, runs it (a function the caller gives: the environment's sandbox runner
or service client, the kit's HTTP client, each returning the run's ``output`` and ``error``) and words the result
as the model reads it: the output, a hint when there is none, or the error (with the start of the output before
it) as the tool error.
"""

from __future__ import annotations

from collections.abc import Callable

TOOL_NAME = "code_interpreter"
EMPTY_OUTPUT = "(no output: print() the values you need)"
#: characters of the output shown before a run's error
OUTPUT_BEFORE_ERROR_CHARS = 300

#: the runner the caller gives: code -> (output, error or None)
Run = Callable[[str], "tuple[str, str | None]"]


class CodeToolError(ValueError):
    """A call whose code is missing or whose run failed; the message is what the model reads as the tool error."""


def answer(arguments: dict, run: Run) -> str:
    """The tool message for one ``code_interpreter`` call; :class:`CodeToolError` for the tool error."""
    code = arguments.get("code")
    if not isinstance(code, str):
        raise CodeToolError("code_interpreter needs a string argument `code` with the Python source")
    output, error = run(code)
    if error is not None:
        before = f" Output before the error: {output[:OUTPUT_BEFORE_ERROR_CHARS]}" if output.strip() else ""
        raise CodeToolError(error + before)
    return output if output.strip() else EMPTY_OUTPUT
