"""What the environment service answers (``whale.tools.env_service``), without the HTTP: a fresh episode of one
served task, its actions stepped in turn through the domain's own environment, each result as a harness's
``observe`` gets it (:meth:`whale.domain.StepResult.harness_result`, the episode runner's rule).

A task is named by what a harness's ``start`` gets, ``Environment.reset()`` (a line of the kit's ``tasks.jsonl``):
chess shows no puzzle id, so the position names the puzzle.

Only the tasks it was given (the run's D_harness) and only a :attr:`whale.domain.Domain.prototype_steps` domain
(chess: each move's verdict and the opponent's reply are what the model reads turn by turn anyway): never a
reward, an ``info`` or the gold answers, and never an action after the one that ends the episode (the runner
stops there too).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

from whale.domain import Domain

#: actions one request may step (chess: 9 solver moves at most, plus the forgiven retries)
MAX_ACTIONS = 64
#: characters of one action's JSON
MAX_ACTION_CHARS = 2_000
#: characters of the task's JSON (the kit's tasks are at most 64 kB)
MAX_TASK_CHARS = 64_000


def task_key(task: Any) -> str:
    """A task as JSON with sorted keys: what names it in a request."""
    return json.dumps(task, sort_keys=True, ensure_ascii=False, separators=(",", ":"))


class ReplayRequestError(ValueError):
    """A request the service refuses; the message names the field and the fix."""


class UnknownTaskError(ReplayRequestError):
    """A task the service does not serve (not one of the run's D_harness tasks)."""


class EnvReplay:
    """The served tasks of one domain, by what ``reset()`` shows of each."""

    def __init__(self, domain: Domain, items: Iterable[Mapping[str, Any]]):
        if not domain.prototype_steps:
            raise ValueError(
                f"domain {domain.name!r}: its steps are graded answers (prototype_steps is False); "
                "the environment service serves only domains whose step answers the proposer may see"
            )
        self.domain = domain
        self.items: dict[str, dict[str, Any]] = {}
        for item in items:
            env = domain.make_env(dict(item))
            try:
                self.items[task_key(json.loads(json.dumps(env.reset())))] = dict(item)
            finally:
                env.close()

    def replay(self, task: Any, actions: Any) -> dict[str, Any]:
        """``{"results", "unplayed"}``: the results of ``actions`` on a fresh episode of ``task`` (a task as
        ``reset()`` gives it), up to the one that ends it; ``unplayed``: how many came after it."""
        if not isinstance(task, dict) or len(task_key(task)) > MAX_TASK_CHARS:
            raise ReplayRequestError(f"task: a task object of proto/tasks.jsonl (at most {MAX_TASK_CHARS} characters)")
        if not isinstance(actions, list) or len(actions) > MAX_ACTIONS:
            raise ReplayRequestError(f"actions: a list of at most {MAX_ACTIONS} environment actions (chess: UCI moves)")
        for n, action in enumerate(actions):
            if len(json.dumps(action, ensure_ascii=False, default=str)) > MAX_ACTION_CHARS:
                raise ReplayRequestError(f"actions[{n}]: at most {MAX_ACTION_CHARS} characters of JSON")
        item = self.items.get(task_key(task))
        if item is None:
            raise UnknownTaskError(
                "task: not one of this run's D_harness tasks; this service answers only those (the lines of "
                "proto/tasks.jsonl, as they are)"
            )
        env = self.domain.make_env(item)
        try:
            env.reset()
            results: list[dict[str, Any]] = []
            for action in actions:
                result = env.step(action).harness_result()
                results.append(result)
                if result["done"]:
                    break
        finally:
            env.close()
        return {"results": results, "unplayed": len(actions) - len(results)}
