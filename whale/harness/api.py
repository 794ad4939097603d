"""The harness interface: what one harness file defines. Standard library only.

A harness is **one Python file** (the unit Meta-Harness searches over). It runs in a sandboxed
process (``whale.harness.process``), never in the runtime: it cannot reach the network, the
environment's state or the tools directly. It only turns JSON into JSON:

* the runtime calls a **hook** with JSON arguments and the episode's ``state`` (a JSON dict the
  harness owns; hooks may mutate it in place, the runtime keeps it between hooks);
* the hook returns a :class:`Decision`: messages to append to the conversation, actions for the
  runtime to execute (environment steps, tool calls), and whether the episode is over.

A harness file looks like::

    from whale.harness.api import BaseHarness, Decision   # always allowed

    class Harness(BaseHarness):                              # the required name
        SYSTEM_PROMPT = "Solve the puzzle."
        USER_TEMPLATE = "Position: {fen}\\nLegal moves: {legal_moves}\\nAnswer <move>uci</move>."
        MAX_TURNS = 9

        def parse_action(self, text, state):
            m = re.search(r"<move>(.*?)</move>", text)
            return {"kind": "env", "action": m.group(1).strip()} if m else None

Besides ``whale.harness.api`` a harness file may import only its domain's allow list
(``Domain.allowed_imports``; chess: collections, itertools, math, random, re, statistics).
``whale.harness.validate`` checks all of this before a harness runs.

The episode loop the runtime drives (``whale.harness.runner``)::

    decision = start(task, state)                     # task = Environment.reset()
    loop:
        append decision.messages
        while decision.actions:                       # tools / environment steps, trusted code
            results = runtime executes decision.actions   # in order; stops at an env result that is done
            if an env result is done: stop            # verifier scores the final state
            if decision.done: stop                    # actions first, then the harness's own stop
            decision = observe(results, state); append decision.messages
        if decision.done: stop
        if turns == MAX_TURNS (capped by the domain's max_turns_limit): stop
        reply = model(messages, tools=TOOLS)          # one turn = one model call
        append reply exactly as generated
        decision = parse(reply, state)

Wire shapes (all plain JSON):

* message: an OpenAI chat message ``{"role": "system"|"user"|"assistant"|"tool", "content": str,
  ["tool_calls": [...], "tool_call_id": str, "name": str]}``.
* reply (what ``parse`` gets): the assistant message as generated, plus ``"finish_reason"``
  ("stop" | "length" | "tool_calls").
* action: ``{"kind": "env", "action": <JSON>}`` → ``Environment.step(action)``, or
  ``{"kind": "tool", "name": str, "arguments": {...}, "id": str | None}`` → ``Environment.call_tool``.
* result (what ``observe`` gets, one per action, same order): ``{"kind": "env", "observation": {...},
  "done": bool}`` or ``{"kind": "tool", "name": str, "id": str | None, "content": str, "error": str | None}``.
  The environment's ``info`` (where verifiers keep gold answers) goes to the trace only, never here.

Per-episode data belongs in ``state``: one harness process serves many concurrent episodes, so
instance attributes are shared between them (treat ``self`` as read-only).
"""

from __future__ import annotations

import json
from typing import Any

#: what a harness file may import from here (``whale.harness.validate`` refuses any other name)
__all__ = [
    "API_MODULE",
    "CONSTANTS",
    "HELPERS",
    "HOOKS",
    "PROMPT_CONSTANTS",
    "REQUIRED_CLASS",
    "BaseHarness",
    "Decision",
    "env_action",
    "fill",
    "tool_action",
]

#: the module a harness file may always import, whatever its domain's allow list
API_MODULE = "whale.harness.api"
#: the class a harness file must define
REQUIRED_CLASS = "Harness"
#: hooks the runtime calls, with their parameters after ``self`` (the validator checks overrides)
HOOKS: dict[str, tuple[str, ...]] = {
    "start": ("task", "state"),
    "parse": ("reply", "state"),
    "observe": ("results", "state"),
}
#: helper methods the default hooks call; an override must keep these parameters
HELPERS: dict[str, tuple[str, ...]] = {
    "build_messages": ("task", "state"),
    "parse_action": ("text", "state"),
    "format_observation": ("observation", "state"),
    "format_tool_result": ("result", "state"),
    "on_invalid": ("reply", "state"),
}
#: constants with their required types (checked when the harness is loaded)
CONSTANTS: dict[str, tuple[type, ...]] = {
    "SYSTEM_PROMPT": (str,),
    "USER_TEMPLATE": (str,),
    "MAX_TURNS": (int,),
    "MAX_FORMAT_RETRIES": (int,),
    "FORMAT_RETRY_MESSAGE": (str,),
    "TOOLS": (list, type(None)),
}
#: the constants the promptOnly search mode (FST baseline) may change; everything else must equal h0
PROMPT_CONSTANTS = ("SYSTEM_PROMPT", "USER_TEMPLATE")


def Decision(  # noqa: N802 - reads as a type in harness code
    messages: list[dict[str, Any]] | None = None,
    actions: list[dict[str, Any]] | None = None,
    done: bool = False,
) -> dict[str, Any]:
    """What every hook returns. A plain dict so it crosses the process boundary as JSON.

    Args:
        messages: chat messages to append, in order (e.g. the first prompt, an observation, a retry).
        actions: environment steps / tool calls for the runtime to run now (see the module docstring).
        done: end the episode now (the verifier scores the environment as it stands).
    """
    return {"messages": list(messages or []), "actions": list(actions or []), "done": bool(done)}


