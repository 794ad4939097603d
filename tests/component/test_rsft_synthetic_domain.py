"""The synthetic domain as a plugin: registered, deterministic splits, verifier, h0 through the runtime."""

from __future__ import annotations

import asyncio

import pytest

from whale import plugins
from whale.core.spec import Data
from whale.domain import DomainError
from whale.harness.runner import run_episodes
from whale.harness.validate import validate_file
from whale.inference.base import SamplingParams
from whale.inference.scripted import ScriptedClient


@pytest.fixture(scope="module")
def domain():
    return plugins.load("synthetic")


def test_registered_with_deterministic_capped_splits(domain):
    assert "synthetic" in plugins.available()
    data = Data(seed=3, weight_size=50, harness_size=16)
    weight = domain.load_split("weight", data)
    assert len(weight) == 50 and weight == domain.load_split("weight", data)
    assert domain.split_sizes(data) == {"weight": 50, "harness": 16, "test": 200}
    assert weight != domain.load_split("weight", Data(seed=4, weight_size=50))
    assert {i["id"] for i in weight}.isdisjoint(i["id"] for i in domain.load_split("test", data))


def test_verifier_reads_the_last_answer_tag(domain):
    from synthetic import tasks

    item = {"digit": 4, "answer": "4"}
    assert tasks.score("<answer>1</answer> no, <answer> 4 </answer>", item) == 1.0
    assert tasks.score("4", item) == 0.0 and tasks.score("<answer>5</answer>", item) == 0.0


def test_raw_items_are_checked_with_a_clear_error(domain):
    assert domain.item_from_raw({"digit": "7"})["answer"] == "7"
    with pytest.raises(DomainError, match="'digit' must be 0-9"):
        domain.item_from_raw({"digit": 12})
    with pytest.raises(DomainError, match="needs an integer field 'digit'"):
        domain.item_from_raw({"x": 1})


def test_h0_runs_through_the_harness_runtime(domain):
    validate_file(domain.h0_path(), domain.allowed_imports)
    items = [domain.item_from_raw({"id": "a", "digit": 3}), domain.item_from_raw({"id": "b", "digit": 3})]
    client = ScriptedClient(["<answer>3</answer>", "<answer>6</answer>"])
    episodes = asyncio.run(run_episodes(domain, domain.h0_path(), client, items, SamplingParams(max_tokens=8)))
    # replies go out in call order, which concurrency may interleave: judge each episode by its own reply
    for episode, item in zip(episodes, items, strict=True):
        assert [m["role"] for m in episode.messages] == ["system", "user", "assistant"]
        assert episode.messages[1]["content"] == f"Repeat the digit {item['digit']}."
        right = episode.messages[2]["content"] == f"<answer>{item['digit']}</answer>"
        assert episode.reward == (1.0 if right else 0.0)
    assert sorted(e.reward for e in episodes) == [0.0, 1.0]
