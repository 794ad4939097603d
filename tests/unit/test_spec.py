"""The WhaleRun spec: the paper's defaults, and errors that name the field and what is allowed."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from whale.manifest import ManifestError, format_validation_error, parse_document
from whale.spec import Condition, WhaleRunSpec


def doc(spec: dict, name: str = "run-1") -> dict:
    return {"apiVersion": "whale.dev/v1alpha1", "kind": "WhaleRun", "metadata": {"name": name}, "spec": spec}


BASE = {"domain": "counting", "condition": "whale", "model": {"name": "Qwen/Qwen3.5-2B"},
        "schedule": {"totalEpochs": 4, "weightEpochsPerCycle": 0.6}}


def problems_of(spec: dict, name: str = "run-1") -> list[str]:
    with pytest.raises(ManifestError) as info:
        parse_document(doc(spec, name), check_domain=False)
    return info.value.problems


def test_defaults_are_the_papers():
    s = WhaleRunSpec.model_validate(BASE)
    assert (s.rsft.prompts_per_step, s.rsft.rollouts_per_prompt, s.rsft.score_threshold) == (256, 8, 0.5)
    assert (s.rsft.sft_epochs, s.rsft.mini_batch_size, s.rsft.micro_batch_size_per_gpu) == (1, 64, 2)
    assert (s.rsft.sampling.temperature, s.rsft.sampling.top_p, s.rsft.sampling.top_k) == (1.0, 1.0, 20)
    assert (s.harness_search.proposals_per_iteration, s.harness_search.rollouts_per_item) == (3, 1)
    assert s.harness_search.prompt_only is False
    assert (s.evaluation.samples_per_item, s.evaluation.temperature) == (8, 1.0)
    assert s.schedule.harness_iterations_per_cycle == 6 and s.schedule.max_cycles == 30
    ah = s.schedule.adaptive.harness
    assert (ah.min_iterations, ah.patience, ah.max_iterations) == (6, 2, 15)
    assert s.condition is Condition.WHALE


def test_round_trip_wire_names():
    s = WhaleRunSpec.model_validate(BASE)
    wire = s.to_wire()
    assert wire["schedule"]["weightEpochsPerCycle"] == 0.6 and "promptsPerStep" in wire["rsft"]
    assert WhaleRunSpec.model_validate(wire) == s


@pytest.mark.parametrize(
    ("patch", "expected"),
    [
        ({"condition": "bogus"}, "spec.condition: must be one of: 'rsft_only', 'mh_only', 'whale' or 'adaptive_whale'"),
        ({"schedule": {"totalSteps": -3, "weightStepsPerCycle": 1}}, "spec.schedule.totalSteps: Input should be greater than or equal to 1"),
        ({"schedule": {"totalSteps": 10, "weightStepsPerCycle": 2, "harnessIterationsPerCycle": 0}},
         "spec.schedule.harnessIterationsPerCycle: Input should be greater than or equal to 1"),
        ({"schedule": {"totalSteps": 10, "totalEpochs": 1, "weightStepsPerCycle": 2}}, "give totalEpochs or totalSteps, not both"),
        ({"condition": "mh_only"}, "mh_only never trains weights"),
        ({"schedule": {"weightStepsPerCycle": 3}}, "needs a weight budget"),
        ({"schedule": {"totalSteps": 10}}, "condition whale needs E"),
        ({"condition": "rsft_only"}, "never apply to rsft_only"),
        ({"rsft": {"promptsPerStep": 0}}, "spec.rsft.promptsPerStep: Input should be greater than or equal to 1"),
        ({"rsft": {"miniBatchSize": 2, "microBatchSizePerGpu": 4}}, "microBatchSizePerGpu (4) must be <= miniBatchSize (2)"),
        ({"schedule": {"totalSteps": 9, "weightStepsPerCycle": 3, "adaptive": {"harness": {"minIterations": 9, "maxIterations": 3}}}},
         "maxIterations (3) must be >= minIterations (9)"),
        ({"rsft": {"promptsPerStepp": 3}}, "spec.rsft.promptsPerStepp: unknown field"),
        ({"harnessSearch": {"proposer": {"backend": "cli"}}}, "backend 'cli' needs `command`"),
    ],
)
def test_errors_name_the_field(patch, expected):
    spec = {**BASE, **patch}
    found = problems_of(spec)
    assert any(expected in p for p in found), found


def test_every_problem_is_listed_and_the_envelope_checked():
    bad = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "Bad_Name"},
           "spec": {**BASE, "condition": "nope", "rsft": {"learningRate": -1}}}
    with pytest.raises(ManifestError) as info:
        parse_document(bad, check_domain=False)
    text = "\n".join(info.value.problems)
    for needle in ("apiVersion: must be whale.dev/v1alpha1", "kind: must be WhaleRun", "metadata.name",
                   "spec.condition", "spec.rsft.learningRate"):
        assert needle in text


def test_unknown_domain_lists_the_registered_ones(counting_domain):
    with pytest.raises(ManifestError) as info:
        parse_document(doc({**BASE, "domain": "chesss"}))
    assert any("spec.domain: unknown domain 'chesss'" in p and "counting" in p for p in info.value.problems)


def test_validation_error_paths_use_wire_names():
    with pytest.raises(ValidationError) as info:
        WhaleRunSpec.model_validate({**BASE, "evaluation": {"samplesPerItem": 0}})
    assert format_validation_error(info.value) == [
        "spec.evaluation.samplesPerItem: Input should be greater than or equal to 1"]
