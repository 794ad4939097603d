"""The adaptive patience rules, as pure functions over the training signals a phase logs.

Both the state machine (``whale.core.alternation.decide``) and the workloads call these: the workload
stops itself exactly at the step the rule fires (so a run is reproducible however slowly the
controller reacts), and ``decide`` evaluates the same function on the logged metrics to know why a
phase ended and to ask a workload that kept going to stop.

Weight phase (training reward, no validation set): ``m_i`` is the mean reward of the last
``window`` steps of this phase up to step ``i`` (fewer at the start). Step ``i`` sets a new best
when ``m_i`` is strictly larger than every earlier ``m_j``. The phase stops after step ``i`` when
``i >= burn_in`` and the last new best is at least ``patience`` steps back.

Harness phase: ``b_i`` is the archive's best training score after iteration ``i`` (iteration 1 is
the incoming harness's re-evaluation). Iteration ``i`` improves when ``b_i > b_{i-1}``. The phase
stops after iteration ``i`` when ``i >= min_iterations`` and the last improvement is at least
``patience`` iterations back, or when ``i >= max_iterations``. Both bounds here count archive
iterations, the incoming one included; the spec's ``maxIterations`` counts proposer iterations as the
paper does (15), and ``whale.core.schedule`` passes ``maxIterations + 1`` (16) as the rule's maximum.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol


class WeightRule(Protocol):
    @property
    def window_steps(self) -> int: ...
    @property
    def burn_in_steps(self) -> int: ...
    @property
    def patience_steps(self) -> int: ...


class HarnessRule(Protocol):
    @property
    def min_iterations(self) -> int: ...
    @property
    def patience(self) -> int: ...
    @property
    def max_iterations(self) -> int: ...


def window_means(rewards: Sequence[float], window: int) -> list[float]:
    """Trailing means, ``window`` wide (shorter at the start)."""
    if window < 1:
        raise ValueError(f"window must be >= 1, got {window}")
    out: list[float] = []
    total = 0.0
    for i, r in enumerate(rewards):
        total += r
        if i >= window:
            total -= rewards[i - window]
        out.append(total / min(i + 1, window))
    return out


def weight_stop_step(rewards: Sequence[float], rule: WeightRule) -> int | None:
    """The first phase-local step (1-based) after which the weight rule fires, or None."""
    means = window_means(rewards, rule.window_steps)
    best = float("-inf")
    last = 0
    for i, m in enumerate(means, start=1):
        if m > best:
            best, last = m, i
        if i >= rule.burn_in_steps and i - last >= rule.patience_steps:
            return i
    return None


def weight_should_stop(rewards: Sequence[float], rule: WeightRule) -> bool:
    """True when the rule has fired at or before the last logged step."""
    return weight_stop_step(rewards, rule) is not None


def harness_stop_iteration(best_scores: Sequence[float], rule: HarnessRule) -> int | None:
    """The first iteration (1-based) after which the harness rule fires, or None."""
    best = float("-inf")
    last = 0
    for i, b in enumerate(best_scores, start=1):
        if b > best:
            best, last = b, i
        if i >= rule.max_iterations:
            return i
        if i >= rule.min_iterations and i - last >= rule.patience:
            return i
    return None


def harness_should_stop(best_scores: Sequence[float], rule: HarnessRule) -> bool:
    return harness_stop_iteration(best_scores, rule) is not None
