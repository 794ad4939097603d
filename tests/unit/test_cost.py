"""The cost model of `whale plan` (issue #17): its arithmetic on a small spec with round figures, its
figures read back from the raw JSON they name, and the per-example table of docs/performance.md
equal to what the code prints (as the CRD drift test)."""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from whale.cli import app
from whale.console import cost_table
from whale.core.spec import WhaleRunSpec
from whale.cost import H200, Assumptions, CostError, Figure, Figures, Placement, estimate, parameters_from_name

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "benchmarks" / "results"


def fig(value: float, parameters: float = 1e9) -> Figure:
    return Figure(value, "x", "test", "none.json", (), parameters)


#: round figures, all measured at 1 B parameters
ROUND = Figures(
    gpu="test GPU",
    vllm_generation_tokens_per_s=fig(1000),
    transformers_generation_tokens_per_s=fig(100),
    sft_tokens_per_s=fig(2000),
    sft_packed_tokens_per_s=fig(4000),
    weight_sync_s=fig(3),
    checkpoint_s=fig(10),
    checkpoint_snapshot_s=fig(1),
    colocated_sleep_wake_s=fig(5),
    ipc_sync_s=fig(0.25),
    colocated_ipc_sleep_wake_s=fig(0.5),
)


def small_spec(**over) -> WhaleRunSpec:
    raw: dict[str, Any] = {
        "domain": "synthetic",
        "condition": "whale",
        "model": {"name": "org/Thing-2B"},
        "rsft": {
            "promptsPerStep": 4,
            "rolloutsPerPrompt": 2,
            "sftEpochs": 1,
            "sampling": {"maxResponseTokens": 1000, "episodeTokenBudget": 1000},
        },
        "inference": {"backend": "vllm", "tensorParallelSize": 1},
        "train": {"numNodes": 1, "gpusPerNode": 2},
        "harnessSearch": {"proposer": {"timeoutSeconds": 100}},
        "schedule": {"totalSteps": 10, "weightStepsPerCycle": 5, "harnessIterationsPerCycle": 3},
    }
    for key, value in over.items():
        raw[key] = {**raw.get(key, {}), **value} if isinstance(value, dict) else value
    return WhaleRunSpec.model_validate(raw)


#: what schedule.plan + with_costs give for 10 steps of 8 rollouts, 2 weight and 1 harness phase of
#: 3 archive iterations (48 harness rollouts), 2 evaluations of 20 rollouts
PLAN = {
    "totalSteps": 10,
    "rolloutsPerStep": 8,
    "rollouts": 10 * 8 + 48,
    "harnessIterationsPerPhase": 3,
    "counts": {"weight": 2, "harness": 1, "eval": 2},
    "evaluation": {"rollouts": 40},
}


def test_the_arithmetic_of_a_small_separate_run():
    est = estimate(PLAN, small_spec(), Assumptions(prompt_tokens=0, acceptance=0.5), ROUND)
    # 2 B parameters: generation 1000 x 1e9 / 2e9 = 500 tokens/s on 1 vLLM GPU; SFT 1000 tokens/s per GPU x 2
    assert est.placement is Placement.SEPARATE and (est.train_gpus, est.inference_gpus) == (2, 1)
    assert est.step["generation"] == pytest.approx(8 * 1000 / 500)  # 16 s
    assert est.step["sft"] == pytest.approx(8 * 0.5 * 1000 / (1000 * 2))  # 2 s
    assert est.step["sync"] == pytest.approx(3 * 2)  # 6 s: sync seconds grow with N
    assert est.step["wall"] == pytest.approx(24) and est.step["gpuSeconds"] == pytest.approx(24 * 3)
    # checkpoints: every phase end + every evaluation point (checkpointEverySteps 0); asyncCheckpoint (the
    # default): the trainer waits for the snapshot (2 s at 2 B), but for the whole write (20 s) at the 2 phase ends
    assert est.checkpoints == 4 and est.checkpoint_seconds == pytest.approx(2 * 20 + 2 * 2)
    assert est.weight.gpu_hours == pytest.approx((10 * 24 + 2 * 20 + 2 * 2) * 3 / 3600)
    # harness: 48 rollouts x 1000 tokens / 500 + 2 proposer iterations x 100 s, on the vLLM GPU
    assert est.harness.gpu_hours == pytest.approx((48 * 1000 / 500 + 2 * 100) / 3600)
    assert est.evaluation.gpu_hours == pytest.approx(40 * 1000 / 500 / 3600)
    assert est.total_gpu_hours == pytest.approx(est.weight.gpu_hours + est.harness.gpu_hours + est.evaluation.gpu_hours)
    assert est.upper_bound  # tokens at the cap, proposer at its timeout


