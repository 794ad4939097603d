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

* ``answer-not-from-model`` — an episode submitted an answer no model reply of it holds (the runtime's
  answer-provenance rule, :mod:`whale.harness.provenance`, already scored it 0): the harness wrote the
  answer itself (a known key, the task, the archive's gold).
* ``answer-injection`` — more than ``MAX_INJECTED_SHARE`` of the rewarded episodes had the gold answer in
  the harness's own messages before the model wrote it (the harness told the model the answer). A share,
  not one episode: a prompt constant that holds a number matches the few items whose answer it is.
* ``split-dependent`` (evaluations) — the harness behaves differently on the evaluated split than on
  D_harness, where it was searched and checked: its share of episodes without a model call is
  ``MAX_WITHOUT_MODEL_SHIFT`` above D_harness's, or its completion tokens (or model calls) per episode
  fall below ``min_token_ratio`` x D_harness's.

Every evaluation is checked with the same rules as the candidates (``whale.workloads.eval``); a flagged
evaluation is shown in the run's status and is never the run's best.
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
ANSWER_NOT_FROM_MODEL = "answer-not-from-model"
ANSWER_INJECTION = "answer-injection"
SPLIT_DEPENDENT = "split-dependent"
#: share of rewarded episodes with the gold in the harness's own messages above which a harness is flagged
MAX_INJECTED_SHARE = 0.1
#: the evaluated split's share of episodes without a model call may exceed D_harness's by at most this
MAX_WITHOUT_MODEL_SHIFT = 0.25


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
    """``spec.experiment.harnessSearch.integrity`` as the search loop uses it."""

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
    #: episodes that submitted an answer no model reply held (scored 0 by the provenance rule)
    answer_not_model: int = 0
    #: rewarded episodes whose harness messages held the gold answer before the model wrote it
    rewarded_injected: int = 0

    @property
    def mean_completion_tokens(self) -> float:
        return self.completion_tokens / self.episodes if self.episodes else 0.0

    @property
    def mean_turns(self) -> float:
        return self.turns / self.episodes if self.episodes else 0.0

    @property
    def without_model_share(self) -> float:
        """Of the episodes, the share that never called the model."""
        return self.without_model / self.episodes if self.episodes else 0.0

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
    n = rewarded = without = rewarded_without = tokens = turns = not_model = injected = 0
    for e in episodes:
        won = float(_field(e, "reward") or 0.0) > 0.0
        used = called_model(e)
        n += 1
        rewarded += won
        without += not used
        rewarded_without += won and not used
        tokens += int(_field(e, "completion_tokens") or 0)
        turns += int(_field(e, "turns") or 0)
        not_model += bool(_field(e, "answer_not_model"))
        injected += won and bool(_field(e, "answer_injected"))
    return ModelUsage(n, rewarded, without, rewarded_without, tokens, turns, not_model, injected)


def integrity_flags(
    usage: ModelUsage,
    score: float,
    *,
    baseline: ModelUsage | None,
    baseline_score: float | None,
    policy: IntegrityPolicy,
    reference: ModelUsage | None = None,
) -> tuple[str, ...]:
    """The reasons to flag a candidate or an evaluation (empty: none), each ``[rule] message with the numbers``.

    ``baseline`` / ``baseline_score``: the incoming harness's usage and score in this phase (None for the
    incoming harness itself, for an evaluation, or when it was scored before usage was recorded: then the
    score rule does not apply). ``reference``: the same harness's usage on D_harness, for an evaluation of
    another split (None: no split rule)."""
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
    if usage.answer_not_model:
        reasons.append(
            f"[{ANSWER_NOT_FROM_MODEL}] {usage.answer_not_model} of {usage.episodes} episodes submitted an answer "
            "that no model reply of the episode holds (each scored 0)"
        )
    if usage.rewarded_injected > MAX_INJECTED_SHARE * usage.rewarded:
        reasons.append(
            f"[{ANSWER_INJECTION}] {usage.rewarded_injected} of {usage.rewarded} rewarded episodes had the gold answer "
            f"in the harness's own messages before the model wrote it (at most {MAX_INJECTED_SHARE:.0%} may)"
        )
    if reference is not None and reference.episodes and usage.episodes:
        shift = usage.without_model_share - reference.without_model_share
        tokens_low = usage.mean_completion_tokens < policy.min_token_ratio * reference.mean_completion_tokens
        turns_low = usage.mean_turns < policy.min_token_ratio * reference.mean_turns
        if shift > MAX_WITHOUT_MODEL_SHIFT or tokens_low or turns_low:
            reasons.append(
                f"[{SPLIT_DEPENDENT}] here {usage.without_model_share:.0%} of episodes made no model call "
                f"({reference.without_model_share:.0%} on D_harness), {usage.mean_turns:.2f} model calls and "
                f"{usage.mean_completion_tokens:.1f} completion tokens per episode ({reference.mean_turns:.2f} and "
                f"{reference.mean_completion_tokens:.1f} on D_harness)"
            )
    return tuple(r[:MAX_REASON_CHARS] for r in reasons)
