"""Rollouts for RSFT through the harness runtime: episodes under the current harness -> trajectories.

One :class:`HarnessSampler` lives for the whole phase: it owns an event loop, a pool of sandboxed harness
processes and the inference client (in-process sharing the trainer's model, or HTTP to vLLM), and
runs each step's ``prompts x rollouts`` episodes concurrently with ``whale.harness.runner``.

Two things keep a step's burst of rollouts fed as fast as the server can answer them, as in eval:

* a :class:`~whale.harness.process.HarnessPool` (``default_processes()``: up to 4), not one process: every
  episode's hooks (``start``, ``parse``, ...) go through a harness process, and one process answers the
  step's thousands of hook calls one after another;
* an item's rollouts share their first model call when their first prompts are equal: one ``n=rollouts``
  request (``RunnerConfig.share_first_turn``), so the server prefills the prompt once and the client sends
  ``prompts`` requests, not ``prompts x rollouts``. The ``rollouts`` completions are independent samples
  of the same prompt either way; a harness whose first prompt varies makes its own requests.

The
episodes' messages are the exact conversations (assistant messages as generated); the tools and
chat-template variables generation used are carried along so SFT renders the same template.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from whale.domain import Domain
from whale.harness.launch import SandboxLimits
from whale.harness.process import HarnessPool
from whale.harness.runner import EpisodeBounds, EpisodeRunner, RunnerConfig
from whale.harness.trace import EndReason, Episode
from whale.inference.base import InferenceClient, SamplingParams
from whale.rsft.rejection import Trajectory

log = logging.getLogger(__name__)


class SamplingError(RuntimeError):
    """Every rollout of a step failed (harness or inference broken); training on nothing would hide it."""


def template_messages(messages: Sequence[dict[str, Any]]) -> tuple[dict[str, Any], ...]:
    """Messages as the chat template saw them during generation (tool-call arguments as dicts)."""
    from whale.inference.transformers_backend import _template_messages  # the backend's own conversion

    return tuple(_template_messages([dict(m) for m in messages]))


def episode_to_trajectory(
    episode: Episode, prompt_index: int, tools: list[dict[str, Any]] | None, template_kwargs: dict[str, Any]
) -> Trajectory:
    return Trajectory(
        prompt_index=prompt_index,
        messages=template_messages(episode.messages),
        reward=float(episode.reward),
        tools=tuple(tools) if tools else None,
        template_kwargs=dict(template_kwargs),
        rollout=episode.sample,
    )


class HarnessSampler:
    """See the module doc. Use as a context manager (starts/stops the harness processes).
    ``processes``: harness processes in the pool (None: ``whale.harness.process.default_processes()``)."""

    def __init__(
        self,
        domain: Domain,
        harness_path: Path,
        client: InferenceClient,
        sampling: SamplingParams,
        *,
        max_concurrency: int = 64,
        harness_label: str | None = None,
        template_kwargs: dict[str, Any] | None = None,
        limits: SandboxLimits | None = None,
        processes: int | None = None,
        bounds: EpisodeBounds | None = None,
        enforce_provenance: bool = True,
    ):
        self.domain = domain
        self.harness_path = Path(harness_path)
        self.client = client
        self.sampling = sampling
        self.config = RunnerConfig(
            max_concurrency=max_concurrency,
            harness_label=harness_label or str(harness_path),
            share_first_turn=True,
            bounds=bounds or EpisodeBounds(),
            enforce_provenance=enforce_provenance,
        )
        # the chat-template variables generation used (the client's, then every request's), so SFT
        # renders the trajectory the way generation saw it (enable_thinking)
        self.template_kwargs = dict(
            template_kwargs
            if template_kwargs is not None
            else {**(getattr(client, "chat_template_kwargs", None) or {}), **sampling.template_kwargs}
        )
        #: the harness process's limits and isolation level (spec.execution.sandbox.isolation)
        self.limits = limits or SandboxLimits()
        #: called as each rollout finishes (progress: ``whale.workloads.common.ProgressWriter.advance``)
        self.on_episode: Callable[[Episode], None] | None = None
        self._loop = asyncio.new_event_loop()
        self.processes = processes
        self._pool: HarnessPool | None = None
        self._tools: list[dict[str, Any]] | None = None

    def __enter__(self) -> HarnessSampler:
        self._pool = HarnessPool(self.harness_path, self.domain.allowed_imports, self.limits, self.processes)
        try:
            info = self._loop.run_until_complete(self._pool.start())
        except BaseException:
            self._loop.run_until_complete(self._pool.aclose())  # the workers that did start
            raise
        self._tools = info.tools or None
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            if self._pool is not None:
                self._loop.run_until_complete(self._pool.__aexit__(None, None, None))
            self._loop.run_until_complete(self.client.aclose())
        finally:
            self._loop.close()

    def sample(
        self, items: Sequence[dict[str, Any]], prompt_indices: Sequence[int], rollouts: int, seed: int
    ) -> list[Trajectory]:
        if self._pool is None:
            raise RuntimeError("HarnessSampler must be entered (with ...) before sampling")
        # every model call seeded from (the step's seed, item id, rollout, turn): a step samples the same
        # rollouts whatever the concurrency, so one run seed gives one run
        config = dataclasses.replace(self.config, seed=seed)
        runner = EpisodeRunner(self.domain, self._pool, self.client, self.sampling, config)
        episodes = self._loop.run_until_complete(runner.run(list(items), k=rollouts, on_episode=self.on_episode))
        errors = [e for e in episodes if e.end == EndReason.ERROR]
        if episodes and len(errors) == len(episodes):
            raise SamplingError(f"all {len(episodes)} rollouts of the step failed; first error: {errors[0].error}")
        if errors:
            log.warning(
                "%d of %d rollouts ended in an error (reward 0); first: %s", len(errors), len(episodes), errors[0].error
            )
        # runner.run returns episodes in (item, sample) order
        return [
            episode_to_trajectory(ep, prompt_indices[i // rollouts], self._tools, self.template_kwargs)
            for i, ep in enumerate(episodes)
        ]
