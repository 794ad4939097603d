"""The episode runtime end to end: a real sandboxed harness process, the guess-the-number test
double domain, scripted/fixed-latency clients (the model is not what is under test here)."""

from __future__ import annotations

import asyncio
import json
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

from tests.fixtures.guess_domain import GuessNumberDomainDouble
from whale.harness.launch import SandboxLimits
from whale.harness.process import HarnessProcess
from whale.harness.runner import EpisodeRunner, RunnerConfig, run_episodes
from whale.harness.trace import read_jsonl
from whale.inference.base import ChatResult, Completion, InferenceClient, SamplingParams
from whale.inference.scripted import FixedLatencyClient, ScriptedClient

DOMAIN = GuessNumberDomainDouble()
SECRET_7 = DOMAIN.items[0]  # secret 7
ALLOWED = frozenset({"re"})


def harness_file(tmp_path: Path, body: str, name: str = "h.py") -> Path:
    path = tmp_path / name
    path.write_text(
        "import re\nfrom whale.harness.api import BaseHarness, Decision, env_action, tool_action\n\n"
        + textwrap.dedent(body)
    )
    return path


async def one(path: Path, replies: list[Any], item: dict[str, Any] = SECRET_7, limits: SandboxLimits | None = None):
    async with HarnessProcess(path, ALLOWED, limits) as harness:
        runner = EpisodeRunner(DOMAIN, harness, ScriptedClient(replies), SamplingParams())
        return await runner.run_episode(item)


@pytest.mark.usefixtures("transport")
async def test_solved_episode_has_a_complete_trace() -> None:
    episode = await one(DOMAIN.h0_path(), ["<guess>50</guess>", "I think <guess>7</guess>"])
    assert (episode.reward, episode.turns, episode.end, episode.error) == (1.0, 2, "env_done", None)
    assert [m["role"] for m in episode.messages] == ["system", "user", "assistant", "user", "assistant"]
    assert episode.messages[4] == {"role": "assistant", "content": "I think <guess>7</guess>"}
    assert "Feedback: lower" in episode.messages[3]["content"]
    assert [a["action"] for a in episode.actions] == ["50", "7"]
    models = [s for s in episode.steps if s["type"] == "model"]
    assert [s["message_index"] for s in models] == [2, 4]
    assert episode.prompt_tokens == sum(s["prompt_tokens"] for s in models) > 0
    assert episode.completion_tokens == 4
    assert episode.seconds >= episode.harness_seconds > 0
    assert episode.subset == "odd" and episode.item_id == "g0" and episode.started_at


async def test_turn_budget_ends_the_episode_and_the_verifier_still_scores() -> None:
    episode = await one(DOMAIN.h0_path(), ["<guess>1</guess>"] * 10)
    assert (episode.end, episode.turns, episode.reward) == ("max_turns", 6, 0.0)


async def test_domain_turn_cap_overrides_the_harness(tmp_path: Path) -> None:
    path = harness_file(
        tmp_path,
        """
        class Harness(BaseHarness):
            USER_TEMPLATE = "{feedback}"
            MAX_TURNS = 500
            def parse_action(self, text, state):
                return env_action(text)
    """,
    )
    episode = await one(path, ["1"] * 30)
    assert (episode.end, episode.turns) == ("max_turns", DOMAIN.max_turns_limit)


async def test_too_few_replies_become_empty_replies_and_format_retry_then_stop() -> None:
    episode = await one(DOMAIN.h0_path(), ["<guess>3</guess>"])
    assert episode.end == "harness_done" and episode.turns == 3
    assert [m["content"] for m in episode.messages if m["role"] == "assistant"] == ["<guess>3</guess>", "", ""]


