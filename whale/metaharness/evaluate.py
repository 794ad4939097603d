"""Running a candidate through the harness runtime: the smoke test and the full score.

The smoke test runs one episode on each of the first ``smoke_items`` D_harness items under a short
hook timeout and a wall limit. A candidate fails it when it does not load, when any smoke episode
ends in an error (a hook raised, looped past its timeout, answered nonsense), or when the smoke
run exceeds its wall limit. Only candidates that pass are scored in full: ``rollouts_per_item``
episodes on every D_harness item, bounded by ``candidate_timeout_s``. Score = mean reward (the
success rate for 0/1 verifiers); ties are broken by mean turns. The proposer's ``run_candidate`` tool
runs its drafts through :meth:`CandidateEvaluator.trial` (a few D_harness items, the smoke limits), its
``try_harness`` through :meth:`CandidateEvaluator.tryout` (scripted replies, real tools, nothing graded).
"""

from __future__ import annotations

import asyncio
import dataclasses
import statistics
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from whale.domain import Domain
from whale.harness.launch import SandboxLimits
from whale.harness.process import HarnessError
from whale.harness.runner import EpisodeBounds, RunnerConfig, run_episodes
from whale.harness.trace import EndReason, Episode
from whale.inference.base import InferenceClient, SamplingParams


@dataclasses.dataclass(frozen=True)
class EvalSettings:
    """How candidates are run (from spec.experiment.harnessSearch + the runtime's defaults)."""

    rollouts_per_item: int = 1
    smoke_items: int = 4
    #: wall limit of the full evaluation of one candidate
    candidate_timeout_s: float = 3600.0
    #: wall limit of the smoke test
    smoke_timeout_s: float = 120.0
    #: one hook call may take this long in the smoke test (an infinite loop fails fast)
    smoke_hook_timeout_s: float = 5.0
    sampling: SamplingParams = SamplingParams()
    limits: SandboxLimits = SandboxLimits()
    max_concurrency: int = 64
    #: what one episode may take (spec.execution.sandbox.episode)
    bounds: EpisodeBounds = EpisodeBounds()
    #: an answer that is not model text scores 0 (False only under integrity action off)
    enforce_provenance: bool = True
    #: seed every model call from (seed, item id, sample, turn) (spec.experiment.harnessSearch.seed): every candidate
    #: meets the same draws, and one run seed gives one search; None: unseeded
    seed: int | None = None


@dataclasses.dataclass
class RunOutcome:
    """Episodes of one smoke or full run, or why it did not finish."""

    episodes: list[Episode]
    error: str | None = None

    @property
    def rollouts(self) -> int:
        return len(self.episodes)

    @property
    def score(self) -> float:
        return statistics.fmean(e.reward for e in self.episodes) if self.episodes else 0.0

    @property
    def mean_turns(self) -> float:
        return statistics.fmean(e.turns for e in self.episodes) if self.episodes else 0.0

    def per_item(self) -> dict[str, Any]:
        items: dict[str, dict[str, list[float]]] = {}
        for e in self.episodes:
            row = items.setdefault(e.item_id, {"rewards": [], "turns": []})
            row["rewards"].append(e.reward)
            row["turns"].append(e.turns)
        return {
            "score": self.score,
            "mean_turns": self.mean_turns,
            "rollouts": self.rollouts,
            "errors": sum(1 for e in self.episodes if e.end == EndReason.ERROR),
            "items": items,
        }


