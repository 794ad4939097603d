"""The built-in agents' sandboxed tools beside the file tools: ``run_candidate``, ``try_harness``, ``run_shell``.

The paper's proposer is a coding agent with a shell that runs and tests candidate harnesses before
proposing them. Both tools give the built-in agents (``openai``, ``anthropic``) that power without
giving them anything the threat model forbids (the proposer and every harness it writes are untrusted):

* ``run_candidate`` (:class:`CandidateTrials`) puts a candidate through the **same static gate** as the
  search loop (``whale.metaharness.validate.candidate_problems``), then runs it on at most
  ``MAX_TRIAL_ITEMS`` items through the **same evaluator** the scoring uses
  (:meth:`whale.metaharness.evaluate.CandidateEvaluator.trial`: the HarnessPool sandbox, the episode
  runner, the phase's model, the smoke test's short hook limit) and returns its score, errors and
  compact traces, at most ``TRIAL_RESULT_CHARS`` characters. It is built from the evaluator's item
  list — the D_harness split and nothing else: an item id outside it is refused, so a test item can
  never be requested or returned. Every rollout it runs is counted (``CandidateTrials.rollouts``)
  against a per-iteration budget (``spec.experiment.harnessSearch.proposer.runCandidateRollouts``); the search
  loop adds them to the iteration's rollouts and the archive's iteration record.
* ``try_harness`` (:class:`HarnessTryouts`) is the prototyping the reference's skills require (the harness's
  search on a few real questions, its hooks on trajectories), which the ``cli`` agent does with the kit in its
  workspace: a harness (past the same static gate) on at most ``MAX_TRYOUT_ITEMS`` D_harness tasks with model
  replies the agent scripts, in the same sandbox and runner, tool calls answered by the run's real tools, every
  submission ending the episode ungraded (:mod:`whale.metaharness.tryout`): no reward, no gold, no rollout (chess:
  each move answered as the model reads it turn by turn).
  ``TRYOUT_CALLS`` calls per iteration, ``TRYOUT_TIMEOUT_S`` each, ``TRYOUT_RESULT_CHARS`` of answer.
* ``run_shell`` (:class:`SandboxShell`) runs one bash command per call in a fresh ``whale.sandbox``
  run: its working directory is the archive copy, mounted read-only (``Isolation.read_paths``), with
  the candidates the agent wrote (read-only too) and a bounded in-memory scratch as HOME; the system
  runtime (``/usr``: bash, coreutils, grep, python3 with its standard library) comes with the
  sandbox. No network, no data root, no checkout, no credentials; ``SHELL_TIMEOUT_S`` per call (at
  most ``SHELL_MAX_TIMEOUT_S``), ``SHELL_OUTPUT_BYTES`` of output. Where the sandbox cannot isolate,
  the call fails with the sandbox's message (fail closed). On a cluster (a harness host configured) the
  command runs on the run's harness host over a snapshot of the archive and candidates
  (:mod:`whale.harness.shell`), so the search pod, which holds the store credentials, starts no sandbox.

Every failure comes back to the agent as ``error: ...`` text, never as an exception.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import hashlib
import json
import logging
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from whale.harness import shell
from whale.harness.shell import (
    SHELL_MAX_TIMEOUT_S,
    SHELL_OUTPUT_BYTES,
    SHELL_TIMEOUT_S,
)
from whale.metaharness.proposer.base import CANDIDATES_DIR
from whale.metaharness.proposer.workspace import TOOL_SPECS, ToolError, Workspace, safe_name

if TYPE_CHECKING:
    from whale.harness.launch import HarnessHost
    from whale.metaharness.evaluate import CandidateEvaluator

log = logging.getLogger(__name__)

#: items one run_candidate call may run on (one rollout each)
MAX_TRIAL_ITEMS = 16
#: the longest run_candidate answer
TRIAL_RESULT_CHARS = 16_000
#: of each episode's conversation: the last this many messages, each cut to this many characters
TRIAL_MESSAGES = 6
TRIAL_MESSAGE_CHARS = 600
RUN_CANDIDATE_SPEC: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "run_candidate",
        "description": (
            f"Run a harness candidate on up to {MAX_TRIAL_ITEMS} training (D_harness) items with the real model, "
            "one rollout each, and get its score, errors and short traces back. Give `name` (a candidate you "
            "wrote with write_candidate) or `code` (a draft). It goes through the same checks as a proposal "
            "first. Each rollout is spent from this iteration's budget."
        ),
        "parameters": {
            "type": "object",
            "properties": {
                "name": {"type": "string", "description": "a candidate written with write_candidate"},
                "code": {"type": "string", "description": "or: a whole harness file to try"},
                "k": {"type": "integer", "description": f"items to run on, 1..{MAX_TRIAL_ITEMS} (default 4)"},
                "items": {
                    "type": "array",
                    "items": {"type": "string"},
                    "description": "optional: these D_harness item ids (e.g. failing ones from the traces)",
                },
            },
            "required": [],
        },
    },
}

#: tasks one try_harness call runs (the reference's search skill: the harness's search on 3-5 real questions)
MAX_TRYOUT_ITEMS = 5
#: scripted model replies one try_harness call may give, and the characters of each
MAX_TRYOUT_REPLIES = 8
MAX_TRYOUT_REPLY_CHARS = 8_000
#: try_harness calls one proposer call (one iteration) may make, and the wall limit of one
TRYOUT_CALLS = 24
TRYOUT_TIMEOUT_S = 120.0
#: the longest try_harness answer, and of each message in it at first (tool results show whole passages)
TRYOUT_RESULT_CHARS = 24_000
TRYOUT_MESSAGE_CHARS = 4_000
TRY_HARNESS_SPEC: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "try_harness",
        "description": (
            f"Prototype a harness on up to {MAX_TRYOUT_ITEMS} real training (D_harness) tasks WITHOUT the model: "
            "you script the model's replies, in order (plain text as the model would generate it; a tool call as "
            '<tool_call>{"name": "search", "arguments": {"query_list": ["..."]}}</tool_call>). The harness runs in '
            "its real sandbox; its tool calls go to the run's real tools (e.g. the retriever); you get each "
            "episode's conversation (the prompts it built, your replies as it parsed them, the real tool results) "
            "and its actions. When the harness submits an answer the episode ends, ungraded: no score, no gold "
            "answers (chess: each move is answered as the model reads it in an episode, its verdict and the "
            f"opponent's reply). At most {TRYOUT_CALLS} calls per iteration; no rollouts spent. Give `name` (a candidate you "
            "wrote) or `code` (a whole harness file, e.g. the incoming one)."
        ),
        "parameters": {
            "type": "object",
            "properties": {
                "name": {"type": "string", "description": "a candidate written with write_candidate"},
                "code": {"type": "string", "description": "or: a whole harness file"},
                "replies": {
                    "type": "array",
                    "items": {"type": "string"},
                    "description": f"the model's replies, one per model turn (at most {MAX_TRYOUT_REPLIES})",
                },
                "k": {"type": "integer", "description": f"tasks to run, 1..{MAX_TRYOUT_ITEMS} (default 4)"},
                "items": {
                    "type": "array",
                    "items": {"type": "string"},
                    "description": "optional: these D_harness item ids",
                },
            },
            "required": ["replies"],
        },
    },
}

RUN_SHELL_SPEC: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "run_shell",
        "description": (
            "Run one bash command in a fresh sandbox. The working directory is the archive (read-only); your "
            f"candidates are readable at $CANDIDATES; HOME is a small writable scratch. bash, ls, grep, head, wc, "
            f"python3 (standard library) are there; no network. {SHELL_TIMEOUT_S:g} s by default, at most "
            f"{SHELL_MAX_TIMEOUT_S:g} s (`timeout_s`); output cut at {SHELL_OUTPUT_BYTES} bytes."
        ),
        "parameters": {
            "type": "object",
            "properties": {"command": {"type": "string"}, "timeout_s": {"type": "number"}},
            "required": ["command"],
        },
    },
}


# ----- run_candidate --------------------------------------------------------------------------------


def pick_items(
    items: dict[str, dict[str, Any]], max_items: int, k: Any, item_ids: Any, tool: str
) -> list[dict[str, Any]]:
    """The items of one call of ``tool``: the ids asked for, each a key of ``items`` (the D_harness split, so a
    test item can never be asked for), or the first ``k``; :class:`ToolError` naming the bound otherwise."""
    if item_ids:
        if isinstance(item_ids, str) or not isinstance(item_ids, list) or not all(isinstance(i, str) for i in item_ids):
            raise ToolError("`items` must be a list of item id strings")
        wanted = list(dict.fromkeys(item_ids))
        if len(wanted) > max_items:
            raise ToolError(f"{len(wanted)} items asked for; at most {max_items} per call")
        unknown = [i for i in wanted if i not in items]
        if unknown:
            some = ", ".join(list(items)[:5])
            raise ToolError(
                f"not training (D_harness) items: {', '.join(repr(u[:80]) for u in unknown[:5])}; "
                f"{tool} runs only on the harness split (ids like {some})"
            )
        return [items[i] for i in wanted]
    k = 4 if k is None else k
    if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= max_items:
        raise ToolError(f"k must be an integer from 1 to {max_items}, got {k!r}")
    return list(items.values())[:k]


def split_by_id(items: Sequence[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The D_harness items by id, in split order (the first of a repeated id)."""
    out: dict[str, dict[str, Any]] = {}
    for item in items:
        out.setdefault(str(item.get("id", "?")), item)
    return out