async def test_native_tool_calls_run_domain_tools(tmp_path: Path) -> None:
    path = harness_file(
        tmp_path,
        """
        class Harness(BaseHarness):
            USER_TEMPLATE = "Guess. {feedback}"
            MAX_TURNS = 4
            TOOLS = [{"type": "function", "function": {"name": "hint", "parameters": {"type": "object", "properties": {}}}}]
            def parse_action(self, text, state):
                m = re.search(r"<guess>(\\d+)</guess>", text)
                return env_action(m.group(1)) if m else None
    """,
    )
    call = {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "hint", "arguments": "{}"}},
            {"id": "c2", "type": "function", "function": {"name": "oracle", "arguments": "{}"}},
        ],
    }
    episode = await one(path, [call, "<guess>7</guess>"])
    assert episode.reward == 1.0 and episode.turns == 2
    tool_messages = [m for m in episode.messages if m["role"] == "tool"]
    assert tool_messages[0] == {"role": "tool", "content": "odd", "name": "hint", "tool_call_id": "c1"}
    assert "unknown tool 'oracle'" in tool_messages[1]["content"]
    assert [t["result"]["error"] is None for t in episode.tool_calls] == [True, False]


async def test_harness_may_call_a_tool_before_the_first_model_turn(tmp_path: Path) -> None:
    path = harness_file(
        tmp_path,
        """
        class Harness(BaseHarness):
            MAX_TURNS = 2
            def start(self, task, state):
                state["low"] = task["low"]
                return Decision(actions=[tool_action("hint", {})])
            def observe(self, results, state):
                return Decision(messages=[{"role": "user", "content": "parity " + results[0]["content"] + " from " + str(state["low"])}])
            def parse_action(self, text, state):
                return env_action(text)
    """,
    )
    episode = await one(path, ["7"])
    assert episode.messages[0] == {"role": "user", "content": "parity odd from 1"}
    assert episode.reward == 1.0 and episode.turns == 1


@pytest.mark.usefixtures("transport")
async def test_a_failing_hook_ends_only_its_episode_with_the_harness_line(tmp_path: Path) -> None:
    path = harness_file(
        tmp_path,
        """
        class Harness(BaseHarness):
            USER_TEMPLATE = "{feedback}"
            def parse_action(self, text, state):
                if text == "boom":
                    return 1 / 0
                return env_action(text)
    """,
    )
    async with HarnessProcess(path, ALLOWED) as harness:
        bad = EpisodeRunner(DOMAIN, harness, ScriptedClient(["boom"]), SamplingParams())
        good = EpisodeRunner(DOMAIN, harness, ScriptedClient(["7"]), SamplingParams())
        failed, solved = await asyncio.gather(bad.run_episode(SECRET_7), good.run_episode(SECRET_7))
    assert failed.end == "error" and failed.reward == 0.0
    assert "ZeroDivisionError" in failed.error and "harness line 9" in failed.error
    assert solved.reward == 1.0


@pytest.mark.usefixtures("transport")
async def test_a_hung_hook_times_out_and_the_process_comes_back(tmp_path: Path) -> None:
    path = harness_file(
        tmp_path,
        """
        class Harness(BaseHarness):
            USER_TEMPLATE = "{feedback}"
            def parse_action(self, text, state):
                while text == "loop":
                    pass
                return env_action(text)
    """,
    )
    limits = SandboxLimits(hook_timeout_s=1.0)
    async with HarnessProcess(path, ALLOWED, limits) as harness:
        hung = await EpisodeRunner(DOMAIN, harness, ScriptedClient(["loop"]), SamplingParams()).run_episode(SECRET_7)
        after = await EpisodeRunner(DOMAIN, harness, ScriptedClient(["7"]), SamplingParams()).run_episode(SECRET_7)
        assert harness.restarts == 1
    assert hung.end == "error" and "did not answer within 1 s" in hung.error
    assert after.reward == 1.0


class CountingClient(InferenceClient):
    """Answers "<guess>42</guess>" after a short sleep and records the peak number of requests in flight."""

    def __init__(self, latency_s: float):
        self.latency_s, self.in_flight, self.peak, self.calls = latency_s, 0, 0, 0

    async def chat(self, messages, sampling, n=1, tools=None) -> ChatResult:
        self.in_flight += 1
        self.calls += 1
        self.peak = max(self.peak, self.in_flight)
        await asyncio.sleep(self.latency_s)
        self.in_flight -= 1
        return ChatResult(
            [Completion({"role": "assistant", "content": "<guess>42</guess>"}, "stop", 3)], 20, 3, self.latency_s
        )


