"""Reproducible evaluation (``spec.experiment.evaluation.seed``): real tiny models, real harness processes, the real
eval workload. The same checkpoint and harness give the same per-item rewards and mean@k whatever the
concurrency and batching, in process and over HTTP; another seed samples other replies."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from tests.component.rsft_support import tiny_model_dir
from whale.core import layout
from whale.core.protocol import EvalPhaseArgs, phase_request
from whale.harness.runner import SharedFirstTurn
from whale.inference.base import ChatResult, Completion, InferenceClient, SamplingParams
from whale.inference.transformers_backend import TransformersClient, load_model
from whale.store import open_store
from whale.workloads.eval import read_traces, run_eval

pytestmark = pytest.mark.timeout(240)

RUN, PHASE = "seeded", "eval-c00-s000000-start"
HOT = SamplingParams(temperature=1.0, top_k=-1, max_tokens=8)


@pytest.fixture(scope="module")
def synthetic_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The synthetic domain's tiny model: it answers right in about a fifth of its sampled replies, so
    per-item rewards vary from sample to sample."""
    return tiny_model_dir(tmp_path_factory.getbasetemp())


def _chat(client: TransformersClient, prompt: str, sampling: SamplingParams, n: int = 1) -> list[str]:
    async def go() -> list[str]:
        try:
            result = await client.chat([{"role": "user", "content": prompt}], sampling, n=n)
        finally:
            await client.aclose()
        return [c.message["content"] for c in result.completions]

    return asyncio.run(go())


def test_seeded_rows_do_not_depend_on_what_shares_the_batch(synthetic_dir: Path) -> None:
    model, tokenizer = load_model(str(synthetic_dir))
    client = TransformersClient(model, tokenizer, batch_wait_s=0.2, max_batch_size=32)
    seeded = SamplingParams(temperature=1.0, top_k=-1, max_tokens=8, seed=1234)
    alone = _chat(client, "Repeat the digit 3.", seeded, n=4)

    async def crowded() -> list[list[str]]:
        messages = [[{"role": "user", "content": f"Repeat the digit {d}."}] for d in (3, 7, 1)]
        calls = [
            client.chat(messages[0], seeded, n=4),
            client.chat(messages[1], SamplingParams(temperature=1.0, top_k=-1, max_tokens=6, seed=99), n=3),
            client.chat(messages[2], HOT, n=2),
        ]  # unseeded, in the same batch
        try:
            results = await asyncio.gather(*calls)
        finally:
            await client.aclose()
        return [[c.message["content"] for c in r.completions] for r in results]

    batches: list[int] = []
    generate = client._generate

    def counting(batch):
        batches.append(sum(r.n for r in batch))
        return generate(batch)

    client._generate = counting
    with_others = asyncio.run(crowded())
    assert batches == [9]  # one generate call for the three requests
    assert with_others[0] == alone
    # completion j of a seeded n-sample call is the call with seed + j (vLLM's rule for its child requests)
    assert _chat(client, "Repeat the digit 3.", SamplingParams(temperature=1.0, top_k=-1, max_tokens=8, seed=1236)) == [
        alone[2]
    ]
    other = _chat(
        client, "Repeat the digit 3.", SamplingParams(temperature=1.0, top_k=-1, max_tokens=8, seed=4321), n=4
    )
    assert other != alone
    assert len(set(alone)) > 1  # the rows of one call are different samples


class NumberedClient(InferenceClient):
    """Completion j of every call says "j" (test double); records each call's seed and n."""

    def __init__(self) -> None:
        self.calls: list[tuple[int | None, int]] = []

    async def chat(self, messages, sampling, n=1, tools=None) -> ChatResult:
        self.calls.append((sampling.seed, n))
        return ChatResult([Completion({"role": "assistant", "content": str(j)}, "stop", 1) for j in range(n)], 1, n)