class _DHarnessRunner:
    """What ``run_candidate`` and ``try_harness`` share: the phase's evaluator and static gate, the D_harness items
    (the only ones a call may touch), a wall limit per call, and the harness file written where the evaluator
    reads it."""

    #: the tool's name in errors
    tool = ""

    def __init__(
        self,
        evaluator: CandidateEvaluator,
        *,
        check: Callable[[str], list[str]],
        max_items: int,
        call_timeout_s: float,
        workdir: Path | None,
    ):
        self.evaluator = evaluator
        self.check = check
        self.max_items = max_items
        self.call_timeout_s = call_timeout_s
        self.workdir = Path(workdir) if workdir is not None else None
        #: the D_harness items by id, in split order: the only items a call may run on
        self._items = split_by_id(evaluator.items)
        #: one entry per call that ran: what, where, how it went (kept in the iteration record)
        self.log: list[dict[str, Any]] = []

    def _pick(self, k: Any, item_ids: Any) -> list[dict[str, Any]]:
        return pick_items(self._items, self.max_items, k, item_ids, self.tool)

    def _limit(self, timeout_s: float | None, what: str) -> float:
        """This call's wall limit: the tool's, further bounded by the proposer's time left."""
        limit = self.call_timeout_s if timeout_s is None else min(self.call_timeout_s, timeout_s)
        if limit <= 0:
            raise ToolError(f"the proposer's time budget is spent; this {what} was not run")
        return limit

    @contextlib.contextmanager
    def _staged(self, code: str, prefix: str) -> Iterator[tuple[Path, str]]:
        """``code`` as a harness file in a fresh temporary folder, with its short hash."""
        with tempfile.TemporaryDirectory(prefix=prefix, dir=self.workdir) as tmp:
            path = Path(tmp) / "harness.py"
            path.write_text(code, encoding="utf-8")
            yield path, hashlib.sha256(code.strip().encode("utf-8")).hexdigest()[:12]