async def test_episodes_run_concurrently_up_to_the_limit_and_traces_stream_to_jsonl(tmp_path: Path) -> None:
    items = [{"id": f"i{n}", "secret": 42} for n in range(12)]
    client = CountingClient(latency_s=0.2)
    traces = tmp_path / "traces.jsonl"
    started = time.perf_counter()
    episodes = await run_episodes(
        DOMAIN,
        DOMAIN.h0_path(),
        client,
        items,
        SamplingParams(),
        k=2,
        config=RunnerConfig(max_concurrency=8),
        traces=traces,
    )
    elapsed = time.perf_counter() - started
    assert client.peak == 8
    assert elapsed < 24 * 0.2 / 3  # sequential would take 4.8 s
    assert [(e.item_id, e.sample) for e in episodes] == [(f"i{n}", s) for n in range(12) for s in range(2)]
    assert all(e.reward == 1.0 for e in episodes)
    written = list(read_jsonl(traces))
    assert sorted(e.episode_id for e in written) == sorted(e.episode_id for e in episodes)
    assert all(json.loads(line)["reward"] == 1.0 for line in traces.read_text().splitlines())


async def test_fixed_latency_client_counts_tokens_per_episode() -> None:
    client = FixedLatencyClient("<guess>42</guess>", 0.0, prompt_tokens=10, completion_tokens=4)
    episodes = await run_episodes(DOMAIN, DOMAIN.h0_path(), client, [{"id": "x", "secret": 42}], SamplingParams())
    assert (episodes[0].prompt_tokens, episodes[0].completion_tokens) == (10, 4)


async def test_environment_bug_is_an_error_episode_not_a_crash() -> None:
    items = [{"id": "broken"}]  # no secret: the environment raises KeyError
    episodes = await run_episodes(DOMAIN, DOMAIN.h0_path(), ScriptedClient([]), items, SamplingParams())
    assert episodes[0].end == "error" and episodes[0].error.startswith("internal: ")


@pytest.mark.parametrize(
    "source,needle",
    [
        ("class Harness(BaseHarness):\n    MAX_TURNS = 'many'\n", "MAX_TURNS must be int"),
        ("class Harness(BaseHarness):\n    x = 1 / 0\n", "harness line 5"),
        ("class Other:\n    pass\n", "must define class Harness"),
    ],
)
@pytest.mark.usefixtures("transport")
async def test_load_errors_name_the_cause(tmp_path: Path, source: str, needle: str) -> None:
    from whale.harness.process import HarnessLoadError

    with pytest.raises(HarnessLoadError, match=needle):
        async with HarnessProcess(harness_file(tmp_path, source), ALLOWED):
            pass


@pytest.mark.usefixtures("transport")
async def test_a_pool_spreads_concurrent_hooks_over_its_processes(tmp_path: Path) -> None:
    from whale.harness.process import HarnessPool

    path = harness_file(
        tmp_path,
        """
        import os
        PROCESS = os.urandom(8).hex()  # pids do not tell sandboxes apart: each has its own PID namespace
        class Harness(BaseHarness):
            def start(self, task, state):
                total = 0
                for i in range(20000):
                    total += i
                return Decision(messages=[{"role": "user", "content": PROCESS}])
    """,
    )
    async with HarnessPool(path, ALLOWED, processes=2) as pool:
        answers = await asyncio.gather(*[pool.call("start", {"task": {}}, {}) for _ in range(20)])
        assert pool.isolation["processes"] == 2
    assert len({decision["messages"][0]["content"] for decision, _ in answers}) == 2


class RecordingClient(ScriptedClient):
    """Scripted replies; records the n of every request."""

    def __init__(self, replies: list[Any]):
        super().__init__(replies)
        self.ns: list[int] = []

    async def chat(self, messages, sampling, n=1, tools=None):  # the interface's
        self.ns.append(n)
        return await super().chat(messages, sampling, n, tools)


