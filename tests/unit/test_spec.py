"""The WhaleRun spec: the paper's defaults, and errors that name the field and what is allowed."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from whale.core.convert import convert_v1alpha1
from whale.core.spec import Condition, Resources, SecretKeyRef, WhaleRunSpec
from whale.manifest import ManifestError, format_validation_error, parse_document
from whale_operator.cluster_spec import ClusterRunSpec, Toleration


def doc(spec: dict, name: str = "run-1") -> dict:
    return convert_v1alpha1(
        {"apiVersion": "whale.dev/v1alpha1", "kind": "WhaleRun", "metadata": {"name": name}, "spec": spec}
    )


BASE = {
    "domain": "counting",
    "condition": "whale",
    "model": {"name": "Qwen/Qwen3.5-2B"},
    "schedule": {"totalEpochs": 4, "weightEpochsPerCycle": 0.6},
}


def problems_of(spec: dict, name: str = "run-1") -> list[str]:
    with pytest.raises(ManifestError) as info:
        parse_document(doc(spec, name), check_domain=False)
    return info.value.problems


def test_defaults_are_the_papers():
    s = WhaleRunSpec.model_validate(BASE)
    assert (
        s.experiment.rsft.prompts_per_step,
        s.experiment.rsft.rollouts_per_prompt,
        s.experiment.rsft.score_threshold,
    ) == (256, 8, 0.5)
    assert (
        s.experiment.rsft.sft_epochs,
        s.experiment.rsft.mini_batch_size,
        s.experiment.rsft.micro_batch_size_per_gpu,
    ) == (1, 64, 2)
    assert (
        s.experiment.rsft.sampling.temperature,
        s.experiment.rsft.sampling.top_p,
        s.experiment.rsft.sampling.top_k,
    ) == (1.0, 1.0, 20)
    assert (s.experiment.harness_search.proposals_per_iteration, s.experiment.harness_search.rollouts_per_item) == (
        3,
        1,
    )
    assert s.experiment.harness_search.prompt_only is False
    assert (s.experiment.evaluation.samples_per_item, s.experiment.evaluation.temperature) == (8, 1.0)
    assert s.experiment.schedule.harness_iterations_per_cycle == 6 and s.experiment.schedule.max_cycles == 30
    ah = s.experiment.schedule.adaptive.harness
    assert (ah.min_iterations, ah.patience, ah.max_iterations) == (6, 2, 15)
    assert s.condition is Condition.WHALE


def test_round_trip_wire_names():
    s = WhaleRunSpec.model_validate(BASE)
    wire = s.to_wire()
    assert (
        wire["experiment"]["schedule"]["weightEpochsPerCycle"] == 0.6 and "promptsPerStep" in wire["experiment"]["rsft"]
    )
    assert WhaleRunSpec.model_validate(wire) == s


@pytest.mark.parametrize(
    ("patch", "expected"),
    [
        ({"condition": "bogus"}, "spec.condition: must be one of: 'rsft_only', 'mh_only', 'whale' or 'adaptive_whale'"),
        (
            {"schedule": {"totalSteps": -3, "weightStepsPerCycle": 1}},
            "spec.experiment.schedule.totalSteps: Input should be greater than or equal to 1",
        ),
        (
            {"schedule": {"totalSteps": 10, "weightStepsPerCycle": 2, "harnessIterationsPerCycle": 0}},
            "spec.experiment.schedule.harnessIterationsPerCycle: Input should be greater than or equal to 1",
        ),
        (
            {"schedule": {"totalSteps": 10, "totalEpochs": 1, "weightStepsPerCycle": 2}},
            "give totalEpochs or totalSteps, not both",
        ),
        ({"condition": "mh_only"}, "mh_only never trains weights"),
        ({"schedule": {"weightStepsPerCycle": 3}}, "needs a weight budget"),
        ({"schedule": {"totalSteps": 10}}, "condition whale needs E"),
        ({"condition": "rsft_only"}, "never apply to rsft_only"),
        (
            {"rsft": {"promptsPerStep": 0}},
            "spec.experiment.rsft.promptsPerStep: Input should be greater than or equal to 1",
        ),
        (
            {"rsft": {"miniBatchSize": 2, "microBatchSizePerGpu": 4}},
            "microBatchSizePerGpu (4) must be <= miniBatchSize (2)",
        ),
        (
            {
                "schedule": {
                    "totalSteps": 9,
                    "weightStepsPerCycle": 3,
                    "adaptive": {"harness": {"minIterations": 9, "maxIterations": 3}},
                }
            },
            "maxIterations (3 proposer iterations, 4 with the incoming evaluation) must allow minIterations (9",
        ),
        ({"rsft": {"promptsPerStepp": 3}}, "spec.experiment.rsft.promptsPerStepp: unknown field"),
        ({"harnessSearch": {"proposer": {"backend": "cli"}}}, "backend 'cli' needs `command`"),
        ({"inference": {"backend": "vllm", "weightSync": "cudaIpc"}}, "set placement colocated, or weightSync auto"),
        (
            {"inference": {"placement": "colocated", "weightSync": "cudaIpc", "tensorParallelSize": 2}},
            "tensorParallelSize is 2",
        ),
        (
            {"inference": {"weightSync": "nccl"}},
            "spec.execution.inference.weightSync: must be one of: 'auto' or 'cudaIpc'",
        ),
    ],
)
def test_errors_name_the_field(patch, expected):
    spec = {**BASE, **patch}
    found = problems_of(spec)
    assert any(expected in p for p in found), found


def test_cuda_ipc_weight_sync_is_a_colocated_option():
    spec = WhaleRunSpec.model_validate(
        {**BASE, "inference": {"backend": "vllm", "placement": "colocated", "weightSync": "cudaIpc"}}
    )
    assert spec.execution.inference.weight_sync == "cudaIpc"
    assert WhaleRunSpec.model_validate(BASE).execution.inference.weight_sync == "auto"


def test_every_problem_is_listed_and_the_envelope_checked():
    bad = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "Bad_Name"},
        "spec": {**BASE, "condition": "nope", "rsft": {"learningRate": -1}},
    }
    with pytest.raises(ManifestError) as info:
        parse_document(bad, check_domain=False)
    text = "\n".join(info.value.problems)
    for needle in (
        "apiVersion: must be whale.dev/v1alpha2",
        "kind: must be WhaleRun",
        "metadata.name",
        "spec.condition",
        "spec.experiment.rsft.learningRate",
    ):
        assert needle in text


def test_unknown_domain_lists_the_registered_ones(counting_domain):
    with pytest.raises(ManifestError) as info:
        parse_document(doc({**BASE, "domain": "chesss"}))
    assert any("spec.domain: unknown domain 'chesss'" in p and "counting" in p for p in info.value.problems)


def test_validation_error_paths_use_wire_names():
    with pytest.raises(ValidationError) as info:
        WhaleRunSpec.model_validate({**BASE, "evaluation": {"samplesPerItem": 0}})
    assert format_validation_error(info.value) == [
        "spec.experiment.evaluation.samplesPerItem: Input should be greater than or equal to 1"
    ]


@pytest.mark.parametrize(
    ("patch", "expected"),
    [
        (
            {"schedule": {"totalSteps": True, "weightStepsPerCycle": 1}},
            "spec.experiment.schedule.totalSteps: must be an integer",
        ),
        (
            {"schedule": {"totalSteps": 10.0, "weightStepsPerCycle": 1}},
            "spec.experiment.schedule.totalSteps: must be an integer",
        ),
        (
            {"schedule": {"totalEpochs": float("inf"), "weightEpochsPerCycle": 0.6}},
            "spec.experiment.schedule.totalEpochs: must be a finite number",
        ),
        (
            {"schedule": {"totalSteps": 10**6 + 1, "weightStepsPerCycle": 1}},
            "spec.experiment.schedule.totalSteps: Input should be less than or equal to 1000000",
        ),
        ({"rsft": {"scoreThreshold": 1}}, "spec.experiment.rsft.scoreThreshold: Input should be less than 1"),
        (
            {"rsft": {"scoreThreshold": -0.01}},
            "spec.experiment.rsft.scoreThreshold: Input should be greater than or equal to 0",
        ),
        ({"rsft": {"scoreThreshold": float("nan")}}, "spec.experiment.rsft.scoreThreshold: must be a finite number"),
        ({"rsft": {"sampling": {"temperature": 11}}}, "spec.experiment.rsft.sampling.temperature"),
        (
            {"rsft": {"seed": 2**63}},
            "spec.experiment.rsft.seed: Input should be less than or equal to 9223372036854775807",
        ),
        ({"suspend": 1}, "spec.execution.suspend: must be true or false (got 1)"),
        ({"model": {"name": ""}}, "spec.experiment.model.name: String should have at least 1 character"),
    ],
)
def test_bounds_and_strict_types_name_the_field(patch, expected):
    found = problems_of({**BASE, **patch})
    assert any(expected in p for p in found), found


CLUSTER_ERRORS = [
    (
        {"tolerations": [{"operator": "Equal", "value": "x"}]},
        "spec.cluster.tolerations[0]: a toleration without a key must have operator Exists",
    ),
    (
        {"tolerations": [{"key": "k", "operator": "Exists", "value": "x"}]},
        "spec.cluster.tolerations[0]: value must be empty when operator is Exists",
    ),
    ({"queueName": "Team A"}, "spec.cluster.queueName: must be a Kubernetes object name"),
    ({"nodeSelector": {"gpu type": "h200"}}, "spec.cluster.nodeSelector.gpu type (the key)"),
    ({"maxEviction": 3}, "spec.cluster.maxEviction: unknown field"),
]


@pytest.mark.parametrize(("cluster", "expected"), CLUSTER_ERRORS)
def test_the_core_keeps_the_cluster_section_as_written_and_the_operators_model_names_its_field(cluster, expected):
    """The core never reads ``cluster`` (kept verbatim, compared with the rest); the operator's model
    (whale_operator.cluster_spec) refuses a bad one, naming ``spec.cluster.<field>`` and what is allowed."""
    spec = WhaleRunSpec.model_validate({**BASE, "cluster": cluster})
    assert spec.cluster == cluster and spec.to_wire()["cluster"] == cluster
    assert spec != spec.model_copy(update={"cluster": {}})
    with pytest.raises(ValidationError) as info:
        ClusterRunSpec.of(spec)
    assert any(expected in p for p in format_validation_error(info.value)), format_validation_error(info.value)


def test_floats_take_integers_and_defaults_are_in_bounds():
    s = WhaleRunSpec.model_validate(
        {
            **BASE,
            "schedule": {"totalEpochs": 4, "weightEpochsPerCycle": 1},
            "evaluation": {"temperature": 1},
            "rsft": {"scoreThreshold": 0},
        }
    )
    assert (
        s.experiment.schedule.total_epochs == 4.0
        and s.experiment.evaluation.temperature == 1.0
        and s.experiment.rsft.score_threshold == 0.0
    )


@pytest.mark.parametrize("quantity", ["8", "500m", "32Gi", "1.5", "2e3", "+1", ".5", "100Mi", "1E"])
def test_kubernetes_quantities_are_accepted(quantity):
    assert Resources(requests={"cpu": quantity}).requests["cpu"] == quantity


@pytest.mark.parametrize("quantity", ["-1", "lots", "1.5.5", "Gi", "", "1 Gi", "1Gi\n", "1e", "0x10", "1Gb"])
def test_garbage_quantities_are_refused(quantity):
    with pytest.raises(ValidationError, match="pattern|at least 1 character"):
        Resources(limits={"memory": quantity})


@pytest.mark.parametrize("env", ["WHALE_PROPOSER_API_KEY", "OPENAI_API_KEY", "ANTHROPIC_API_KEY", "_KEY", "key2"])
def test_plain_variable_names_hold_a_secret(env):
    assert SecretKeyRef(name="s", key="k", env=env).env == env


@pytest.mark.parametrize(
    "env",
    [
        "LD_PRELOAD",
        "ld_library_path",
        "DYLD_INSERT_LIBRARIES",
        "PYTHONPATH",
        "PYTHONSTARTUP",
        "PATH",
        "HOME",
        "BASH_ENV",
        "ENV",
        "http_proxy",
        "NO_PROXY",
        "SSL_CERT_FILE",
        "REQUESTS_CA_BUNDLE",
        "AWS_SECRET_ACCESS_KEY",
        "WHALE_RUN",
        "NODE_OPTIONS",
        "JAVA_TOOL_OPTIONS",
        "KUBERNETES_SERVICE_HOST",
        "1KEY",
        "KEY-1",
        "KEY\n",
        "",
    ],
)
def test_dangerous_or_malformed_variable_names_are_refused(env):
    with pytest.raises(ValidationError):
        SecretKeyRef(name="s", key="k", env=env)


def test_toleration_rules_are_the_api_servers():
    assert Toleration(operator="Exists").operator == "Exists"
    assert Toleration(key="k", operator="Equal", value="v", effect="NoExecute", toleration_seconds=30).value == "v"
    with pytest.raises(ValidationError, match="only to effect NoExecute"):
        Toleration(key="k", operator="Exists", effect="NoSchedule", toleration_seconds=30)


@pytest.mark.parametrize("name", ["1run", "run-1\n", "r" * 46, "Run", "run_1"])
def test_run_names_follow_the_operators_rule(name):
    assert any(p.startswith("metadata.name:") for p in problems_of(BASE, name=name))


def test_a_run_name_that_is_not_a_string_is_named():
    assert "metadata.name: must be a string, got 123" in problems_of(BASE, name=123)


def test_namespace_is_checked():
    bad = {**doc(BASE), "metadata": {"name": "run-1", "namespace": "Team A"}}
    with pytest.raises(ManifestError) as info:
        parse_document(bad, check_domain=False)
    assert any(p.startswith("metadata.namespace: 'Team A' is not a namespace name") for p in info.value.problems)