class CandidateTrials(_DHarnessRunner):
    """``run_candidate``: a candidate on a few D_harness items, through the scoring's own path.

    Args:
        evaluator: the phase's evaluator; its ``items`` (the D_harness split) are the only items a
            trial can touch.
        check: the static gate (``code -> problems``; empty = valid), the search loop's own.
        budget: rollouts all trials of one iteration may spend.
        max_items: items one call may ask for.
        call_timeout_s: wall limit of one call (further bounded by the proposer's time left).
    """

    def __init__(
        self,
        evaluator: CandidateEvaluator,
        *,
        check: Callable[[str], list[str]],
        budget: int,
        max_items: int = MAX_TRIAL_ITEMS,
        call_timeout_s: float = 600.0,
        workdir: Path | None = None,
    ):
        if budget < 0 or max_items < 1:
            raise ValueError(f"CandidateTrials needs budget >= 0 and max_items >= 1, got {budget}, {max_items}")
        super().__init__(evaluator, check=check, max_items=max_items, call_timeout_s=call_timeout_s, workdir=workdir)
        self.budget = budget
        #: rollouts spent so far (the search loop adds them to the iteration's rollouts)
        self.rollouts = 0

    @property
    def item_ids(self) -> list[str]:
        return list(self._items)

    @property
    def left(self) -> int:
        return max(self.budget - self.rollouts, 0)

    tool = "run_candidate"

    def pick(self, k: int | None, item_ids: Sequence[str] | None) -> list[dict[str, Any]]:
        """The items of one call: the ids asked for (each must be a D_harness item) or the first ``k``."""
        return self._pick(k, item_ids)

    async def run(
        self,
        code: str,
        *,
        name: str,
        k: int | None = None,
        item_ids: Sequence[str] | None = None,
        timeout_s: float | None = None,
    ) -> str:
        """One call; the answer (JSON text, bounded) for the agent. Raises ToolError for a bad call."""
        items = self.pick(k, item_ids)
        problems = self.check(code)
        if problems:
            return _fit(
                {
                    "candidate": name,
                    "valid": False,
                    "problems": problems[:20],
                    "rollouts_spent": 0,
                    "rollouts_left": self.left,
                    "note": "not run: a proposal with these problems is refused without running",
                }
            )
        if len(items) > self.left:
            raise ToolError(
                f"{len(items)} rollouts asked for but only {self.left} of this iteration's "
                f"{self.budget} are left; ask for fewer items, or propose"
            )
        limit = self._limit(timeout_s, "candidate")
        with self._staged(code, "whale-trial-") as (path, sha):
            outcome = await self.evaluator.trial(path, f"trial:{name}:{sha}", items, limit)
        spent = outcome.rollouts
        self.rollouts += spent
        errors = [e for e in outcome.episodes if e.error]
        self.log.append(
            {
                "candidate": name,
                "sha": sha,
                "items": [str(i.get("id")) for i in items],
                "rollouts": spent,
                "score": round(outcome.score, 6),
                "errors": len(errors),
                "error": outcome.error,
            }
        )
        episodes = sorted(outcome.episodes, key=lambda e: e.reward)  # failures first: they show what to fix
        return _fit(
            {
                "candidate": name,
                "valid": True,
                "items": len(items),
                "score": round(outcome.score, 6),
                "mean_turns": round(outcome.mean_turns, 3),
                "episode_errors": len(errors),
                "error": outcome.error,
                "rollouts_spent": spent,
                "rollouts_left": self.left,
                "episodes": [_compact(e.to_dict()) for e in episodes],
            }
        )