class CandidateEvaluator:
    """Runs harness files of one domain against one fixed model on the D_harness items."""

    def __init__(
        self,
        domain: Domain,
        client: InferenceClient,
        items: Sequence[dict[str, Any]],
        settings: EvalSettings | None = None,
    ):
        if not items:
            raise ValueError("the harness split is empty: nothing to score candidates on")
        self.domain = domain
        self.client = client
        self.items = list(items)
        self.settings = settings or EvalSettings()

    async def smoke(self, harness_path: Path, label: str) -> RunOutcome:
        s = self.settings
        limits = dataclasses.replace(s.limits, hook_timeout_s=min(s.limits.hook_timeout_s, s.smoke_hook_timeout_s))
        outcome = await self._run(harness_path, label, self.items[: s.smoke_items], 1, limits, s.smoke_timeout_s)
        if outcome.error is None:
            errors = [e for e in outcome.episodes if e.end == EndReason.ERROR]
            if errors:
                outcome.error = f"smoke episode {errors[0].episode_id} failed: {errors[0].error}"
        return outcome

    async def trial(
        self, harness_path: Path, label: str, items: Sequence[dict[str, Any]], timeout_s: float
    ) -> RunOutcome:
        """The proposer's ``run_candidate``: one episode on each of ``items`` (a few D_harness items, picked
        by :class:`~whale.metaharness.proposer.tools.CandidateTrials` from :attr:`items`), under the smoke
        test's short hook limit and ``timeout_s``; the same sandboxed pool and episode runner as scoring."""
        s = self.settings
        limits = dataclasses.replace(s.limits, hook_timeout_s=min(s.limits.hook_timeout_s, s.smoke_hook_timeout_s))
        return await self._run(harness_path, label, list(items), 1, limits, timeout_s)

    async def tryout(
        self,
        harness_path: Path,
        label: str,
        items: Sequence[dict[str, Any]],
        replies: Sequence[str],
        timeout_s: float,
    ) -> RunOutcome:
        """The proposer's ``try_harness`` (:mod:`whale.metaharness.tryout`): one episode on each of ``items``, in
        turn, each model turn answered by the next of ``replies`` (a fresh script per item), tools real, nothing
        graded; the smoke test's short hook limit, ``timeout_s`` for all. Spends no rollout: no model runs."""
        from whale.inference.scripted import ScriptedClient
        from whale.metaharness.tryout import tools_only

        s = self.settings
        limits = dataclasses.replace(s.limits, hook_timeout_s=min(s.limits.hook_timeout_s, s.smoke_hook_timeout_s))
        domain = tools_only(self.domain)
        end = time.monotonic() + timeout_s
        episodes: list[Episode] = []
        for item in items:
            left = end - time.monotonic()
            if left <= 0:
                return RunOutcome(episodes, f"timed out after {timeout_s:g} s ({len(episodes)} of {len(items)} done)")
            client = ScriptedClient(list(replies))
            outcome = await self._run(
                harness_path, label, [item], 1, limits, left, client=client, domain=domain, processes=1
            )
            episodes.extend(outcome.episodes)
            if outcome.error is not None:
                return RunOutcome(episodes, outcome.error)
        return RunOutcome(episodes)

    async def score(self, harness_path: Path, label: str) -> RunOutcome:
        s = self.settings
        return await self._run(harness_path, label, self.items, s.rollouts_per_item, s.limits, s.candidate_timeout_s)

    async def _run(
        self,
        path: Path,
        label: str,
        items: list[dict[str, Any]],
        k: int,
        limits: SandboxLimits,
        timeout_s: float,
        *,
        client: InferenceClient | None = None,
        domain: Domain | None = None,
        processes: int | None = None,
    ) -> RunOutcome:
        """``client`` / ``domain``: instead of the phase's (a try-out's script and ungraded environments);
        ``processes``: harness processes (default: the pool's)."""
        done: list[Episode] = []
        config = RunnerConfig(
            max_concurrency=self.settings.max_concurrency,
            harness_label=label,
            bounds=self.settings.bounds,
            enforce_provenance=self.settings.enforce_provenance and domain is None,
            seed=self.settings.seed,
        )
        try:
            episodes = await asyncio.wait_for(
                run_episodes(
                    domain or self.domain,
                    path,
                    client or self.client,
                    items,
                    self.settings.sampling,
                    k=k,
                    config=config,
                    limits=limits,
                    on_episode=done.append,
                    processes=processes,
                ),
                timeout=timeout_s,
            )
        except TimeoutError:
            return RunOutcome(done, f"timed out after {timeout_s:g} s ({len(done)} of {len(items) * k} episodes done)")
        except HarnessError as exc:
            return RunOutcome(done, _one_line(exc))
        return RunOutcome(list(episodes))


def _one_line(exc: BaseException) -> str:
    return (str(exc).replace("\n", " ").strip() or type(exc).__name__)[:1000]