def test_a_synchronous_checkpoint_is_priced_at_the_whole_write():
    est = estimate(PLAN, small_spec(rsft={"asyncCheckpoint": False}), Assumptions(prompt_tokens=0), ROUND)
    assert est.checkpoints == 4 and est.checkpoint_seconds == pytest.approx(4 * 20)
    assert est.weight.wall_hours == pytest.approx((10 * est.step["wall"] + 4 * 20) / 3600)
    assert any("asyncCheckpoint false: the whole write, 20.0 s" in a for a in est.assumptions)


def test_colocated_and_in_process_hold_only_the_trainer_gpus():
    colocated = estimate(
        PLAN,
        small_spec(inference={"backend": "vllm", "placement": "colocated"}),
        Assumptions(prompt_tokens=0, acceptance=0.5, tokens_per_episode=1000, proposer_seconds=0),
        ROUND,
    )
    assert colocated.placement is Placement.COLOCATED and not colocated.upper_bound
    # the sidecar server generates on tensorParallelSize (1) of the trainer's GPUs; sleep/wake 5 s at 1 B -> 10 s
    assert colocated.step["generation"] == pytest.approx(8 * 1000 / 500)
    assert colocated.step["sleepWake"] == pytest.approx(10)
    assert colocated.step["wall"] == pytest.approx(16 + 6 + 2 + 10)
    # the step holds the 2 trainer GPUs, not 3: the server's are the trainer's
    assert colocated.step["gpuSeconds"] == pytest.approx(colocated.step["wall"] * 2)
    assert colocated.weight.gpus == 2
    # harness and eval phases keep the vLLM Deployment: tensorParallelSize (1) GPUs
    assert (colocated.harness.gpus, colocated.evaluation.gpus) == (1, 1)
    assert colocated.evaluation.gpu_hours == pytest.approx(40 * 1000 / 500 / 3600)
    assert any("sleep/wake 10.0 s a step" in a for a in colocated.assumptions)
    assert not any("cudaIpc" in a for a in colocated.assumptions)
    ipc = estimate(
        PLAN,
        small_spec(inference={"backend": "vllm", "placement": "colocated", "weightSync": "cudaIpc"}),
        Assumptions(prompt_tokens=0, acceptance=0.5, tokens_per_episode=1000, proposer_seconds=0),
        ROUND,
    )
    # its own measured sync and sleep/wake (x N / N_measured = 2), everything else as the folder sync's
    assert ipc.step["sync"] == pytest.approx(0.5) and ipc.step["sleepWake"] == pytest.approx(1)
    assert ipc.step["generation"] == colocated.step["generation"] and ipc.step["sft"] == colocated.step["sft"]
    assert ipc.step["wall"] == pytest.approx(16 + 0.5 + 2 + 1)
    assert any("weightSync cudaIpc: sync 0.50 s a step" in a for a in ipc.assumptions)
    assert any("sleep/wake 1.0 s a step" in a for a in ipc.assumptions)
    awake = estimate(
        PLAN,
        small_spec(inference={"backend": "vllm", "placement": "colocated", "sleepLevel": 0}),
        Assumptions(prompt_tokens=0, acceptance=0.5, tokens_per_episode=1000, proposer_seconds=0),
        ROUND,
    )
    # sleepLevel 0: the server never sleeps, so no step pays a sleep and a wake
    assert awake.step["sleepWake"] == 0 and awake.step["wall"] == pytest.approx(16 + 6 + 2)
    assert any("stays awake through SFT (sleepLevel 0" in a for a in awake.assumptions)
    wide = estimate(
        PLAN,
        small_spec(inference={"backend": "vllm", "placement": "colocated", "tensorParallelSize": 2}),
        Assumptions(prompt_tokens=0, acceptance=0.5),
        ROUND,
    )
    assert wide.step["generation"] == pytest.approx(8 * 1000 / (500 * 2)) and wide.weight.gpus == 2
    assert (wide.harness.gpus, wide.evaluation.gpus) == (2, 2)
    separate = estimate(PLAN, small_spec(), Assumptions(prompt_tokens=0, acceptance=0.5), ROUND)
    assert separate.step["sleepWake"] == 0 and separate.weight.gpus == 3
    local = estimate(PLAN, small_spec(inference={"backend": "transformers"}), Assumptions(prompt_tokens=0), ROUND)
    assert local.placement is Placement.IN_PROCESS and local.step["sync"] == 0
    assert local.step["generation"] == pytest.approx(8 * 1000 / (50 * 2))  # the transformers rate, scaled


