"""Rejection sampling: which rollouts of a step are kept for SFT, and the step's reward statistics.

Pure functions over :class:`Trajectory` records, so the rule "keep reward > scoreThreshold; none kept
means no SFT this step" is tested without a model. Pure: no I/O, no torch.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Trajectory:
    """One finished rollout, as RSFT trains on it.

    ``messages`` are the exact chat messages of the episode (the harness runtime's trace), in the
    form the model's chat template takes (``role``, ``content``, optional ``tool_calls``...): the
    assistant messages are what the model generated; everything else is context and gets no loss.
    """

    #: index of the prompt in D_weight
    prompt_index: int
    #: the chat messages, system/user/assistant/tool, in order
    messages: tuple[dict[str, Any], ...]
    #: verifier reward of the episode
    reward: float
    #: tool schemas the template rendered during generation (None: no tools)
    tools: tuple[dict[str, Any], ...] | None = None
    #: extra keyword arguments the chat template got during generation (e.g. enable_thinking)
    template_kwargs: dict[str, Any] = field(default_factory=dict)
    #: which rollout of the prompt (0-based)
    rollout: int = 0


@dataclass(frozen=True)
class StepSelection:
    kept: list[Trajectory]
    reward_mean: float
    acceptance_rate: float
    rollouts: int


def select(trajectories: Sequence[Trajectory], threshold: float) -> StepSelection:
    """Keep the trajectories whose reward is strictly above ``threshold``."""
    n = len(trajectories)
    kept = [t for t in trajectories if t.reward > threshold]
    mean = sum(t.reward for t in trajectories) / n if n else 0.0
    return StepSelection(kept=kept, reward_mean=mean, acceptance_rate=(len(kept) / n if n else 0.0), rollouts=n)
