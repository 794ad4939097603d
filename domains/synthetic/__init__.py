"""The synthetic domain: repeat a digit, answered in ``<answer></answer>``; a tiny model learns it on a CPU.

Registered under the ``whale.domains`` entry-point group as ``synthetic = "synthetic:DOMAIN"``. It is
the domain of the CPU demo runs and of the RSFT learning check: items are generated from the data
seed (:mod:`synthetic.tasks`), an episode is one answer judged by exact match, and
:mod:`synthetic.tiny_model` builds a matching tiny model that knows the format but not the task.
``spec.experiment.domainOptions.syntheticTask: addition`` asks for a sum of two numbers instead (the local SmolLM2 comparison's harder
task), with an h0 and a skill of its own (``h0_addition.py``, ``SKILL-addition.md``).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from synthetic import tasks
from synthetic.options import SyntheticOptions
from whale.domain import DEFAULT_ALLOWED_IMPORTS, Domain, DomainError, Environment, StepResult

if TYPE_CHECKING:
    from whale.domain import Data, Store

HERE = Path(__file__).resolve().parent


class SyntheticEnvironment(Environment):
    """One question, one answer: the first answer ends the episode and is scored."""

    def __init__(self, item: dict[str, Any]):
        self.item = item
        self.answer: str | None = None

    def reset(self) -> dict[str, Any]:
        fields: dict[str, Any] = {k: self.item[k] for k in ("digit", "a", "b") if k in self.item}
        return {"id": self.item["id"], **fields, "question": tasks.user_prompt(self.item)}

    def step(self, action: Any) -> StepResult:
        self.answer = action if isinstance(action, str) else ("" if action is None else str(action))
        submitted = tasks.extract_answer(self.answer)
        return StepResult(
            observation={"answered": True},
            done=True,
            info={"expected": self.item["answer"]},
            graded=(submitted,) if submitted else (),
        )

    def gold_answers(self) -> tuple[str, ...]:
        return (str(self.item["answer"]),)

    def reward(self) -> float:
        return tasks.score(self.answer or "", self.item)


class Synthetic(Domain):
    name = "synthetic"
    allowed_imports = DEFAULT_ALLOWED_IMPORTS
    max_turns_limit = 3
    options_model = SyntheticOptions

    @property
    def task(self) -> tasks.Task:
        """``spec.experiment.domainOptions.syntheticTask``."""
        return tasks.Task(self.options.synthetic_task)

    def split_sizes(self, data: Data) -> dict[str, int]:
        sizes = dict(tasks.SPLIT_SIZES)
        sizes["harness"] = min(sizes["harness"], data.harness_size)
        if data.weight_size is not None:
            sizes["weight"] = min(sizes["weight"], data.weight_size)
        if data.test_size is not None:
            sizes["test"] = min(sizes["test"], data.test_size)
        return sizes

    def load_split(self, split: str, data: Data, store: Store | None = None) -> list[dict[str, Any]]:
        if split not in tasks.SPLIT_SIZES:
            raise DomainError(f"unknown split {split!r}; use one of {sorted(tasks.SPLIT_SIZES)}")
        return tasks.make_split(split, self.split_sizes(data)[split], data.seed, self.task)

    def item_from_raw(self, raw: dict[str, Any]) -> dict[str, Any]:
        if "a" in raw or "b" in raw:
            return _addition_from_raw(raw)
        try:
            digit = int(raw["digit"])
        except (KeyError, TypeError, ValueError):
            raise DomainError(f"synthetic item {raw!r}: needs an integer field 'digit' (0-9)") from None
        if not 0 <= digit <= 9:
            raise DomainError(f"synthetic item {raw!r}: 'digit' must be 0-9, got {digit}")
        return {"id": str(raw.get("id", f"raw-{digit}")), "digit": digit, "answer": str(digit)}

    def make_env(self, item: dict[str, Any]) -> SyntheticEnvironment:
        return SyntheticEnvironment(item)

    def h0_path(self) -> Path:
        return HERE / "h0.py"

    def h0_path_for(self, data: Data) -> Path:
        return HERE / "h0_addition.py" if self.task == tasks.Task.ADDITION else self.h0_path()

    def skill_path(self) -> Path:
        return HERE / "SKILL.md"

    def skill_text(self, data: Data) -> str:
        path = HERE / "SKILL-addition.md" if self.task == tasks.Task.ADDITION else self.skill_path()
        return path.read_text("utf-8")


def _addition_from_raw(raw: dict[str, Any]) -> dict[str, Any]:
    try:
        a, b = int(raw["a"]), int(raw["b"])
    except (KeyError, TypeError, ValueError):
        raise DomainError(f"synthetic addition item {raw!r}: needs integer fields 'a' and 'b'") from None
    if not all(0 <= n <= 10**6 for n in (a, b)):
        raise DomainError(f"synthetic addition item {raw!r}: 'a' and 'b' must be in [0, 1000000]")
    return tasks.addition_item(str(raw.get("id", f"raw-{a}+{b}")), a, b)


DOMAIN = Synthetic()