def test_shared_first_turn_gives_each_sample_its_own_completion_whatever_the_arrival_order() -> None:
    messages = [{"role": "user", "content": "q"}]

    async def take(order: list[int]) -> tuple[dict[int, str], list[tuple[int | None, int]]]:
        client, shared = NumberedClient(), SharedFirstTurn(3, seed=7)
        got = {}
        for index in order:
            taken = await shared.take(client, messages, None, HOT, index)
            assert taken is not None
            _, completion = taken
            got[index] = completion.message["content"]
        return got, client.calls

    assert asyncio.run(take([2, 0, 1])) == asyncio.run(take([0, 1, 2])) == ({0: "0", 1: "1", 2: "2"}, [(7, 3)])


def _write_request(store: Any, spec_extra: dict[str, Any]) -> None:
    spec: dict[str, Any] = {
        "domain": "synthetic",
        "condition": "mh_only",
        "model": {"name": "unused", "maxModelLen": 256},
        "evaluation": {"samplesPerItem": 4, "temperature": 1.0, "maxItems": 12},
        "rsft": {"sampling": {"maxResponseTokens": 12, "topK": -1}},
    }
    for key, value in spec_extra.items():
        spec[key] = {**spec.get(key, {}), **value}
    store.write_json(layout.spec_key(RUN), spec)
    store.write_json(
        layout.request_key(RUN, PHASE),
        phase_request(
            spec,
            run=RUN,
            phase=PHASE,
            attempt=1,
            args=EvalPhaseArgs(cycle=0, step=0, after="start", checkpoint=None, harness=None),
        ).to_wire(),
    )


def _evaluate(tmp_path: Path, name: str, **spec_extra: Any) -> tuple[float, dict[str, list[float]], dict[str, str]]:
    store = open_store(str(tmp_path / name))
    _write_request(store, spec_extra)
    result = run_eval(store, RUN, PHASE)
    rewards = {r["item_id"]: r["rewards"] for r in store.read_jsonl(layout.eval_items_key(RUN, PHASE))}
    replies = {t["episode_id"]: t["messages"][-1]["content"] for t in read_traces(store, RUN, PHASE)}
    return result.mean_at_k, rewards, replies


def test_same_model_and_harness_give_the_same_mean_at_k_whatever_the_concurrency(
    tmp_path: Path, synthetic_dir: Path
) -> None:
    model = {"name": str(synthetic_dir)}
    first = _evaluate(tmp_path, "a", model=model, inference={"backend": "transformers", "maxConcurrency": 1})
    again = _evaluate(tmp_path, "b", model=model, inference={"backend": "transformers", "maxConcurrency": 48})
    assert first == again
    mean, rewards, replies = first
    assert len(rewards) == 12 and len(replies) == 48
    assert 0.0 < mean < 1.0  # the rewards vary, so equal per-item rewards are a real check
    _other_mean, other_rewards, other_replies = _evaluate(
        tmp_path, "c", model=model, evaluation={"seed": 1}, inference={"backend": "transformers", "maxConcurrency": 48}
    )
    assert other_replies != replies and other_rewards != rewards


def test_unseeded_evaluations_sample_differently(tmp_path: Path, synthetic_dir: Path) -> None:
    """``seed: null`` keeps unseeded sampling (the check above would fail without the seed)."""
    model = {"name": str(synthetic_dir)}
    runs = [
        _evaluate(
            tmp_path,
            name,
            model=model,
            evaluation={"seed": None},
            inference={"backend": "transformers", "maxConcurrency": 48},
        )
        for name in ("u1", "u2")
    ]
    assert runs[0][2] != runs[1][2]


def test_the_seed_reaches_an_openai_compatible_server(tmp_path: Path, tiny_model_server: str) -> None:
    """Over real HTTP to ``whale.inference.server`` (the in-process backend behind it): the runner's
    per-call seeds travel as the request's ``seed``, so two evaluations sample the same replies."""
    http = {"backend": "openai", "baseUrl": tiny_model_server, "maxConcurrency": 8}
    a = _evaluate(tmp_path, "h1", inference=http)
    b = _evaluate(tmp_path, "h2", inference=http)
    c = _evaluate(tmp_path, "h3", inference=http, evaluation={"seed": 5})
    assert a[2] == b[2] and len(a[2]) == 48
    assert c[2] != a[2]