@pytest.mark.parametrize(
    ("name", "n"),
    [
        ("Qwen/Qwen3.5-2B", 2e9),
        ("HuggingFaceTB/SmolLM2-135M-Instruct", 135e6),
        ("Qwen/Qwen3-1.7B", 1.7e9),
        ("Qwen/Qwen3-30B-A3B", 3e9),
        ("/opt/whale/models/synthetic-tiny", None),
    ],
)
def test_the_parameter_count_comes_from_the_model_name(name, n):
    assert parameters_from_name(name) == n


def test_an_unknown_size_is_refused_naming_the_field_and_the_fix():
    with pytest.raises(CostError, match=r"spec.experiment.model.name: .* --parameters"):
        estimate(PLAN, small_spec(model={"name": "/models/mine"}), Assumptions(), ROUND)
    est = estimate(PLAN, small_spec(model={"name": "/models/mine"}), Assumptions(parameters=1e9), ROUND)
    assert est.parameters == 1e9


def resolve_path(obj, path):
    for part in path:
        obj = obj[part]
    return obj


@pytest.mark.parametrize("name", sorted(H200.all()))
def test_every_figure_is_the_value_in_its_raw_json(name):
    f = H200.all()[name]
    raw = json.loads((RESULTS / f.source).read_text())
    # computed from the JSON as the figure says: the value at path, plus the ones at plus, minus the ones at minus
    expected = (resolve_path(raw, f.path) + sum(resolve_path(raw, p) for p in f.plus)) - sum(
        resolve_path(raw, p) for p in f.minus
    )
    stated = resolve_path(raw, f.parameters_path) if f.parameters_path is not None else f.parameters
    assert (f.value, f.parameters) == (expected, stated), (
        f"{name} does not match benchmarks/results/{f.source}: its value there is {expected!r} at "
        f"{stated!r} parameters"
        + (
            f"; write: checkpoint_snapshot_s=async_snapshot_figure({f.source!r}, {expected!r}, {stated!r})"
            if name == "checkpoint_snapshot_s"
            else ""
        )
    )
    assert f.read(raw) == f.value