async def test_an_items_k_first_turns_are_one_request_with_n_k() -> None:
    items = [DOMAIN.items[0], {"id": "g9", "secret": 9}]
    client = RecordingClient([f"<guess>{i}</guess>" for i in range(1, 40)])
    async with HarnessProcess(DOMAIN.h0_path(), ALLOWED) as harness:
        runner = EpisodeRunner(
            DOMAIN, harness, client, SamplingParams(), RunnerConfig(max_concurrency=4, share_first_turn=True)
        )
        episodes = await runner.run(items, k=3)
    # one n=3 request per item for the first turns; one n=1 request per later turn
    assert client.ns.count(3) == 2 and client.ns.count(1) == sum(e.turns - 1 for e in episodes) > 0
    for i in range(2):
        firsts = {e.messages[e.assistant_indices[0]]["content"] for e in episodes[3 * i : 3 * i + 3]}
        assert len(firsts) == 3  # each of the 3 completions went to its own episode
    assert all(e.end != "error" and e.turns >= 1 for e in episodes)
    first_steps = [next(s for s in e.steps if s["type"] == "model") for e in episodes]
    assert [s["shared_n"] for s in first_steps] == [3] * 6 and all(s["completion_tokens"] == 1 for s in first_steps)
    assert all("shared_n" not in s for e in episodes for s in e.steps[1:] if s["type"] == "model" and s["turn"] > 1)


async def test_samples_with_different_first_prompts_make_their_own_requests(tmp_path: Path) -> None:
    path = harness_file(
        tmp_path,
        """
        class Harness(BaseHarness):
            USER_TEMPLATE = "Guess."
            MAX_TURNS = 1

            def start(self, task, state):
                self.calls = getattr(self, "calls", 0) + 1   # differs per episode (one process, in order)
                return Decision(messages=[{"role": "user", "content": f"Guess #{self.calls}"}])
    """,
    )
    client = RecordingClient(["5"] * 10)
    async with HarnessProcess(path, ALLOWED) as harness:
        runner = EpisodeRunner(DOMAIN, harness, client, SamplingParams(), RunnerConfig(share_first_turn=True))
        episodes = await runner.run([SECRET_7], k=3)
    assert sorted(client.ns) == [1, 1, 3]
    assert [e.turns for e in episodes] == [1, 1, 1] and all(e.end != "error" for e in episodes)
    assert ["shared_n" in next(s for s in e.steps if s["type"] == "model") for e in episodes].count(True) == 1


async def test_without_sharing_every_episode_asks_for_one_sample() -> None:
    client = RecordingClient(["<guess>7</guess>"] * 3)
    async with HarnessProcess(DOMAIN.h0_path(), ALLOWED) as harness:
        await EpisodeRunner(DOMAIN, harness, client, SamplingParams()).run([SECRET_7], k=3)
    assert client.ns == [1, 1, 1]


@pytest.mark.usefixtures("transport")
async def test_a_pool_whose_worker_fails_to_start_leaves_no_process_of_the_others(tmp_path: Path, monkeypatch) -> None:
    """One worker fails at once while the other is still spawning its process (a bare gather raised then, the pool was
    closed before that process existed, and it was left running): every process the pool spawned has ended."""
    from whale.harness import launch
    from whale.harness.process import HarnessLoadError, HarnessPool

    spawned: list[launch.Spawned] = []
    spawn = launch.spawn_worker

    async def recording_spawn(*args: Any, **kwargs: Any) -> launch.Spawned:
        proc = await spawn(*args, **kwargs)
        spawned.append(proc)
        return proc

    monkeypatch.setattr(launch, "spawn_worker", recording_spawn)
    pool = HarnessPool(DOMAIN.h0_path(), ALLOWED, processes=2)

    async def fails_at_once() -> Any:
        raise HarnessLoadError("the first worker's harness did not load")

    monkeypatch.setattr(pool.workers[0], "start", fails_at_once)  # a test double of a failed load, no process
    with pytest.raises(HarnessLoadError, match="did not load"):
        await pool.start()
    assert len(spawned) == 1, "the other worker spawned its process"
    assert all(proc.returncode is not None for proc in spawned), "and it was stopped, not left running"