def env_action(action: Any) -> dict[str, Any]:
    """An environment step, e.g. ``env_action("e2e4")`` or ``env_action({"answer": "Paris"})``."""
    return {"kind": "env", "action": action}


def tool_action(name: str, arguments: dict[str, Any], call_id: str | None = None) -> dict[str, Any]:
    """A tool call the runtime executes with the domain's trusted tool code."""
    return {"kind": "tool", "name": name, "arguments": dict(arguments), "id": call_id}


class _Fields(dict):
    """``str.format_map`` mapping that leaves unknown ``{fields}`` visible instead of raising."""

    def __missing__(self, key: str) -> str:
        return "{" + key + "}"


def fill(template: str, fields: dict[str, Any]) -> str:
    """``template.format_map(fields)``, tolerant of fields the task does not have."""
    return template.format_map(_Fields(fields))


class BaseHarness:
    """Default hooks: a plain chat loop. Override constants first, helpers next, hooks last.

    The defaults give: system prompt + ``USER_TEMPLATE`` filled from the task as the first
    messages; each reply parsed by :meth:`parse_action` (``None`` = malformed → up to
    ``MAX_FORMAT_RETRIES`` retries with ``FORMAT_RETRY_MESSAGE``, then the episode ends); the model's
    native tool calls (``reply["tool_calls"]``) become tool actions; environment observations are
    shown with :meth:`format_observation` (``USER_TEMPLATE`` again), tool results as ``tool``
    messages.
    """

    #: system message; "" = no system message
    SYSTEM_PROMPT: str = ""
    #: first user message, ``str.format`` fields from the task dict (``Environment.reset()``)
    USER_TEMPLATE: str = "{prompt}"
    #: at most this many model calls per episode (the domain's ``max_turns_limit`` caps it)
    MAX_TURNS: int = 2
    #: retries after a reply :meth:`parse_action` cannot read
    MAX_FORMAT_RETRIES: int = 1
    #: the user message sent for such a retry
    FORMAT_RETRY_MESSAGE: str = "Your answer could not be read. Reply again in the required format."
    #: OpenAI function schemas sent to the model as ``tools`` (native tool calling); None = none.
    #: A harness may list only tools its domain offers (``Domain.tool_specs()``), with any description.
    TOOLS: list[dict[str, Any]] | None = None

    # ----- hooks (called by the runtime) -----------------------------------------------------------

    def start(self, task: dict[str, Any], state: dict[str, Any]) -> dict[str, Any]:
        """First decision of an episode: usually the first messages; may also run tools (a forced search)."""
        return Decision(messages=self.build_messages(task, state))

    def parse(self, reply: dict[str, Any], state: dict[str, Any]) -> dict[str, Any]:
        """A model reply → actions. Native tool calls win; else :meth:`parse_action` on the text."""
        calls = reply.get("tool_calls") or []
        if calls:
            return Decision(actions=[_tool_call_action(call) for call in calls])
        action = self.parse_action(reply.get("content") or "", state)
        if action is None:
            return self.on_invalid(reply, state)
        return Decision(actions=[action])

    def observe(self, results: list[dict[str, Any]], state: dict[str, Any]) -> dict[str, Any]:
        """Results of the last actions → messages for the next turn."""
        messages: list[dict[str, Any]] = []
        for result in results:
            if result.get("kind") == "tool":
                messages.append(self.format_tool_result(result, state))
            else:
                messages.append(
                    {"role": "user", "content": self.format_observation(result.get("observation") or {}, state)}
                )
        return Decision(messages=messages)

    # ----- helpers the default hooks use -----------------------------------------------------------

    def build_messages(self, task: dict[str, Any], state: dict[str, Any]) -> list[dict[str, Any]]:
        messages = [{"role": "system", "content": self.SYSTEM_PROMPT}] if self.SYSTEM_PROMPT else []
        messages.append({"role": "user", "content": fill(self.USER_TEMPLATE, task)})
        return messages

    def parse_action(self, text: str, state: dict[str, Any]) -> dict[str, Any] | None:
        """The reply text → one action, or None when it cannot be read. Default: the whole text is
        the environment action (a final answer)."""
        return env_action(text)

    def format_observation(self, observation: dict[str, Any], state: dict[str, Any]) -> str:
        return fill(self.USER_TEMPLATE, observation)

    def format_tool_result(self, result: dict[str, Any], state: dict[str, Any]) -> dict[str, Any]:
        content = result.get("content") or ""
        if result.get("error"):
            content = f"Error: {result['error']}"
        message = {"role": "tool", "content": content, "name": result.get("name")}
        if result.get("id"):
            message["tool_call_id"] = result["id"]
        return message

    def on_invalid(self, reply: dict[str, Any], state: dict[str, Any]) -> dict[str, Any]:
        """A reply :meth:`parse_action` could not read: retry while the budget lasts, then give up."""
        used = int(state.get("format_retries", 0))
        if used >= self.MAX_FORMAT_RETRIES:
            return Decision(done=True)
        state["format_retries"] = used + 1
        return Decision(messages=[{"role": "user", "content": self.FORMAT_RETRY_MESSAGE}])


def _tool_call_action(call: dict[str, Any]) -> dict[str, Any]:
    """An OpenAI ``tool_calls`` entry → a tool action. Arguments arrive as a JSON string."""
    function = call.get("function") or {}
    raw = function.get("arguments") or "{}"
    try:
        arguments = json.loads(raw) if isinstance(raw, str) else dict(raw)
    except (ValueError, TypeError):
        arguments = {"_raw": raw}
    if not isinstance(arguments, dict):
        arguments = {"_raw": arguments}
    return tool_action(str(function.get("name", "")), arguments, call.get("id"))