def test_the_derived_figures_read_what_they_say():
    """sleep/wake is colocated minus separate at the ordinary step 2; the snapshot is the async writer's."""
    sleep_wake = H200.colocated_sleep_wake_s
    raw = json.loads((RESULTS / sleep_wake.source).read_text())
    assert [arm["arm"] for arm in raw["arms"]] == ["colocated", "separate"]
    assert all(arm["steps"][1]["step"] == 2 and arm["meta"]["model"] == "qwen3-1.7b" for arm in raw["arms"])
    assert {sleep_wake.path[1], *(p[1] for p in sleep_wake.plus)} == {0}
    assert {p[1] for p in sleep_wake.minus} == {1}
    assert 0 < sleep_wake.value == pytest.approx((10.76 + 7.43) - (3.92 + 4.48), abs=0.01)
    snapshot = H200.checkpoint_snapshot_s
    raw = json.loads((RESULTS / snapshot.source).read_text())
    assert raw["results"][1]["variant"] == "async" and snapshot.path == ("results", 1, "blocked_median_s")
    assert snapshot.value == statistics.median(raw["results"][1]["blocked_s"])


def test_the_doc_table_is_what_the_code_prints():
    doc = cost_table.DOC.read_text()
    assert cost_table.doc_table(doc) == cost_table.example_table(), (
        "docs/performance.md's cost table is stale: .venv/bin/python -m whale.console.cost_table --write"
    )


def test_plan_prints_the_cost_with_its_assumptions_and_gives_it_in_json():
    path = ROOT / "manifests" / "examples" / "math-whale.yaml"
    res = CliRunner().invoke(app, ["plan", str(path), "--tokens-per-episode", "2000", "--acceptance", "0.5"])
    assert res.exit_code == 0, res.output
    text = " ".join(res.output.split())
    assert "GPU-hours" in text and "tokens generated per episode: 2,000 (given)" in text
    assert "rollouts kept for SFT: 50%" in text and "2B (from the model name 'Qwen/Qwen3.5-2B')" in text
    res = CliRunner().invoke(app, ["plan", str(path), "-o", "json"])
    cost = json.loads(res.output)["cost"]
    assert cost["gpus"] == {"train": 8, "inference": 1} and cost["upperBound"] is True
    assert cost["total"]["gpuHours"] == pytest.approx(
        cost["weight"]["gpuHours"] + cost["harness"]["gpuHours"] + cost["evaluation"]["gpuHours"]
    )


def test_plan_of_a_colocated_run_prints_its_sleep_wake_and_its_checkpoints(tmp_path):
    text = (ROOT / "manifests" / "examples" / "math-whale.yaml").read_text()
    separate = "    inference:\n      backend: vllm\n"
    assert text.count(separate) == 1
    colocated = text.replace(separate, separate + "      placement: colocated\n")
    path = tmp_path / "colocated.yaml"
    path.write_text(colocated)
    res = CliRunner().invoke(app, ["plan", str(path)])
    assert res.exit_code == 0, res.output
    out = " ".join(res.output.split())
    assert "placement: colocated; a weight phase holds the 8 trainer GPUs only" in out
    # 9.78 s measured at 1.72 B, x 2 B / 1.72 B
    assert "sleep/wake 11.4 s a step" in out and "+ sleep/wake 11.4;" in out
    assert "asyncCheckpoint: the host snapshot" in out
    cost = json.loads(CliRunner().invoke(app, ["plan", str(path), "-o", "json"]).output)["cost"]
    assert cost["gpus"] == {"train": 8, "inference": 1} and cost["weight"]["gpus"] == 8
    assert cost["rsftStepSeconds"]["sleepWake"] == pytest.approx(H200.colocated_sleep_wake_s.value * 2e9 / 1720574976)


def test_plan_of_a_model_without_a_size_says_why_there_is_no_cost():
    path = ROOT / "manifests" / "examples" / "tiny-cpu.yaml"
    res = CliRunner().invoke(app, ["plan", str(path)])
    assert res.exit_code == 0, res.output
    assert "cost: not estimated: spec.experiment.model.name" in " ".join(res.output.split())
    res = CliRunner().invoke(app, ["plan", str(path), "--acceptance", "2"])
    assert res.exit_code != 0 and "acceptance" in res.output
