"""The math domain's Python code interpreter: model-written code run in ``whale.sandbox``.

Model code is hostile by assumption. Each call is one sandboxed process behind the allow-list wall
(a fresh root with only the system runtime, the interpreter and a bounded in-memory scratch; its own
PID and network namespaces; an unprivileged uid; no inherited environment; CPU / memory /
wall-clock / output limits). It may import the standard library and the math packages of
:data:`CODE_PACKAGES` that are installed — never ``whale``, a domain package or a data file, which do
not exist inside. Whatever the sandbox had to stop — a timeout, a memory bomb, a flood of output —
comes back as a :class:`CodeResult` whose ``error`` is the message the model sees as the tool error;
the caller's process is never at risk. The same function backs the in-process tool and the ``/run``
service.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import importlib.util
import math
import re
from typing import Any, Protocol

from whale.sandbox import Isolation, Limits, MiB, Outcome, SandboxSetupError, run_python

#: third-party packages model code may import (each mounted read-only if installed here)
CODE_PACKAGES = ("numpy", "sympy", "mpmath")


@functools.cache
def code_isolation(packages: tuple[str, ...] = CODE_PACKAGES) -> Isolation:
    """The code tool's sandbox: the standard library plus those of ``packages`` that are installed."""
    return Isolation(packages=tuple(p for p in packages if importlib.util.find_spec(p) is not None))


@dataclasses.dataclass(frozen=True)
class CodeLimits:
    """Per-call bounds; the defaults are the paper's (30 s, 1 GiB)."""

    timeout_s: float = 30.0
    memory_mb: int = 1024
    #: characters of stdout+stderr returned to the model (the sandbox kills at ``kill_output_bytes``)
    max_output_chars: int = 8000
    kill_output_bytes: int = 1 * MiB
    max_code_chars: int = 64_000
    processes: int = 64
    #: size of the in-memory scratch directory (files the code writes)
    scratch_mb: int = 64

    def sandbox_limits(self, timeout_s: float | None = None) -> Limits:
        wall = min(timeout_s or self.timeout_s, self.timeout_s)
        return Limits(
            wall_s=wall,
            # the wall clock is the limit the model is told about; CPU time is a backstop one second
            # later, so a busy loop on an idle machine still ends as a timeout, not a CPU kill
            cpu_s=math.ceil(wall) + 1,
            memory_bytes=self.memory_mb * MiB,
            file_size_bytes=64 * MiB,
            processes=self.processes,
            open_files=256,
            stdout_bytes=self.kill_output_bytes,
            stderr_bytes=self.kill_output_bytes,
            scratch_bytes=self.scratch_mb * MiB,
        )


@dataclasses.dataclass(frozen=True)
class CodeResult:
    """One execution as the tool reports it. ``error`` is None only for a clean run."""

    outcome: str
    output: str
    error: str | None
    wall_s: float

    @property
    def ok(self) -> bool:
        return self.error is None

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, obj: dict[str, Any]) -> CodeResult:
        return cls(str(obj["outcome"]), str(obj.get("output", "")), obj.get("error"), float(obj.get("wall_s", 0.0)))


class CodeRunner(Protocol):
    """What the math environment needs: run one snippet, get a :class:`CodeResult`."""

    def run(self, code: str, timeout_s: float | None = None) -> CodeResult: ...


_FENCE = re.compile(r"```(?:python|py)?\s*\n(.*?)```", re.DOTALL)


