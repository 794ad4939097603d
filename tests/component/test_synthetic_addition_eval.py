"""An evaluation of synthetic's addition task (``spec.experiment.domainOptions.syntheticTask: addition``) through the real eval workload,
store and harness sandbox: the phase starts from the task's own h0 (``Domain.h0_path_for``), asks the sums and scores
the tag. The model is a fixed-reply stand-in (``FixedLatencyClient``): what is tested is the workload, not a model."""

from __future__ import annotations

from pathlib import Path

from synthetic import tasks
from whale import plugins
from whale.core import layout
from whale.core.protocol import EvalPhaseArgs, phase_request
from whale.core.spec import Data
from whale.inference.scripted import FixedLatencyClient
from whale.store import open_store
from whale.workloads.eval import read_traces, run_eval

RUN, PHASE = "add", "eval-c00-s000000-start"


def test_an_addition_run_evaluates_under_its_own_h0(tmp_path: Path) -> None:
    store = open_store(str(tmp_path / "store"))
    spec = {
        "domain": "synthetic",
        "condition": "mh_only",
        "model": {"name": "unused"},
        "data": {"syntheticTask": "addition"},
        "evaluation": {"samplesPerItem": 2, "maxItems": 12, "seed": 0},
        "inference": {"maxConcurrency": 4},
    }
    store.write_json(layout.spec_key(RUN), spec)
    args = EvalPhaseArgs(cycle=0, step=0, after="start", checkpoint=None, harness=None)
    store.write_json(
        layout.request_key(RUN, PHASE), phase_request(spec, run=RUN, phase=PHASE, attempt=1, args=args).to_wire()
    )

    items = tasks.make_split("test", 12, seed=42, task=tasks.Task.ADDITION)
    answer = items[0]["answer"]
    result = run_eval(store, RUN, PHASE, client=FixedLatencyClient(f"<answer>{answer}</answer>", 0.0))

    right = sum(it["answer"] == answer for it in items)
    assert 0 < right < 12  # the fixed reply is right on some items only
    assert (result.items, result.k, result.mean_at_k) == (12, 2, right / 12)
    traces = read_traces(store, RUN, PHASE)
    h0 = plugins.load("synthetic").with_options({"syntheticTask": "addition"}).h0_path_for(Data()).read_text()
    for trace in traces:
        system, user = trace["messages"][0], trace["messages"][1]
        assert system["role"] == "system" and system["content"] in h0 and "add 20 and 30" in system["content"]
        item = next(it for it in items if it["id"] == trace["item_id"])
        assert user["content"].startswith(f"What is {item['a']} + {item['b']}?")
