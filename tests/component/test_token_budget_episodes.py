"""The episode token budget in the real episode runtime (sandboxed harness process, guess-the-number
test double domain): a model that never stops is stopped by the budget, the sum of its completion
tokens never exceeds it, the requests' max_tokens shrink as it is spent, the window counts the
environment's tokens too, and the model's context is never overrun (counted in process, bounded over
HTTP against the project's server and a tiny real model)."""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any

import pytest

from tests.fixtures.guess_domain import GuessNumberDomainDouble
from whale.harness.process import HarnessProcess
from whale.harness.runner import EpisodeRunner, RunnerConfig
from whale.harness.trace import EndReason
from whale.inference.base import ChatResult, Completion, InferenceClient, SamplingParams

DOMAIN = GuessNumberDomainDouble()  # at most 20 model calls per episode
SECRET_7 = DOMAIN.items[0]
ALLOWED = frozenset({"re"})


def endless_harness(tmp_path: Path) -> Path:
    """Every reply is a (wrong) guess; the environment's feedback is the next user message."""
    path = tmp_path / "endless.py"
    path.write_text(
        textwrap.dedent("""
        from whale.harness.api import BaseHarness, env_action

        class Harness(BaseHarness):
            USER_TEMPLATE = "Guess again. {feedback}"
            MAX_TURNS = 500
            def parse_action(self, text, state):
                return env_action("1")
    """)
    )
    return path


class NeverStopsDouble(InferenceClient):
    """Test double of a greedy model that never emits a stop token: every completion is exactly
    ``max_tokens`` tokens (finish "length"). Records each request's max_tokens. ``count``: also
    count prompts (one token per word of every message), as an in-process backend can."""

    model = "never-stops"

    def __init__(self, count: bool = False, max_model_len: int | None = None):
        self.asked: list[int] = []
        self.prompts: list[int] = []
        self.count = count
        self.max_model_len = max_model_len

    def _prompt_tokens(self, messages: list[dict[str, Any]]) -> int:
        return sum(len(str(m.get("content") or "").split()) + 1 for m in messages)

    async def count_prompt_tokens(self, messages, tools, sampling) -> int | None:
        return self._prompt_tokens(messages) if self.count else None

    async def chat(self, messages, sampling: SamplingParams, n: int = 1, tools=None) -> ChatResult:
        self.asked.append(sampling.max_tokens)
        prompt = self._prompt_tokens(messages)
        self.prompts.append(prompt)
        if self.max_model_len is not None:
            assert prompt + sampling.max_tokens <= self.max_model_len, "the request overruns the context"
        text = " ".join(["la"] * sampling.max_tokens)
        completions = [
            Completion({"role": "assistant", "content": text}, "length", sampling.max_tokens) for _ in range(n)
        ]
        return ChatResult(completions, prompt, sampling.max_tokens * n)


async def run_one(path: Path, client: InferenceClient, sampling: SamplingParams):
    async with HarnessProcess(path, ALLOWED) as harness:
        return await EpisodeRunner(DOMAIN, harness, client, sampling).run_episode(SECRET_7)


async def test_a_model_that_never_stops_is_stopped_by_the_budget(tmp_path: Path) -> None:
    client = NeverStopsDouble()
    episode = await run_one(endless_harness(tmp_path), client, SamplingParams(max_tokens=8, episode_tokens=20))
    assert client.asked == [8, 8, 4]  # the requests' max_tokens shrink as the budget is spent
    assert (episode.end, episode.turns, episode.completion_tokens, episode.error) == ("token_budget", 3, 20, None)
    assert episode.reward == 0.0  # the verifier still scored the unfinished episode
    assert [s["max_tokens"] for s in episode.steps if s["type"] == "model"] == [8, 8, 4]
    # without a budget the same model runs to the domain's turn cap, 8 tokens a call
    unbounded = await run_one(endless_harness(tmp_path), NeverStopsDouble(), SamplingParams(max_tokens=8))
    assert (unbounded.end, unbounded.completion_tokens) == ("max_turns", 8 * DOMAIN.max_turns_limit)


@pytest.mark.parametrize("budget", [1, 7, 8, 9, 33])
async def test_completion_tokens_never_exceed_the_budget(tmp_path: Path, budget: int) -> None:
    episode = await run_one(
        endless_harness(tmp_path), NeverStopsDouble(), SamplingParams(max_tokens=8, episode_tokens=budget)
    )
    assert episode.end == EndReason.TOKEN_BUDGET and episode.completion_tokens == budget


