"""The eval workload against a real local store: request in, per-item lines, progress, traces and
the EvalResult out; resume, stop requests, failure exits. The guess-the-number test double domain
and fixed-reply clients keep it fast; one slow check runs chess with SmolLM2 end to end."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.fixtures.guess_domain import GuessNumberDomainDouble
from whale.core import layout
from whale.core.protocol import (
    EvalModelUsage,
    EvalPhaseArgs,
    EvalProgress,
    EvalResult,
    PhaseProgress,
    ProgressStage,
    phase_request,
)
from whale.inference.base import ChatResult, InferenceClient, InferenceError
from whale.inference.scripted import FixedLatencyClient
from whale.store import open_store
from whale.workloads.eval import EvalError, item_record, read_traces, run_eval, summarise

RUN, PHASE = "ev", "eval-c00-s000000-start"


def spec_for(spec_extra: dict[str, Any] | None = None, domain: str = "chess_puzzles") -> dict[str, Any]:
    spec: dict[str, Any] = {
        "domain": domain,
        "condition": "mh_only",
        "model": {"name": "unused"},
        "evaluation": {"samplesPerItem": 2, "temperature": 1.0},
        "inference": {"maxConcurrency": 4},
    }
    for key, value in (spec_extra or {}).items():
        spec[key] = {**spec.get(key, {}), **value}
    return spec


def request(
    spec_extra: dict[str, Any] | None = None,
    harness: str | None = None,
    checkpoint: str | None = None,
    domain: str = "chess_puzzles",
) -> dict[str, Any]:
    return phase_request(
        spec_for(spec_extra, domain),
        run=RUN,
        phase=PHASE,
        attempt=1,
        args=EvalPhaseArgs(cycle=0, step=0, after="start", checkpoint=checkpoint, harness=harness),
    ).to_wire()


def write_request(
    store: Any,
    spec_extra: dict[str, Any] | None = None,
    harness: str | None = None,
    checkpoint: str | None = None,
    domain: str = "chess_puzzles",
) -> None:
    """The run's spec.json and the phase's request.json, as a controller writes them before a launch."""
    store.write_json(layout.spec_key(RUN), spec_for(spec_extra, domain))
    store.write_json(layout.request_key(RUN, PHASE), request(spec_extra, harness, checkpoint, domain))


@pytest.fixture()
def store(tmp_path: Path):
    return open_store(str(tmp_path / "store"))


def test_mean_at_k_and_subsets_pure() -> None:
    records = [{"subset": "a", "mean": 1.0}, {"subset": "a", "mean": 0.0}, {"subset": "b", "mean": 0.5}]
    assert summarise(records, 2) == (0.5, {"a": 0.5, "b": 0.5})
    assert summarise([], 8) == (0.0, {})


def test_eval_writes_items_progress_traces_and_result(store) -> None:
    write_request(store)
    client = FixedLatencyClient("<guess>42</guess>", 0.0)
    result = run_eval(store, RUN, PHASE, domain=GuessNumberDomainDouble(), client=client, chunk_items=2)
    # items: secrets 7, 42, 50, 99 -> only 42 is guessed; subsets by parity
    # every turn is a model call of 5 completion tokens; turns 6 (three items) and 1 (the guessed one)
    usage = EvalModelUsage(episodes=8, mean_completion_tokens=23.75, mean_turns=4.75)
    assert result == EvalResult(
        mean_at_k=0.25,
        k=2,
        items=4,
        per_subset={"even": 0.5, "odd": 0.0},
        model_usage=usage,
        sandbox_isolation="namespaces",
    )
    assert EvalResult.model_validate(store.read_json(layout.result_key(RUN, PHASE))) == result
    items = store.read_jsonl(layout.eval_items_key(RUN, PHASE))
    assert [(r["item_id"], r["rewards"], r["k"]) for r in items] == [
        ("g0", [0.0, 0.0], 2),
        ("g1", [1.0, 1.0], 2),
        ("g2", [0.0, 0.0], 2),
        ("g3", [0.0, 0.0], 2),
    ]
    assert items[1]["turns"] == [1, 1] and items[0]["turns"] == [6, 6]
    assert (items[1]["mean_turns"], items[1]["mean_completion_tokens"], items[1]["episodes_without_model"]) == (
        1.0,
        5.0,
        0,
    )
    assert items[0]["mean_completion_tokens"] == 30.0 and items[0]["rewarded_without_model"] == 0
    progress = [EvalProgress.model_validate(line) for line in store.read_jsonl(layout.metrics_key(RUN, PHASE))]
    assert [(p.items_done, p.items_total) for p in progress] == [(2, 4), (4, 4)]
    # the episodes as they finish: the last progress object counts all 8 (written at once when done == total)
    last = PhaseProgress.model_validate(store.read_json(layout.progress_key(RUN, PHASE)))
    assert (last.stage, last.done, last.total, last.unit) == (ProgressStage.EVALUATING, 8, 8, "episodes")
    traces = read_traces(store, RUN, PHASE)
    assert len(traces) == 8 and {t["item_id"] for t in traces} == {"g0", "g1", "g2", "g3"}
    assert all(sum(m["role"] == "assistant" for m in t["messages"]) == t["turns"] for t in traces)
    # each item's k=2 first turns were one n=2 request; later turns one request per episode
    assert client.requests == 4 + sum(t["turns"] - 1 for t in traces) == 34


def test_eval_caps_items_and_uses_the_requested_harness(store, tmp_path: Path) -> None:
    domain = GuessNumberDomainDouble()
    source = domain.h0_path().read_text().replace("MAX_TURNS = 6", "MAX_TURNS = 2")
    store.write_text("runs/ev/harnesses/short.py", source)
    write_request(store, {"evaluation": {"maxItems": 1}}, harness="runs/ev/harnesses/short.py")
    result = run_eval(store, RUN, PHASE, domain=domain, client=FixedLatencyClient("<guess>1</guess>", 0.0))
    assert result.items == 1 and result.harness == "runs/ev/harnesses/short.py"
    assert store.read_jsonl(layout.eval_items_key(RUN, PHASE))[0]["turns"] == [2, 2]


def test_eval_resumes_items_done_by_an_earlier_attempt(store) -> None:
    write_request(store)
    store.append_jsonl(
        layout.eval_items_key(RUN, PHASE), item_record("g0", "odd", []) | {"mean": 1.0, "rewards": [1.0, 1.0]}
    )
    client = FixedLatencyClient("<guess>42</guess>", 0.0)
    result = run_eval(store, RUN, PHASE, domain=GuessNumberDomainDouble(), client=client)
    assert result.items == 4 and result.mean_at_k == 0.5
    assert {t["item_id"] for t in read_traces(store, RUN, PHASE)} == {"g1", "g2", "g3"}


def test_stop_request_ends_with_a_result_and_a_note(store) -> None:
    write_request(store)
    store.write_text(layout.stop_key(RUN, PHASE), "patience\n")
    result = run_eval(store, RUN, PHASE, domain=GuessNumberDomainDouble(), client=FixedLatencyClient("x", 0.0))
    assert result.items == 0 and result.notes == ["stopped by request after 0 of 4 items"]
    assert store.exists(layout.result_key(RUN, PHASE))


class DownClient(InferenceClient):
    """An inference backend that is down (test double)."""

    async def chat(self, messages, sampling, n=1, tools=None) -> ChatResult:
        raise InferenceError("connection refused")


def test_eval_fails_instead_of_reporting_zero_when_inference_is_down(store) -> None:
    write_request(store)
    with pytest.raises(EvalError, match="every episode of the first 4 items failed; first error: connection refused"):
        run_eval(store, RUN, PHASE, domain=GuessNumberDomainDouble(), client=DownClient())
    assert not store.exists(layout.result_key(RUN, PHASE))


def test_workload_process_exits_nonzero_with_one_line(store, failures) -> None:
    """`python -m whale.workloads eval` on the real chess domain, against a server answering 400."""
    failures.reset([400] * 100)
    write_request(
        store,
        {
            "inference": {"backend": "openai", "baseUrl": failures.url},
            "evaluation": {"maxItems": 2, "samplesPerItem": 1},
        },
    )
    done = subprocess.run(
        [sys.executable, "-m", "whale.workloads", "eval", "--store", store.uri, "--run", RUN, "--phase", PHASE],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 1
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("eval workload failed: EvalError: every episode") and "HTTP 400" in last


def test_wrong_request_kind_is_a_clear_error(store) -> None:
    wire = request()
    wire["kind"] = "weight"
    store.write_json(layout.request_key(RUN, PHASE), wire)
    with pytest.raises(EvalError, match="kind is weight, expected eval"):
        run_eval(store, RUN, PHASE, domain=GuessNumberDomainDouble(), client=DownClient())


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_chess_with_smollm2_end_to_end(store, smollm2_gguf) -> None:
    """The real chess domain, h0 and SmolLM2-135M-Instruct in-process, through the workload's main()."""
    from whale.workloads import eval as eval_workload

    folder, gguf = smollm2_gguf
    write_request(
        store,
        {
            "model": {"name": str(folder), "ggufFile": gguf},
            "inference": {"backend": "transformers"},
            "evaluation": {"maxItems": 1, "samplesPerItem": 1},
            "rsft": {"sampling": {"maxResponseTokens": 8}},
        },
    )
    eval_workload.main(store, RUN, PHASE)
    result = EvalResult.model_validate(store.read_json(layout.result_key(RUN, PHASE)))
    assert result.items == 1 and result.k == 1 and 0.0 <= result.mean_at_k <= 1.0
    traces = read_traces(store, RUN, PHASE)
    assert len(traces) == 1
    for trace in traces:
        assert trace["error"] is None and trace["turns"] >= 1 and trace["completion_tokens"] > 0
        assert "Legal moves" in trace["messages"][1]["content"]
        assert trace["messages"][2]["role"] == "assistant"
        json.dumps(trace)