def prepare(code: str) -> str:
    """Interpreter conveniences: take the code out of a Markdown fence, and print the value of a
    trailing expression (as a notebook cell would), unless it already is a ``print(...)``."""
    m = _FENCE.search(code)
    if m:
        code = m.group(1)
    try:
        tree = ast.parse(code)
    except SyntaxError:
        return code  # run as is: the traceback tells the model what is wrong
    if tree.body and isinstance(tree.body[-1], ast.Expr):
        last = tree.body[-1]
        call = last.value
        is_print = isinstance(call, ast.Call) and isinstance(call.func, ast.Name) and call.func.id == "print"
        if not is_print:
            lines = code.splitlines()
            start, end = last.lineno - 1, last.end_lineno or last.lineno
            # only rewrite a trailing expression that owns its lines (not `x = 1; x`)
            if last.col_offset == 0 and all(not line.strip() for line in lines[end:]):
                expr = "\n".join(lines[start:end])
                lines[start:end] = [
                    f"__whale_value = ({expr})",
                    "if __whale_value is not None:",
                    "    print(repr(__whale_value))",
                ]
                return "\n".join(lines) + "\n"
    return code


def _clip(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    half = limit // 2
    return f"{text[:half]}\n... [{len(text) - limit} characters cut] ...\n{text[-half:]}"


def _message(outcome: Outcome, limits: CodeLimits, wall: float, error_type: str | None, stderr: str) -> str | None:
    if outcome is Outcome.OK:
        return None
    if outcome is Outcome.TIMEOUT:
        return f"Timeout: the code ran longer than {wall:g} s and was stopped."
    if outcome is Outcome.CPU_LIMIT:
        return f"CPU time limit: the code used more than {int(wall)} s of CPU and was stopped."
    if outcome is Outcome.MEMORY_LIMIT:
        return f"Memory limit: the code tried to use more than {limits.memory_mb} MiB and was stopped."
    if outcome is Outcome.OUTPUT_LIMIT:
        return f"Output limit: the code printed more than {limits.kill_output_bytes} bytes and was stopped."
    if outcome is Outcome.FILE_SIZE_LIMIT:
        return "File size limit: the code wrote a file larger than allowed and was stopped."
    if outcome is Outcome.KILLED:
        return f"The code was killed ({error_type or 'signal'})."
    if outcome is Outcome.SANDBOX_ERROR:
        return "The code interpreter is unavailable right now (sandbox setup failed)."
    lines = [line for line in stderr.strip().splitlines() if line.strip()]
    if not lines:
        return f"The code failed ({error_type or 'non-zero exit'})."
    # the exception line first: callers may keep only the head of the message
    return _clip(lines[-1] + "\n" + "\n".join(lines[-10:-1]), 2000)


def execute(
    code: str, limits: CodeLimits = CodeLimits(), timeout_s: float | None = None, isolation: Isolation | None = None
) -> CodeResult:
    """Run ``code`` in a fresh sandbox and describe the result for the model."""
    if not isinstance(code, str) or not code.strip():
        return CodeResult("rejected", "", "No code given: pass the Python source as `code`.", 0.0)
    if len(code) > limits.max_code_chars:
        return CodeResult(
            "rejected", "", f"The code is {len(code)} characters; the limit is {limits.max_code_chars}.", 0.0
        )
    sb_limits = limits.sandbox_limits(timeout_s)
    try:
        res = run_python(prepare(code), limits=sb_limits, isolation=isolation or code_isolation())
    except SandboxSetupError as exc:
        return CodeResult(
            Outcome.SANDBOX_ERROR.value, "", f"The code interpreter is unavailable right now ({exc}).", 0.0
        )
    output = res.stdout
    if res.ok and res.stderr.strip():
        output += ("\n" if output and not output.endswith("\n") else "") + res.stderr
    error = _message(res.outcome, limits, sb_limits.wall_s, res.error_type, res.stderr)
    return CodeResult(res.outcome.value, _clip(output, limits.max_output_chars), error, round(res.wall_s, 3))


class LocalCodeRunner:
    """In-process runner: each call starts its own sandboxed process."""

    def __init__(self, limits: CodeLimits = CodeLimits(), isolation: Isolation | None = None):
        self.limits = limits
        self.isolation = isolation

    def run(self, code: str, timeout_s: float | None = None) -> CodeResult:
        return execute(code, self.limits, timeout_s, self.isolation)
