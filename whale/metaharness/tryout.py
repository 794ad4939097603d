"""A harness tried on real D_harness tasks with model replies the proposer scripts: no model runs, nothing is graded.

The reference's skills make prototyping required (call the harness's ``search()`` on a few real questions against
the retriever, try its hooks on trajectories). The ``cli`` agent does that with the kit in its workspace
(:mod:`whale.metaharness.proposer.kit`); the built-in agents, whose shell has no network, do it through the
``try_harness`` tool, which runs here: the harness in the same sandboxed pool and episode runner as scoring, each
model turn answered by the next scripted reply (``whale.inference.scripted``: text read as a server's tool-call
parser reads it), each tool call answered by the domain's real tool (the retriever, the code interpreter) through
the environment's own ``call_tool``.

What can never come back is a grade: :func:`tools_only` gives the runner environments whose ``step`` (the harness
submitting its answer) ends the episode without reaching the real environment — no reward, no gold — so scripted
replies cannot probe the answers. ``reset`` (the task as a harness's ``start`` gets it) and ``call_tool`` are the
real environment's. A :attr:`~whale.domain.Domain.prototype_steps` domain (chess) is the exception the reference's
skill asks for (test ``env_response`` on trajectories): its steps run for real, each answered as the model reads it
turn by turn (the move's verdict, the opponent's reply; what the environment service answers the ``cli`` agent's
kit), still with no reward, ``info`` or gold.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from whale.domain import Domain, Environment, StepResult

if TYPE_CHECKING:
    from whale.domain import Data, Store

#: the observation a harness gets when it submits: the episode ends there, ungraded
SUBMITTED: dict[str, Any] = {"submitted": True, "graded": False}


class SubmitOnlyEnvironment(Environment):
    """A real environment whose ``step`` is recorded, never run: the episode ends ungraded. ``steps``: run each
    step for real and pass on only what a harness's ``observe`` gets (a ``prototype_steps`` domain)."""

    def __init__(self, env: Environment, steps: bool = False):
        self._env = env
        self._steps = steps
        #: what the harness submitted (None: nothing yet)
        self.submitted: Any = None

    def reset(self) -> dict[str, Any]:
        return self._env.reset()

    def step(self, action: Any) -> StepResult:
        self.submitted = action
        if self._steps:
            played = self._env.step(action)
            return StepResult(observation=played.observation, done=played.done)  # no info, nothing graded
        return StepResult(observation=dict(SUBMITTED), done=True)

    def call_tool(self, name: str, arguments: dict[str, Any]) -> str:
        return self._env.call_tool(name, arguments)

    def reward(self) -> float:
        return 0.0

    def gold_answers(self) -> tuple[str, ...]:
        return ()

    def close(self) -> None:
        self._env.close()


class _ToolsOnly(Domain):
    """``domain`` with :class:`SubmitOnlyEnvironment`\\ s; everything else is the domain's own."""

    name = "tools-only"

    def __init__(self, domain: Domain):
        self._domain = domain

    def split_sizes(self, data: Data) -> dict[str, int]:
        return self._domain.split_sizes(data)

    def load_split(self, split: str, data: Data, store: Store | None = None) -> list[dict[str, Any]]:
        return self._domain.load_split(split, data, store)

    def make_env(self, item: dict[str, Any]) -> Environment:
        return SubmitOnlyEnvironment(self._domain.make_env(item), steps=self._domain.prototype_steps)

    def h0_path(self) -> Path:
        return self._domain.h0_path()

    def skill_path(self) -> Path:
        return self._domain.skill_path()

    def tool_specs(self) -> list[dict[str, Any]]:
        return self._domain.tool_specs()

    def subset(self, item: dict[str, Any]) -> str:
        return self._domain.subset(item)


def tools_only(domain: Domain) -> Domain:
    """``domain`` as the runner should see it for a try-out: its name, imports, turn cap and tools, its tasks
    reset and its tools called for real, every submission ending the episode ungraded."""
    attrs = {
        "name": domain.name,
        "allowed_imports": domain.allowed_imports,
        "max_turns_limit": domain.max_turns_limit,
        "tool_services": domain.tool_services,
        "prototype_steps": domain.prototype_steps,
    }
    return type(f"ToolsOnly_{type(domain).__name__}", (_ToolsOnly,), attrs)(domain)
