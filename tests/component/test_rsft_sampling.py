"""The RSFT sampler feeds a step's burst of rollouts the way eval does: a pool of harness processes, and
an item's rollouts share their first model call (one ``n=rollouts`` request) when their prompts are equal."""

from __future__ import annotations

import pytest

from tests.fixtures.guess_domain import GuessNumberDomainDouble
from whale.harness.process import HarnessError
from whale.inference.base import SamplingParams
from whale.inference.scripted import ScriptedClient
from whale.rsft.sampling import HarnessSampler


def guess(n: int) -> str:
    return f"<guess>{n}</guess>"


def test_an_items_rollouts_share_one_first_request_and_each_takes_its_own_sample() -> None:
    domain = GuessNumberDomainDouble([{"id": "g0", "secret": 7}])
    # the first request (n=3) answers 7, 1, 2: rollout 0 is right at once, 1 and 2 are told "higher" and
    # then guess 7 with one request each
    client = ScriptedClient([guess(7), guess(1), guess(2), guess(7), guess(7)])
    with HarnessSampler(domain, domain.h0_path(), client, SamplingParams(max_tokens=8), processes=2) as sampler:
        assert len(sampler._pool.workers) == 2  # the pool, not one process
        trajectories = sampler.sample(domain.items, [0], rollouts=3, seed=0)

    first_prompts = [p for p in client.prompts if len(p) == 2]  # system + the first user turn
    assert len(first_prompts) == 1, client.prompts  # one request for the three first turns (was three)
    assert len(client.prompts) == 3  # + one second turn for each of rollouts 1 and 2
    by_rollout = {t.rollout: t for t in trajectories}
    assert sorted(by_rollout) == [0, 1, 2]
    first_replies = {
        r: next(m["content"] for m in t.messages if m["role"] == "assistant") for r, t in by_rollout.items()
    }
    # each rollout took the completion of its own sample index: independent samples, none repeated
    assert first_replies == {0: guess(7), 1: guess(1), 2: guess(2)}
    assert [by_rollout[r].reward for r in range(3)] == [1.0, 1.0, 1.0]
    assert sum(m["role"] == "assistant" for m in by_rollout[0].messages) == 1
    assert sum(m["role"] == "assistant" for m in by_rollout[1].messages) == 2


def test_a_harness_that_fails_to_start_leaves_no_process(tmp_path) -> None:
    broken = tmp_path / "broken.py"
    broken.write_text("raise RuntimeError('no harness here')\n")
    domain = GuessNumberDomainDouble()
    sampler = HarnessSampler(domain, broken, ScriptedClient([]), SamplingParams(max_tokens=8), processes=2)
    with pytest.raises(HarnessError, match="no harness here"), sampler:
        pass
    assert sampler._pool is not None
    assert all(w._proc is None or w._proc.returncode is not None for w in sampler._pool.workers)