async def test_the_window_counts_the_environments_tokens_too(tmp_path: Path) -> None:
    client = NeverStopsDouble(count=True)
    sampling = SamplingParams(max_tokens=8, episode_tokens=1000, episode_window=40)
    episode = await run_one(endless_harness(tmp_path), client, sampling)
    assert episode.end == "token_budget" and episode.completion_tokens < 1000  # the window ended it
    first = client.prompts[0]
    for prompt, asked in zip(client.prompts, client.asked, strict=True):
        assert prompt - first + asked <= 40  # assistant and environment tokens after the first prompt
    assert client.asked[0] == 8 and client.asked[-1] < 8


@pytest.mark.parametrize("count", [True, False], ids=["counted", "estimated"])
async def test_the_models_context_is_never_overrun(tmp_path: Path, count: bool) -> None:
    client = NeverStopsDouble(count=count, max_model_len=120)
    episode = await run_one(endless_harness(tmp_path), client, SamplingParams(max_tokens=16))
    assert episode.end == "token_budget" and episode.error is None  # the double asserts every request fits
    assert len(client.asked) >= 2


async def test_shared_first_turns_get_the_same_clamp(tmp_path: Path) -> None:
    client = NeverStopsDouble()
    async with HarnessProcess(endless_harness(tmp_path), ALLOWED) as harness:
        runner = EpisodeRunner(
            DOMAIN,
            harness,
            client,
            SamplingParams(max_tokens=8, episode_tokens=12),
            RunnerConfig(share_first_turn=True),
        )
        episodes = await runner.run([SECRET_7], k=3)
    assert client.asked[0] == 8 and client.asked[1:] == [4, 4, 4]  # one n=3 request, then each its own
    assert [e.completion_tokens for e in episodes] == [12, 12, 12]


# ----- a tiny real model, in process (counted) and over HTTP (estimated) ----------------------------


@pytest.fixture(scope="module")
def tiny_client(tiny_qwen3_dir):
    from tests.fixtures.models import load_tiny
    from whale.inference.transformers_backend import TransformersClient

    model, tok = load_tiny(tiny_qwen3_dir)
    return TransformersClient(model, tok, max_batch_size=4, model_name="tiny", max_model_len=160)


async def test_tiny_model_in_process_stays_within_budget_and_context(tmp_path: Path, tiny_client) -> None:
    sampling = SamplingParams(temperature=0.0, max_tokens=24, episode_tokens=50)
    async with HarnessProcess(endless_harness(tmp_path), ALLOWED) as harness:
        episodes = await EpisodeRunner(DOMAIN, harness, tiny_client, sampling).run([SECRET_7], k=2)
    for episode in episodes:
        assert episode.error is None and episode.completion_tokens <= 50
        calls = [s for s in episode.steps if s["type"] == "model"]
        spent = 0
        for call in calls:
            assert call["max_tokens"] <= min(24, 50 - spent)
            assert call["prompt_tokens"] + call["max_tokens"] <= 160
            assert call["completion_tokens"] <= call["max_tokens"]
            spent += call["completion_tokens"]


async def test_tiny_model_over_http_never_overruns_the_servers_context(tmp_path: Path, tiny_client) -> None:
    from whale.inference.openai_http import OpenAIClient
    from whale.inference.server import create_app, serve_in_thread

    with serve_in_thread(create_app(tiny_client, "tiny")) as url:
        async with OpenAIClient(url, model="tiny", max_model_len=160, max_retries=0) as http:
            assert await http.count_prompt_tokens([], None, SamplingParams()) is None  # it must estimate
            sampling = SamplingParams(temperature=0.0, max_tokens=40)
            async with HarnessProcess(endless_harness(tmp_path), ALLOWED) as harness:
                episode = await EpisodeRunner(DOMAIN, harness, http, sampling).run_episode(SECRET_7)
    # the server refuses (HTTP 500) a request past its 160 tokens: no error means every clamp held
    assert episode.error is None and episode.end in ("token_budget", "max_turns")
    for call in (s for s in episode.steps if s["type"] == "model"):
        assert call["prompt_tokens"] + call["max_tokens"] <= 160