def _clip(text: Any, limit: int) -> str:
    text = text if isinstance(text, str) else json.dumps(text, ensure_ascii=False)
    if len(text) <= limit:
        return text
    half = max(limit // 2 - 10, 1)
    return f"{text[:half]} [... {len(text) - 2 * half} chars ...] {text[-half:]}"


def _compact(
    episode: dict[str, Any], messages: int = TRIAL_MESSAGES, chars: int = TRIAL_MESSAGE_CHARS
) -> dict[str, Any]:
    """What the agent needs of one episode: outcome, error, and the end of the conversation."""
    out = {k: episode.get(k) for k in ("item_id", "reward", "turns", "end", "error")}
    if messages > 0:
        tail = (episode.get("messages") or [])[-messages:]
        out["messages"] = [
            {"role": m.get("role"), "content": _clip(m.get("content") or "", chars)}
            for m in tail
            if isinstance(m, dict)
        ]
    return out


def _fit(result: dict[str, Any], limit: int = TRIAL_RESULT_CHARS) -> str:
    """``result`` as JSON within ``limit`` characters: shorter messages, then fewer, then fewer episodes."""
    text = json.dumps(result, ensure_ascii=False)
    if len(text) <= limit or "episodes" not in result:
        return text if len(text) <= limit else text[:limit]
    for messages, chars in ((TRIAL_MESSAGES, 200), (2, 200), (0, 0)):
        episodes = [
            _compact(e, messages, chars)
            if messages
            else {k: e.get(k) for k in ("item_id", "reward", "turns", "end", "error")}
            for e in result["episodes"]
        ]
        for e in episodes:
            if e.get("error"):
                e["error"] = _clip(e["error"], 300)
        text = json.dumps({**result, "episodes": episodes}, ensure_ascii=False)
        if len(text) <= limit:
            return text
    kept = list(episodes)
    while kept and len(text) > limit:
        kept.pop()
        text = json.dumps({**result, "episodes": kept, "episodes_cut": len(episodes) - len(kept)}, ensure_ascii=False)
    return text[:limit]


# ----- try_harness ------------------------------------------------------------------------------------


class HarnessTryouts(_DHarnessRunner):
    """``try_harness``: a harness on a few D_harness tasks with scripted model replies, real tools, no grade
    (:meth:`whale.metaharness.evaluate.CandidateEvaluator.tryout`, :mod:`whale.metaharness.tryout`).

    Args:
        evaluator: the phase's evaluator; its ``items`` (the D_harness split) are the only tasks a try-out runs.
        check: the static gate (``code -> problems``), the search loop's own: a harness that would be refused
            as a proposal is not run.
        calls: try-outs one iteration may run.
        call_timeout_s: wall limit of one call (further bounded by the proposer's time left).
    """

    def __init__(
        self,
        evaluator: CandidateEvaluator,
        *,
        check: Callable[[str], list[str]],
        calls: int = TRYOUT_CALLS,
        max_items: int = MAX_TRYOUT_ITEMS,
        call_timeout_s: float = TRYOUT_TIMEOUT_S,
        workdir: Path | None = None,
    ):
        if calls < 0 or max_items < 1:
            raise ValueError(f"HarnessTryouts needs calls >= 0 and max_items >= 1, got {calls}, {max_items}")
        super().__init__(evaluator, check=check, max_items=max_items, call_timeout_s=call_timeout_s, workdir=workdir)
        self.calls = calls

    tool = "try_harness"

    @property
    def left(self) -> int:
        return max(self.calls - len(self.log), 0)

    async def run(
        self,
        code: str,
        *,
        name: str,
        replies: Any,
        k: Any = None,
        item_ids: Any = None,
        timeout_s: float | None = None,
    ) -> str:
        """One call; the answer (JSON text, bounded) for the agent. Raises ToolError for a bad call."""
        if (
            not isinstance(replies, list)
            or not replies
            or not all(isinstance(r, str) for r in replies)
            or len(replies) > MAX_TRYOUT_REPLIES
        ):
            raise ToolError(f"`replies` must be a list of 1 to {MAX_TRYOUT_REPLIES} strings (the model's replies)")
        if any(len(r) > MAX_TRYOUT_REPLY_CHARS for r in replies):
            raise ToolError(f"a reply may have at most {MAX_TRYOUT_REPLY_CHARS} characters")
        items = self._pick(k, item_ids)
        if self.left == 0:
            raise ToolError(f"all {self.calls} try_harness calls of this iteration are spent; propose")
        problems = self.check(code)
        if problems:
            return json.dumps(
                {"harness": name, "valid": False, "problems": problems[:20], "note": "not run: refused as a proposal"}
            )
        limit = self._limit(timeout_s, "harness")
        with self._staged(code, "whale-tryout-") as (path, sha):
            outcome = await self.evaluator.tryout(path, f"tryout:{name}:{sha}", items, replies, limit)
        self.log.append(
            {
                "harness": name,
                "sha": sha,
                "items": [str(i.get("id")) for i in items],
                "replies": len(replies),
                "errors": sum(1 for e in outcome.episodes if e.error),
                "error": outcome.error,
            }
        )
        episodes = [_ungraded(e.to_dict()) for e in outcome.episodes]
        return _fit_tryout(
            {"harness": name, "valid": True, "error": outcome.error, "calls_left": self.left, "episodes": episodes}
        )


def _ungraded(episode: dict[str, Any]) -> dict[str, Any]:
    """What a try-out shows of one episode: the conversation and the actions with their results, never a
    reward, an env step's info or what was graded (the environment never graded anything; see tryout.py)."""
    actions = [
        {"action": s.get("action"), "result": s.get("result")}
        for s in episode.get("steps") or []
        if s.get("type") == "action"
    ]
    return {
        "item_id": episode.get("item_id"),
        "turns": episode.get("turns"),
        "end": episode.get("end"),
        "error": episode.get("error"),
        "messages": [
            {k: m[k] for k in ("role", "content", "tool_calls", "tool_call_id", "name") if k in m}
            for m in episode.get("messages") or []
            if isinstance(m, dict)
        ],
        "actions": actions,
    }


def _fit_tryout(result: dict[str, Any], limit: int = TRYOUT_RESULT_CHARS) -> str:
    """``result`` as JSON within ``limit`` characters: each message and tool result clipped shorter until it fits."""
    text = json.dumps(result, ensure_ascii=False)
    for chars in (TRYOUT_MESSAGE_CHARS, 1_500, 400, 120):
        if len(text) <= limit:
            return text
        episodes = [
            {
                **e,
                "messages": [{**m, "content": _clip(m.get("content") or "", chars)} for m in e["messages"]],
                "actions": [_clip_json(a, chars) for a in e["actions"]],
            }
            for e in result["episodes"]
        ]
        text = json.dumps({**result, "episodes": episodes}, ensure_ascii=False)
    return text if len(text) <= limit else text[:limit]


def _clip_json(value: Any, chars: int) -> Any:
    """``value`` with every string in it clipped to ``chars``."""
    if isinstance(value, str):
        return _clip(value, chars)
    if isinstance(value, dict):
        return {k: _clip_json(v, chars) for k, v in value.items()}
    if isinstance(value, list):
        return [_clip_json(v, chars) for v in value]
    return value


# ----- run_shell --------------------------------------------------------------------------------------


class SandboxShell:
    """``run_shell``: one bash command per call in a fresh sandbox over the read-only archive copy
    (:mod:`whale.harness.shell` holds the command's limits and walls).

    Args:
        archive_dir: the archive copy (the working directory, read-only).
        candidates_dir: the agent's candidates (read-only, at ``$CANDIDATES``); mounted when it exists.
        isolation: ``spec.execution.sandbox.isolation`` (``namespaces``: the wall, fail closed; ``none``: trusted
            local use only, like the harness processes; ``pod`` without a harness host: the namespaces).
        host: the run's harness host (``SandboxLimits.host``, from ``$WHALE_HARNESS_HOST``): each command
            runs there over a snapshot of the archive and candidates (:func:`whale.harness.remote.run_shell`),
            so the harness-search pod starts no sandbox itself; None: here.
    """

    def __init__(
        self,
        archive_dir: Path,
        candidates_dir: Path | None = None,
        *,
        isolation: str = "namespaces",
        host: HarnessHost | None = None,
    ):
        self.archive_dir = Path(archive_dir).resolve()
        self.candidates_dir = Path(candidates_dir).resolve() if candidates_dir is not None else None
        self.isolation = isolation
        self.host = host
        self.calls = 0

    def _checked(self, command: Any, timeout_s: float) -> tuple[str, float]:
        try:
            command = shell.check_command(command)
        except ValueError as exc:
            raise ToolError(str(exc)) from None
        self.calls += 1
        return command, shell.wall_clock(timeout_s)

    def run_sync(self, command: str, timeout_s: float = SHELL_TIMEOUT_S) -> str:
        if self.host is not None:
            return asyncio.run(self.run(command, timeout_s))
        from whale.sandbox import SandboxSetupError

        command, wall = self._checked(command, timeout_s)
        level = "none" if self.isolation == "none" else "namespaces"
        try:
            return shell.run_command(command, self.archive_dir, self.candidates_dir, wall, level=level)
        except SandboxSetupError as exc:
            raise ToolError(f"the sandboxed shell cannot start here: {exc}") from None

    async def run(self, command: str, timeout_s: float = SHELL_TIMEOUT_S) -> str:
        if self.host is None:
            # the sandbox's own wall clock bounds the thread (at most SHELL_MAX_TIMEOUT_S plus its teardown)
            return await asyncio.to_thread(self.run_sync, command, timeout_s)
        from whale.harness import remote

        command, wall = self._checked(command, timeout_s)
        try:
            snapshot = await asyncio.to_thread(shell.pack, self.archive_dir, self.candidates_dir)
        except shell.SnapshotError as exc:
            raise ToolError(str(exc)) from None
        try:
            return await remote.run_shell(self.host, command, wall, snapshot)
        except remote.HarnessHostError as exc:
            raise ToolError(f"the sandboxed shell did not run: {exc}") from None


# ----- the toolbox ------------------------------------------------------------------------------------


@dataclasses.dataclass
class ProposerTools:
    """The sandboxed tools one proposer call may use (built per iteration by the search loop)."""

    trials: CandidateTrials | None = None
    shell: SandboxShell | None = None
    tryouts: HarnessTryouts | None = None


class Toolbox:
    """Every tool of a built-in agent: the file tools (:class:`Workspace`) and the sandboxed ones."""

    def __init__(self, workspace: Workspace, tools: ProposerTools | None, deadline: float | None = None):
        self.workspace = workspace
        self.tools = tools or ProposerTools()
        self.deadline = deadline

    @property
    def finished(self) -> bool:
        return self.workspace.finished

    @property
    def specs(self) -> list[dict[str, Any]]:
        """OpenAI-format tool declarations (the Anthropic backend converts them)."""
        specs = list(TOOL_SPECS)
        if self.tools.trials is not None and self.tools.trials.budget > 0:
            specs.insert(-1, RUN_CANDIDATE_SPEC)
        if self.tools.shell is not None:
            specs.insert(-1, RUN_SHELL_SPEC)
        if self.tools.tryouts is not None and self.tools.tryouts.calls > 0:
            specs.insert(-1, TRY_HARNESS_SPEC)
        return specs

    def _left_s(self) -> float | None:
        return None if self.deadline is None else self.deadline - time.monotonic()

    async def call(self, name: str, arguments: dict[str, Any]) -> str:
        """Run one tool call; every failure comes back as ``error: ...`` text."""
        left = self._left_s()
        if left is not None and left <= 0:
            return "error: the proposer's time budget is spent; this tool call was not run"
        try:
            if name == "run_candidate" and self.tools.trials is not None and self.tools.trials.budget > 0:
                return await self._run_candidate(arguments, left)
            if name == "try_harness" and self.tools.tryouts is not None and self.tools.tryouts.calls > 0:
                label, code = self._code_of(arguments)
                return await self.tools.tryouts.run(
                    code,
                    name=label,
                    replies=arguments.get("replies"),
                    k=arguments.get("k"),
                    item_ids=arguments.get("items"),
                    timeout_s=left,
                )
            if name == "run_shell" and self.tools.shell is not None:
                timeout = arguments.get("timeout_s", SHELL_TIMEOUT_S)
                if isinstance(timeout, bool) or not isinstance(timeout, (int, float)):
                    raise ToolError("timeout_s must be a number of seconds")
                if left is not None:
                    timeout = min(float(timeout), left)
                return await self.tools.shell.run(arguments.get("command"), float(timeout))  # type: ignore[arg-type]  # shell.run refuses a non-string command
        except ToolError as exc:
            return f"error: {exc}"
        if name in ("run_candidate", "run_shell", "try_harness"):
            return f"error: {name} is not available in this run"
        return self.workspace.call(name, arguments)

    async def _run_candidate(self, arguments: dict[str, Any], left_s: float | None) -> str:
        trials = self.tools.trials
        assert trials is not None  # noqa: S101 - checked by the caller
        label, code = self._code_of(arguments)
        k = arguments.get("k")
        items = arguments.get("items")
        return await trials.run(code, name=label, k=k, item_ids=items, timeout_s=left_s)

    def _code_of(self, arguments: dict[str, Any]) -> tuple[str, str]:
        """(label, code) of a call naming a candidate the agent wrote (``name``) or giving a draft (``code``)."""
        name, code = arguments.get("name"), arguments.get("code")
        if (name is None) == (code is None):
            raise ToolError("give exactly one of `name` (a candidate you wrote) or `code` (a draft)")
        if code is not None:
            if not isinstance(code, str):
                raise ToolError("`code` must be the whole harness file as a string")
            return "draft", code
        label = safe_name(str(name))
        path = self.workspace.scratch_dir / CANDIDATES_DIR / f"{label}.py"
        if not label or not path.is_file() or path.is_symlink():
            raise ToolError(
                f"no candidate named {str(name)[:80]!r}; written so far: {', '.join(self.workspace.written) or '(none)'}"
            )
        return label, path.read_bytes()[: 4 * 1024 * 1024].decode("utf-8", errors="replace")
