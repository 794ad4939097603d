"""Search and eval refuse a checkpoint without its COMPLETE marker, as train does, before any weights load.

The half-written checkpoint holds a config and a damaged weights file: a workload that tried to load it
would fail on the weights with another error, so the error type proves the check came first."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.fixtures.guess_domain import GuessNumberDomainDouble
from tests.fixtures.proposer_double import DigitSayerPolicyDouble
from whale import layout
from whale.inference.scripted import FixedLatencyClient
from whale.protocol import EvalPhaseArgs, HarnessPhaseArgs, PhaseKind, PhaseRequest
from whale.rsft.checkpoint import CheckpointIncomplete
from whale.store import open_store
from whale.workloads.eval import run_eval
from whale.workloads.search import run_search

RUN = "ck"
STEP = 2
EVAL_PHASE = layout.eval_phase_key(1, STEP, "weight")
SEARCH_PHASE = layout.harness_phase_key(1)
SPEC = {
    "condition": "mh_only",
    "model": {"name": "unused"},
    "inference": {"backend": "transformers", "maxConcurrency": 2},
    "evaluation": {"samplesPerItem": 1},
    "data": {"harnessSize": 2},
}


@pytest.fixture()
def store(tmp_path: Path):
    store = open_store(str(tmp_path / "store"))
    prefix = layout.checkpoint_prefix(RUN, STEP)
    store.write_json(f"{prefix}/config.json", {"model_type": "llama"})
    store.write_bytes(f"{prefix}/model.safetensors", b"half-written")  # no COMPLETE: its writer died
    return store


def eval_request(store, domain: str = "guess") -> None:
    store.write_json(
        layout.request_key(RUN, EVAL_PHASE),
        PhaseRequest(
            run=RUN,
            phase=EVAL_PHASE,
            kind=PhaseKind.EVAL,
            attempt=1,
            spec={**SPEC, "domain": domain},
            eval=EvalPhaseArgs(
                cycle=1, step=STEP, after="weight", checkpoint=layout.checkpoint_prefix(RUN, STEP), harness=None
            ),
        ).to_wire(),
    )


def test_eval_refuses_an_incomplete_checkpoint_naming_it(store) -> None:
    eval_request(store)
    uri = store.uri_for(layout.checkpoint_prefix(RUN, STEP))
    with pytest.raises(CheckpointIncomplete, match=f"checkpoint {uri} is missing or incomplete") as refused:
        run_eval(store, RUN, EVAL_PHASE, domain=GuessNumberDomainDouble())  # in-process backend: it would load it
    assert "no COMPLETE marker" in str(refused.value)
    # an injected client does not bypass the check either
    with pytest.raises(CheckpointIncomplete):
        run_eval(store, RUN, EVAL_PHASE, domain=GuessNumberDomainDouble(), client=FixedLatencyClient("x", 0.0))
    assert not store.exists(layout.result_key(RUN, EVAL_PHASE))

    store.write_bytes(layout.checkpoint_complete_key(RUN, STEP), b"")  # complete: the same request runs
    result = run_eval(
        store, RUN, EVAL_PHASE, domain=GuessNumberDomainDouble(), client=FixedLatencyClient("<guess>42</guess>", 0.0)
    )
    assert result.items == 4 and result.checkpoint == layout.checkpoint_prefix(RUN, STEP)


def test_the_eval_workload_process_fails_with_one_line_naming_the_checkpoint(store) -> None:
    eval_request(store, domain="chess_puzzles")
    done = subprocess.run(
        [sys.executable, "-m", "whale.workloads", "eval", "--store", store.uri, "--run", RUN, "--phase", EVAL_PHASE],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 1
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("eval workload failed: CheckpointIncomplete: checkpoint "), last
    assert store.uri_for(layout.checkpoint_prefix(RUN, STEP)) in last


def test_search_refuses_an_incomplete_checkpoint_naming_it(store) -> None:
    spec = {
        **SPEC,
        "domain": "synthetic",
        "harnessSearch": {
            "proposer": {"backend": "openai", "baseUrl": "http://127.0.0.1:9/v1", "model": "never-reached"}
        },
    }
    store.write_json(
        layout.request_key(RUN, SEARCH_PHASE),
        PhaseRequest(
            run=RUN,
            phase=SEARCH_PHASE,
            kind=PhaseKind.HARNESS,
            attempt=1,
            spec=spec,
            harness=HarnessPhaseArgs(
                cycle=1,
                incoming_harness=None,
                checkpoint=layout.checkpoint_prefix(RUN, STEP),
                step=STEP,
                iterations=2,
                archive=layout.archive_prefix(RUN, 1),
            ),
        ).to_wire(),
    )
    uri = store.uri_for(layout.checkpoint_prefix(RUN, STEP))
    with pytest.raises(CheckpointIncomplete, match=f"checkpoint {uri} is missing or incomplete"):
        run_search(store, RUN, SEARCH_PHASE, client=DigitSayerPolicyDouble())
    assert (
        store.list(layout.archive_prefix(RUN, 1)) == []
        and store.read_jsonl(layout.metrics_key(RUN, SEARCH_PHASE)) == []
    )
