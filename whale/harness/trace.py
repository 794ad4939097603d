"""The episode record: one JSON line per episode, read by the proposer (Meta-Harness archive), RSFT
(trains on the assistant messages) and the eval workload (rewards).

Field names are snake_case (internal data files, not Kubernetes wire objects). Layout of a line::

    {"episode_id", "item_id", "subset", "sample", "domain", "harness", "model",
     "messages": [...],        # the whole conversation, in order; assistant messages exactly as generated
     "steps": [...],           # everything that happened, in order (below)
     "reward", "turns", "end": "env_done"|"harness_done"|"max_turns"|"token_budget"|"error"|"limit", "error",
     "prompt_tokens", "completion_tokens", "seconds", "inference_seconds", "harness_seconds",
     "env_seconds", "started_at", "answer_not_model", "answer_injected", "integrity"}

``steps`` entries (``"type"`` says which):

* ``{"type": "model", "turn", "message_index", "finish_reason", "prompt_tokens", "completion_tokens",
  "max_tokens", "latency_s", ["token_ids"]}`` — one model call (``max_tokens``: what it was allowed,
  after the episode's token budget); ``messages[message_index]`` is its reply;
* ``{"type": "action", "action": {...}, "result": {...}, "seconds", ["info"], ["graded"]}`` — one parsed
  action (env step or tool call) with the result the harness saw; tool calls are the actions with
  ``kind == "tool"``; ``graded``: the spellings of the answer the step submitted for grading;
* ``{"type": "decision", "hook", "messages_added", "done"}`` — a harness hook's answer.

RSFT masking: train on ``messages[i]`` with ``role == "assistant"`` only; every other message is
context. A turn's ``prompt_tokens`` is what the server counted for that call.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import IO, Any


class EndReason:
    """Why an episode ended (plain strings on the wire)."""

    ENV_DONE = "env_done"
    HARNESS_DONE = "harness_done"
    MAX_TURNS = "max_turns"
    #: the episode's token budget (``rsft.sampling.episodeTokenBudget`` / ``episodeWindowTokens``, or
    #: the model's context) left nothing for the next model call
    TOKEN_BUDGET = "token_budget"
    ERROR = "error"
    #: a bound of the episode (actions, message bytes, wall time; ``RunnerConfig``) was reached: reward 0
    LIMIT = "limit"


@dataclasses.dataclass
class Episode:
    """One episode: inputs, the full conversation, what happened, the reward, and costs."""

    #: ``<item_id>#<sample>`` unless the caller names it
    episode_id: str
    item_id: str
    #: which of the k samples of this item
    sample: int = 0
    subset: str | None = None
    domain: str | None = None
    #: where the harness came from (path or store key), for the archive
    harness: str | None = None
    model: str | None = None
    messages: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    steps: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    reward: float = 0.0
    #: model calls made
    turns: int = 0
    end: str = EndReason.MAX_TURNS
    #: a one-line reason when ``end == "error"`` (harness crash, inference failure, env bug)
    error: str | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    seconds: float = 0.0
    inference_seconds: float = 0.0
    harness_seconds: float = 0.0
    env_seconds: float = 0.0
    #: wall-clock start, ISO 8601 UTC
    started_at: str | None = None
    #: an answer submitted for grading is in no model reply (the reward was set to 0; whale.harness.provenance)
    answer_not_model: bool = False
    #: the harness's own messages held the gold answer before the model wrote it
    answer_injected: bool = False
    #: one line saying what the provenance check found (None: nothing)
    integrity: str | None = None

    # ----- derived views ----------------------------------------------------------------------------

    @property
    def actions(self) -> list[dict[str, Any]]:
        """Parsed actions, in order."""
        return [s["action"] for s in self.steps if s.get("type") == "action"]

    @property
    def tool_calls(self) -> list[dict[str, Any]]:
        """Tool-call steps (action + result)."""
        return [s for s in self.steps if s.get("type") == "action" and s["action"].get("kind") == "tool"]

    @property
    def assistant_indices(self) -> list[int]:
        """Indices into ``messages`` of the model's replies (the tokens RSFT trains on)."""
        return [i for i, m in enumerate(self.messages) if m.get("role") == "assistant"]

    # ----- (de)serialisation ------------------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        """A shallow dict (the fields themselves are JSON values already; ``asdict`` would deep-copy them)."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Episode:
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names})

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), ensure_ascii=False, sort_keys=True)


def write_jsonl(episodes: Iterable[Episode], out: IO[str] | Path) -> int:
    """Write episodes as JSON lines to a path (appending) or an open text stream; returns the count."""
    if isinstance(out, Path):
        out.parent.mkdir(parents=True, exist_ok=True)
        with out.open("a", encoding="utf-8") as fh:
            return write_jsonl(episodes, fh)
    count = 0
    for episode in episodes:
        out.write(episode.to_json() + "\n")
        count += 1
    out.flush()
    return count


def read_jsonl(path: Path) -> Iterator[Episode]:
    with Path(path).open(encoding="utf-8") as fh:
        for line in fh:
            if line.strip():
                yield Episode.from_dict(json.loads(line))
