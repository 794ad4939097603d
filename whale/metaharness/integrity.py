"""Reward integrity: does a harness score *through the model*, or around it?

A run's one product is the comparison of conditions, so a harness that earns reward without the model
(it read the gold answer, or computed the answer from the task itself) must never pass for a better
agent. Keeping the gold out of reach is the sandbox's job; this module is the second line: from a
candidate's episodes it measures how much the model was used, and flags a candidate whose reward does
not come from the model. Pure: episodes and numbers in, flags out.

Signals, each compared where it makes sense with the phase's **incoming** harness (iteration 1's
re-evaluation under the same weights):

* ``rewarded-without-model`` — any rewarded episode (reward > 0) that made no model call
  (``turns == 0``). Nothing the model did can have earned that reward.
* ``score-up-tokens-down`` — the candidate scores above the incoming harness while the model's
  completion tokens per episode fall below ``min_token_ratio`` x the incoming's. A harness that asks
  the model for something trivial ("say OK") and answers by itself looks like this. Legitimate changes
  (a tighter answer format, one retry fewer, ``MAX_TURNS`` 2 → 1) move tokens by tens of percent, at
  most a halving; a fourfold drop *with* a better score is rare enough to be refused until a person has
  looked (``action: flag`` accepts it, flagged). The default ratio 0.25 is that margin.

Not detectable here: a harness that calls the model normally and then ignores the reply. Those pass
these checks; the test evaluation's per-item records (``whale.workloads.eval``) and the traces show them.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Iterable
from typing import Any

#: the default fraction of the incoming harness's completion tokens per episode below which a better
#: score is suspicious (see the module docstring for why 0.25)
DEFAULT_MIN_TOKEN_RATIO = 0.25
#: a flag reason is one line of at most this many characters (it travels into results and the status)
MAX_REASON_CHARS = 240

REWARDED_WITHOUT_MODEL = "rewarded-without-model"
SCORE_UP_TOKENS_DOWN = "score-up-tokens-down"


class IntegrityAction(str, enum.Enum):
    """What the search does with a flagged candidate."""

    REJECT = "reject"  #: record the flag and never accept the candidate (the default)
    FLAG = "flag"  #: record the flag, accept by score as usual (the result and the status still show it)
    OFF = "off"  #: measure model usage, flag nothing

    @property
    def checks(self) -> bool:
        return self is not IntegrityAction.OFF


@dataclasses.dataclass(frozen=True)
class IntegrityPolicy:
    """``spec.harnessSearch.integrity`` as the search loop uses it."""

    action: IntegrityAction = IntegrityAction.REJECT
    min_token_ratio: float = DEFAULT_MIN_TOKEN_RATIO

    def __post_init__(self) -> None:
        if not 0.0 <= self.min_token_ratio <= 1.0:
            raise ValueError(f"min_token_ratio must be within [0, 1], got {self.min_token_ratio}")

    @property
    def refuses_flagged(self) -> bool:
        return self.action is IntegrityAction.REJECT


@dataclasses.dataclass(frozen=True)
class ModelUsage:
    """How much one set of episodes used the model (a candidate's full evaluation, an eval's item)."""

    episodes: int = 0
    #: episodes with reward > 0
    rewarded: int = 0
    #: episodes that made no model call (turns == 0)
    without_model: int = 0
    #: rewarded episodes that made no model call
    rewarded_without_model: int = 0
    #: completion tokens the model generated, summed over the episodes
    completion_tokens: int = 0
    #: model calls, summed over the episodes
    turns: int = 0

    @property
    def mean_completion_tokens(self) -> float:
        return self.completion_tokens / self.episodes if self.episodes else 0.0

    @property
    def mean_turns(self) -> float:
        return self.turns / self.episodes if self.episodes else 0.0

    @property
    def rewarded_without_model_share(self) -> float:
        """Of the rewarded episodes, the share that never called the model."""
        return self.rewarded_without_model / self.rewarded if self.rewarded else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {
            **dataclasses.asdict(self),
            "mean_completion_tokens": round(self.mean_completion_tokens, 3),
            "mean_turns": round(self.mean_turns, 3),
            "rewarded_without_model_share": round(self.rewarded_without_model_share, 4),
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ModelUsage:
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: int(v) for k, v in data.items() if k in names})

    def __add__(self, other: ModelUsage) -> ModelUsage:
        return ModelUsage(*(getattr(self, f.name) + getattr(other, f.name) for f in dataclasses.fields(self)))


def _field(episode: Any, name: str) -> Any:
    return episode.get(name) if isinstance(episode, dict) else getattr(episode, name, None)


def called_model(episode: Any) -> bool:
    """Whether an episode (an :class:`~whale.harness.trace.Episode` or its dict) made a model call."""
    return int(_field(episode, "turns") or 0) > 0


def model_usage(episodes: Iterable[Any]) -> ModelUsage:
    """Usage of ``episodes`` (Episode objects or their dicts)."""
    n = rewarded = without = rewarded_without = tokens = turns = 0
    for e in episodes:
        won = float(_field(e, "reward") or 0.0) > 0.0
        used = called_model(e)
        n += 1
        rewarded += won
        without += not used
        rewarded_without += won and not used
        tokens += int(_field(e, "completion_tokens") or 0)
        turns += int(_field(e, "turns") or 0)
    return ModelUsage(n, rewarded, without, rewarded_without, tokens, turns)


def integrity_flags(
    usage: ModelUsage,
    score: float,
    *,
    baseline: ModelUsage | None,
    baseline_score: float | None,
    policy: IntegrityPolicy,
) -> tuple[str, ...]:
    """The reasons to flag a candidate (empty: none), each ``[rule] message with the numbers``.

    ``baseline`` / ``baseline_score``: the incoming harness's usage and score in this phase (None for the
    incoming harness itself, or when it was scored before usage was recorded: then only the first rule
    applies)."""
    if not policy.action.checks:
        return ()
    reasons: list[str] = []
    if usage.rewarded_without_model:
        reasons.append(
            f"[{REWARDED_WITHOUT_MODEL}] {usage.rewarded_without_model} of {usage.rewarded} rewarded episodes "
            f"({usage.rewarded_without_model_share:.0%}) never called the model; "
            f"{usage.without_model} of {usage.episodes} episodes made no model call"
        )
    if (
        baseline is not None
        and baseline_score is not None
        and baseline.mean_completion_tokens > 0
        and score > baseline_score
        and usage.mean_completion_tokens < policy.min_token_ratio * baseline.mean_completion_tokens
    ):
        reasons.append(
            f"[{SCORE_UP_TOKENS_DOWN}] score {score:.4f} > incoming {baseline_score:.4f} while completion tokens "
            f"per episode {usage.mean_completion_tokens:.1f} < {policy.min_token_ratio:g} x incoming "
            f"{baseline.mean_completion_tokens:.1f}"
        )
    return tuple(r[:MAX_REASON_CHARS] for r in reasons)
