"""Nothing a harness does keeps an episode, or an evaluation, going without bound.

The attack (issue 27): a candidate that loops tool actions — ``observe`` answers every tool result with
another tool call and a 1 MiB message — never lets an episode end: the evaluation stayed at 0 of 60 items
and the trusted runtime grew from 20 MB to 705 MB. Each test runs a real sandboxed harness process through
the real runner; the domain is the guess-the-number test double (its ``hint`` tool answers at once, so
the loop is as fast as the runtime).
"""

from __future__ import annotations

import asyncio
import tracemalloc
from pathlib import Path
from typing import Any

import pytest

from tests.fixtures.guess_domain import GuessNumberDomainDouble
from tests.security.test_evaluation_integrity import RUN
from whale.core import layout
from whale.core.protocol import EvalPhaseArgs, phase_request
from whale.harness.runner import (
    DEFAULT_MAX_ACTIONS,
    DEFAULT_MAX_EPISODE_BYTES,
    DEFAULT_MAX_MESSAGE_BYTES,
    EpisodeBounds,
    RunnerConfig,
    run_episodes,
)
from whale.harness.trace import EndReason, Episode
from whale.inference.base import ChatResult, InferenceClient, SamplingParams
from whale.inference.scripted import ScriptedClient
from whale.store import open_store
from whale.workloads.eval import run_eval

LOOP = '''"""Never stop: every tool result is answered with another tool call and a big message."""
from whale.harness.api import BaseHarness, Decision, tool_action

SIZE = {size}


class Harness(BaseHarness):
    MAX_TURNS = 1

    def start(self, task, state):
        return self.observe([], state)

    def observe(self, results, state):
        return Decision(messages=[{{"role": "user", "content": "x" * SIZE}}], actions=[tool_action("hint", {{}})])
'''


class HangingPolicyDouble(InferenceClient):
    """A model double whose calls never return (a stuck server)."""

    model = "hanging-double"

    async def chat(
        self, messages: list[dict[str, Any]], sampling: SamplingParams, n: int = 1, tools: Any = None
    ) -> ChatResult:
        await asyncio.Event().wait()
        raise AssertionError("unreachable")


ASK = '''"""One model call."""
from whale.harness.api import BaseHarness


class Harness(BaseHarness):
    MAX_TURNS = 1
'''


def harness(tmp_path: Path, code: str) -> Path:
    path = tmp_path / "harness.py"
    path.write_text(code)
    return path


async def episodes(tmp_path: Path, code: str, n: int = 4, **config: Any) -> list[Episode]:
    domain = GuessNumberDomainDouble([{"id": f"g{i}", "secret": 7} for i in range(n)])
    return await run_episodes(
        domain,
        harness(tmp_path, code),
        ScriptedClient([]),
        domain.items,
        SamplingParams(),
        config=RunnerConfig(max_concurrency=16, **config),
        processes=1,
    )


@pytest.mark.timeout(120)
async def test_a_tool_loop_of_1_mib_messages_ends_at_the_message_bound_with_memory_bounded(tmp_path: Path) -> None:
    tracemalloc.start()
    try:
        eps = await episodes(tmp_path, LOOP.format(size=1 << 20), n=32)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert {e.end for e in eps} == {EndReason.LIMIT}
    assert all(
        e.error is not None and f"one may have at most {DEFAULT_MAX_MESSAGE_BYTES}" in e.error and e.reward == 0.0
        for e in eps
    )
    assert all(not e.messages and not e.actions for e in eps)  # refused before any of it was kept
    # 32 episodes x a 1 MiB message each in flight at most: far below what an unbounded loop reaches
    assert peak < 160 << 20, f"the runner's traced memory peaked at {peak / 2**20:.0f} MiB"


@pytest.mark.timeout(120)
async def test_a_tool_loop_of_small_messages_ends_at_the_action_bound(tmp_path: Path) -> None:
    (ep,) = await episodes(tmp_path, LOOP.format(size=10), n=1)
    assert ep.end == EndReason.LIMIT and ep.reward == 0.0
    assert len(ep.actions) == DEFAULT_MAX_ACTIONS
    assert ep.error == f"hook observe asked for action {DEFAULT_MAX_ACTIONS + 1}; an episode may take at most 256"


@pytest.mark.timeout(120)
async def test_messages_under_the_message_bound_end_at_the_episode_bound(tmp_path: Path) -> None:
    (ep,) = await episodes(tmp_path, LOOP.format(size=200 << 10), n=1)
    assert ep.end == EndReason.LIMIT
    assert ep.error is not None and f"an episode may hold at most {DEFAULT_MAX_EPISODE_BYTES}" in ep.error
    assert sum(len(m["content"]) for m in ep.messages) <= DEFAULT_MAX_EPISODE_BYTES


@pytest.mark.timeout(60)
async def test_an_episode_ends_at_its_wall_time(tmp_path: Path) -> None:
    domain = GuessNumberDomainDouble([{"id": "g0", "secret": 7}])
    (ep,) = await run_episodes(
        domain,
        harness(tmp_path, ASK),
        HangingPolicyDouble(),
        domain.items,
        SamplingParams(),
        config=RunnerConfig(bounds=EpisodeBounds(timeout_s=1.0)),
        processes=1,
    )
    assert ep.end == EndReason.LIMIT and ep.error == "the episode ran past its wall-time bound of 1 s"


@pytest.mark.timeout(120)
def test_an_evaluation_ends_at_its_wall_time(tmp_path: Path) -> None:
    """A stuck model on every item: the evaluation still ends, each episode failed with the reason."""
    store = open_store(str(tmp_path / "store"))
    store.write_text(layout.harness_key(RUN, "ask"), ASK)
    spec = {
        "domain": "guess-double",
        "condition": "mh_only",
        "model": {"name": "unused-policy-is-a-double"},
        "evaluation": {"samplesPerItem": 2, "timeoutSeconds": 1},
        "inference": {"maxConcurrency": 4},
    }
    phase = layout.eval_phase_key(1, 0, "harness")
    request = phase_request(
        spec,
        run=RUN,
        phase=phase,
        attempt=1,
        args=EvalPhaseArgs(cycle=1, step=0, after="harness", checkpoint=None, harness=layout.harness_key(RUN, "ask")),
    )
    store.write_json(layout.spec_key(RUN), spec)
    store.write_json(layout.request_key(RUN, phase), request.to_wire())
    result = run_eval(store, RUN, phase, domain=GuessNumberDomainDouble(), client=HangingPolicyDouble())
    assert result.items == 4 and result.mean_at_k == 0.0
    items = store.read_jsonl(layout.eval_items_key(RUN, phase))
    assert [len(r["limits"]) for r in items] == [2, 2, 2, 2]
    assert all(reason == "the evaluation's wall-time bound had passed" for r in items for reason in r["limits"])
    assert any("8 episodes reached a bound" in n for n in result.notes)
