"""The math_reasoning domain: competition math with a Python code interpreter (docs/data.md#math_reasoning).

Registered under ``whale.domains`` as ``math_reasoning = "math_reasoning:DOMAIN"``. Items are the raw row
format ``{"id", "problem", "answer"}``; D_test is AIME 2024 + 2025, D_weight / D_harness come from the MATH
train problems with numeric answers (``math_reasoning.data``); ``spec.experiment.domainOptions.mathSet: gsm8k`` takes all three
from GSM8K instead. The verifier is the strict ``\\boxed{}``
match of the final reply (``math_reasoning.verifier``; DAPO's string match by default, math-verify with
``spec.experiment.domainOptions.mathAnswer: mathVerify``); the tool is ``code_interpreter`` (``math_reasoning.env``),
served by ``$WHALE_CODE_URL`` when set (the cluster's ``/run`` service), else by local sandboxes.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any

from math_reasoning.options import MathOptions
from whale.domain import DEFAULT_ALLOWED_IMPORTS, DomainError, SplitsInMemoryDomain, ToolService, data_root

if TYPE_CHECKING:
    from math_reasoning.env import MathEnvironment
    from whale.domain import CodeRunner, Data, FullData

HERE = Path(__file__).resolve().parent


class MathReasoning(SplitsInMemoryDomain):
    name = "math_reasoning"
    #: the paper's list plus text helpers; no sympy/numpy in the harness (the model's code has them)
    allowed_imports = DEFAULT_ALLOWED_IMPORTS | {"json", "string", "textwrap"}
    #: h0 uses 2; a candidate may use more turns, never more than this: the reference's clamp of a harness's
    #: MAX_TURNS (docs/reproducing.md, turn caps)
    max_turns_limit = 16
    options_model = MathOptions
    #: on a cluster the model's code runs in the run's code-interpreter service ($WHALE_CODE_URL)
    tool_services = (
        ToolService(
            name="sandbox",
            module="whale.tools.code_interpreter",
            url_env="WHALE_CODE_URL",
            sandboxed=True,
            args=("--timeout-s", "30", "--memory-mb", "1024"),
        ),
    )

    def __init__(self, runner: CodeRunner | None = None) -> None:
        """``runner``: the code runner to use (tests, benchmarks); default resolved from the environment."""
        self._runner = runner
        self._injected = runner is not None
        #: spec.execution.sandbox.isolation of the local code sandboxes
        self._isolation = "namespaces"
        self._lock = threading.Lock()

    @property
    def answer_match(self) -> str:
        """``spec.experiment.domainOptions.mathAnswer``: how final replies are scored (dapo, the paper's strict match,
        by default; or mathVerify)."""
        return str(self.options.math_answer)

    def configure_sandbox(self, isolation: str) -> None:
        """Local code sandboxes run under ``spec.execution.sandbox.isolation`` (an injected runner is kept as is;
        the deployed service's pod is its own wall)."""
        with self._lock:
            if isolation != self._isolation:
                self._isolation = isolation
                if not self._injected:
                    self._runner = None  # resolved again, with the new isolation

    def full_data(self) -> FullData:
        from math_reasoning.full import FULL

        return FULL

    def build_splits(self, data: Data) -> dict[str, list[dict[str, Any]]]:
        from math_reasoning.data import load_splits

        return load_splits(
            data_root(data),
            seed=data.seed,
            harness_size=data.harness_size,
            weight_size=data.weight_size,
            test_size=data.test_size,
            math_set=self.options.math_set,
        )

    def item_from_raw(self, raw: dict[str, Any]) -> dict[str, Any]:
        from math_reasoning.data import to_item

        if "id" not in raw:
            raise DomainError('a math item needs "id", "problem" and "answer"')
        return to_item(raw, "raw")

    def runner(self):
        """The code runner every episode of this process shares (resolved once, from the environment)."""
        with self._lock:
            if self._runner is None:
                from whale.domain import code_runner_from_env, tool_isolation

                self._runner = code_runner_from_env(tool_isolation(self._isolation))  # type: ignore[arg-type]  # a spec.execution.sandbox.isolation value
            return self._runner

    def make_env(self, item: dict[str, Any]) -> MathEnvironment:
        from math_reasoning.env import MathEnvironment

        return MathEnvironment(item, self.runner(), self.answer_match)  # type: ignore[arg-type]  # a spec.experiment.domainOptions.mathAnswer value

    def tool_specs(self) -> list[dict[str, Any]]:
        from math_reasoning.env import TOOL_SPEC

        return [TOOL_SPEC]

    def prototype_modules(self) -> dict[str, str]:
        """The code tool's answer (``math_reasoning.tool``, standard library only) as the kit runs it."""
        return {"math_reasoning/tool.py": (HERE / "tool.py").read_text("utf-8")}

    def h0_path(self) -> Path:
        return HERE / "h0.py"

    def skill_path(self) -> Path:
        return HERE / "SKILL.md"


DOMAIN = MathReasoning()
