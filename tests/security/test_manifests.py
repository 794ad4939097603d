"""Hostile manifests (issue #12): each gets a clear error naming what to fix, exit code 1, no traceback,
in bounded time and memory; and what the CRD's schema can express, the API server refuses as well.

The spec author is trusted, but a manifest is typed by a person and passed around: a typo, a file saved
in the wrong encoding or a pasted YAML bomb must be refused by `whale validate`, not crash it, hang it or
ask a controller for unbounded memory.
"""

from __future__ import annotations

import copy
import json
import os
import re
import subprocess
import sys
import tracemalloc
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml
from typer.testing import CliRunner

from whale.cli import app
from whale.core import layout
from whale.core.convert import convert_v1alpha1
from whale.core.spec import INT64_MAX, MAX_CYCLES, MAX_STEPS, PROPOSER_KEY_ENV
from whale.manifest import MAX_MANIFEST_BYTES, MAX_NODES, ManifestError, load_manifest
from whale_operator.crd import crd

ROOT = Path(__file__).resolve().parents[2]
SHIPPED_DOMAINS = ("chess_puzzles", "math_reasoning", "search_qa", "synthetic")
cli = CliRunner()

BASE_SPEC: dict[str, Any] = {
    "domain": "counting",
    "condition": "whale",
    "model": {"name": "tiny"},
    "schedule": {"totalSteps": 10, "weightStepsPerCycle": 4, "harnessIterationsPerCycle": 2},
    "harnessSearch": {"proposer": {"baseUrl": "http://127.0.0.1:8000/v1", "model": "local-proposer"}},
}


def document(spec: dict[str, Any] | None = None, name: Any = "run-1") -> dict[str, Any]:
    return convert_v1alpha1(
        {
            "apiVersion": "whale.dev/v1alpha1",
            "kind": "WhaleRun",
            "metadata": {"name": name},
            "spec": copy.deepcopy(BASE_SPEC if spec is None else spec),
        }
    )


def patched(path: str, value: Any) -> dict[str, Any]:
    """BASE_SPEC with ``value`` at the dotted camelCase ``path`` (mappings created on the way)."""
    spec = copy.deepcopy(BASE_SPEC)
    *parents, leaf = path.split(".")
    node = spec
    for key in parents:
        node = node.setdefault(key, {})
    node[leaf] = value
    return spec


@pytest.fixture(autouse=True)
def _plugin(counting_domain):
    return counting_domain


# ----- the CRD side ---------------------------------------------------------------------------------


def _strict_pattern(validator, pattern, instance, schema):
    """JSON Schema ``pattern`` as the API server (Go RE2) reads it: ``$`` is the end of the text.
    Python's ``re`` would also let ``$`` match before a trailing newline."""
    if isinstance(instance, str):
        translated = re.sub(r"(?<!\\)\$$", r"\\Z", pattern) if pattern.endswith("$") else pattern
        if not re.search(translated, instance):
            yield jsonschema.ValidationError(f"{instance!r} does not match {pattern!r}")


CRDValidator = jsonschema.validators.extend(jsonschema.Draft4Validator, {"pattern": _strict_pattern})
SCHEMA = crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]


def crd_errors(doc: dict[str, Any]) -> list[str]:
    """What the CRD's OpenAPI schema says about ``doc`` (CEL rules are the API server's to evaluate)."""
    return [f"{'.'.join(str(p) for p in e.absolute_path)}: {e.message}" for e in CRDValidator(SCHEMA).iter_errors(doc)]


def cel_messages(node: Any) -> list[str]:
    if isinstance(node, dict):
        found = [r["message"] for r in node.get("x-kubernetes-validations", [])]
        return found + [m for v in node.values() for m in cel_messages(v)]
    if isinstance(node, list):
        return [m for v in node for m in cel_messages(v)]
    return []


def test_the_base_document_is_valid_both_ways(tmp_path):
    """The control: every rejection below is the hostile part's doing."""
    path = tmp_path / "ok.yaml"
    path.write_text(yaml.safe_dump(document()))
    res = cli.invoke(app, ["validate", str(path)])
    assert res.exit_code == 0, res.output
    assert crd_errors(document()) == []


# ----- the cases ------------------------------------------------------------------------------------

#: the CRD cannot say it: why (a file-level problem, a cross-field rule over the data, ...)
NOT_IN_SCHEMA = "not-in-schema"


@dataclass(frozen=True)
class Case:
    id: str
    #: the file's bytes (file-level attacks) or a spec to dump as YAML
    content: bytes | dict[str, Any]
    #: what the message must say (the field path, or where in the file)
    expect: str
    #: "reject": the CRD schema refuses it too; "cel:<message>": a CEL rule the API server evaluates says
    #: it; otherwise the reason the schema cannot express it
    crd: str = "reject"
    extra: dict[str, Any] = field(default_factory=dict)


def spec_case(id: str, path: str, value: Any, expect: str | None = None, crd: str = "reject") -> Case:
    return Case(id, document(patched(path, value)), expect or f"spec.{path}", crd)


def raw(text: str) -> bytes:
    return text.encode()


GOOD_YAML = yaml.safe_dump(document())
BILLION_LAUGHS = "a: &a [x, x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"{chr(98 + i)}: &{chr(98 + i)} [{', '.join(['*' + chr(97 + i)] * 10)}]\n" for i in range(8)
)
DEEP = "spec: " + "[" * 3000 + "]" * 3000 + "\n"
DEEP_BLOCK = "spec:\n" + "".join("  " * i + f"k{i}:\n" for i in range(1, 200)) + "  " * 200 + "x: 1\n"

CASES = [
    # --- numbers that break arithmetic or memory
    spec_case(
        "inf-epochs", "schedule.totalEpochs", float("inf"), "spec.experiment.schedule.totalEpochs: must be a finite"
    ),
    Case(
        "inf-epochs-yaml",
        raw(GOOD_YAML.replace("totalSteps: 10", "totalEpochs: .inf")),
        "spec.experiment.schedule.totalEpochs: must be a finite",
        crd="JSON has no infinity: kubectl cannot send it",
    ),
    spec_case(
        "total-steps-1e12-float", "schedule.totalSteps", 1e12, "spec.experiment.schedule.totalSteps: must be an integer"
    ),
    spec_case(
        "total-steps-1e12", "schedule.totalSteps", 10**12, "spec.experiment.schedule.totalSteps: Input should be less"
    ),
    spec_case("total-steps-3e7", "schedule.totalSteps", 30_000_000, f"less than or equal to {MAX_STEPS}"),
    Case(
        "evaluation-every-step-at-the-bound",
        document(
            {
                **BASE_SPEC,
                "condition": "rsft_only",
                "schedule": {"totalSteps": MAX_STEPS},
                "evaluation": {"intervalSteps": 1},
            }
        ),
        "spec.experiment.evaluation.intervalSteps: an evaluation every 1 step(s) over 1000000 steps",
        crd="a count over the domain's data: decide() fails the run with InvalidSchedule on a cluster",
    ),
    spec_case("inf-learning-rate", "rsft.learningRate", float("inf"), "spec.experiment.rsft.learningRate"),
    spec_case("huge-learning-rate", "rsft.learningRate", 1e6, "spec.experiment.rsft.learningRate"),
    spec_case(
        "inf-temperature", "rsft.sampling.temperature", float("inf"), "spec.experiment.rsft.sampling.temperature"
    ),
    spec_case("huge-eval-temperature", "evaluation.temperature", 1e9, "spec.experiment.evaluation.temperature"),
    spec_case(
        "nan-threshold",
        "rsft.scoreThreshold",
        float("nan"),
        "spec.experiment.rsft.scoreThreshold: must be a finite",
        crd="JSON has no NaN: kubectl cannot send it (and NaN compares false with every bound)",
    ),
    spec_case("threshold-keeps-nothing", "rsft.scoreThreshold", 1.0, "spec.experiment.rsft.scoreThreshold"),
    spec_case("threshold-keeps-errors", "rsft.scoreThreshold", -0.5, "spec.experiment.rsft.scoreThreshold"),
    spec_case(
        "bool-total-steps", "schedule.totalSteps", True, "spec.experiment.schedule.totalSteps: must be an integer"
    ),
    spec_case(
        "string-total-steps", "schedule.totalSteps", "10", "spec.experiment.schedule.totalSteps: must be an integer"
    ),
    spec_case("bool-from-string", "suspend", "yes", "spec.execution.suspend: must be true or false"),
    spec_case("int-past-int64", "rsft.seed", INT64_MAX + 1, "spec.experiment.rsft.seed"),
    spec_case("int-past-int64-data", "data.seed", -(2**70), "spec.experiment.data.seed"),
    spec_case("huge-max-cycles", "schedule.maxCycles", MAX_CYCLES + 1, "spec.experiment.schedule.maxCycles"),
    spec_case("huge-rollouts", "rsft.rolloutsPerPrompt", 10**9, "spec.experiment.rsft.rolloutsPerPrompt"),
    spec_case(
        "huge-timeout",
        "harnessSearch.candidateTimeoutSeconds",
        10**12,
        "spec.experiment.harnessSearch.candidateTimeoutSeconds",
    ),
    spec_case("huge-concurrency", "inference.maxConcurrency", 10**9, "spec.execution.inference.maxConcurrency"),
    # --- Kubernetes values
    spec_case(
        "garbage-quantity",
        "cluster.workerResources",
        {"requests": {"cpu": "lots"}},
        "spec.cluster.workerResources.requests.cpu: must be a Kubernetes quantity",
    ),
    spec_case(
        "negative-quantity",
        "train.resources",
        {"limits": {"memory": "-4Gi"}},
        "spec.execution.train.resources.limits.memory: must be a Kubernetes quantity",
    ),
    spec_case(
        "quantity-with-newline",
        "cluster.inferenceResources",
        {"requests": {"memory": "4Gi\n"}},
        "spec.cluster.inferenceResources.requests.memory",
    ),
    spec_case("garbage-cache-size", "cluster.modelCacheSize", "big", "spec.cluster.modelCacheSize"),
    spec_case(
        "garbage-resource-name",
        "cluster.workerResources",
        {"requests": {"cpu; rm -rf": "1"}},
        "spec.cluster.workerResources.requests.cpu; rm -rf (the key): must be a qualified name",
        crd="cel:every key must be a qualified name",
    ),
    spec_case(
        "ld-preload",
        "harnessSearch.proposer.apiKeySecret",
        {"name": "proposer", "key": "api-key", "env": "LD_PRELOAD"},
        "spec.experiment.harnessSearch.proposer.apiKeySecret.env: 'LD_PRELOAD' would put the Secret's value",
    ),
    spec_case(
        "pythonpath-lowercase",
        "harnessSearch.proposer.apiKeySecret",
        {"name": "proposer", "key": "api-key", "env": "pythonpath"},
        "apiKeySecret.env: 'pythonpath'",
    ),
    spec_case(
        "https-proxy",
        "harnessSearch.proposer.apiKeySecret",
        {"name": "proposer", "key": "api-key", "env": "HTTPS_PROXY"},
        "apiKeySecret.env: 'HTTPS_PROXY'",
    ),
    spec_case(
        "whale-control-variable",
        "harnessSearch.proposer.apiKeySecret",
        {"name": "proposer", "key": "api-key", "env": "WHALE_S3_ENDPOINT"},
        "apiKeySecret.env: 'WHALE_S3_ENDPOINT'",
        crd="cel:WHALE_ variables are the workloads' own",
    ),
    spec_case(
        "env-not-a-name",
        "harnessSearch.proposer.apiKeySecret",
        {"name": "proposer", "key": "api-key", "env": "A=B C"},
        "apiKeySecret.env: must be an environment variable name",
    ),
    spec_case(
        "secret-name",
        "harnessSearch.proposer.apiKeySecret",
        {"name": "Proposer_Key", "key": "k"},
        "apiKeySecret.name: must be a Kubernetes object name",
    ),
    spec_case(
        "secret-key",
        "harnessSearch.proposer.apiKeySecret",
        {"name": "proposer", "key": "../etc"},
        "apiKeySecret.key: must be a Secret key",
    ),
    spec_case("service-account", "cluster.serviceAccountName", "default\nx", "spec.cluster.serviceAccountName"),
    spec_case("priority-class", "cluster.priorityClassName", "High", "spec.cluster.priorityClassName"),
    spec_case("queue-name-too-long", "cluster.queueName", "q" * 64, "spec.cluster.queueName"),
    spec_case(
        "credentials-secret", "storage.credentialsSecret", "s3 creds", "spec.execution.storage.credentialsSecret"
    ),
    spec_case(
        "toleration-effect",
        "cluster.tolerations",
        [{"key": "gpu", "operator": "Exists", "effect": "Sometimes"}],
        "spec.cluster.tolerations[0].effect: must be one of",
    ),
    spec_case(
        "toleration-seconds-without-noexecute",
        "cluster.tolerations",
        [{"key": "gpu", "operator": "Exists", "effect": "NoSchedule", "tolerationSeconds": 5}],
        "spec.cluster.tolerations[0]: tolerationSeconds applies only to effect NoExecute",
        crd="cel:tolerationSeconds applies only to effect NoExecute",
    ),
    spec_case("node-selector-value", "cluster.nodeSelector", {"pool": "gpu nodes"}, "spec.cluster.nodeSelector.pool"),
    # --- metadata.name: one rule with the operator
    Case(
        "name-trailing-newline",
        document(name="run-1\n"),
        "metadata.name: run name 'run-1\\n' is not valid",
        crd="metadata.name is the API server's own check (ObjectMeta), not the CRD schema's",
    ),
    Case(
        "name-starts-with-digit",
        document(name="1run"),
        "metadata.name: run name '1run' is not valid",
        crd="metadata.name is the API server's own check (ObjectMeta), not the CRD schema's",
    ),
    Case(
        "name-too-long",
        document(name="r" * (layout.RUN_NAME_MAX_LEN + 1)),
        "metadata.name",
        crd="metadata.name is the API server's own check (ObjectMeta), not the CRD schema's",
    ),
    Case(
        "name-not-a-string",
        document(name=12345),
        "metadata.name: must be a string",
        crd="metadata.name is the API server's own check (ObjectMeta), not the CRD schema's",
    ),
    # --- the file itself
    Case("deep-nesting", raw(DEEP), "nesting depth", crd=NOT_IN_SCHEMA),
    Case("deep-block-nesting", raw(DEEP_BLOCK), "nested more than 64 levels deep at line 65", crd=NOT_IN_SCHEMA),
    Case("billion-laughs", raw(BILLION_LAUGHS), f"more than {MAX_NODES} YAML nodes", crd=NOT_IN_SCHEMA),
    Case(
        "not-utf8",
        b"apiVersion: whale.dev/v1alpha1\nkind: WhaleRun\nmetadata: {name: r\xff}\n",
        "not UTF-8: byte 0xff at line 3, column 19",
        crd=NOT_IN_SCHEMA,
    ),
    Case("utf16-bom", GOOD_YAML.encode("utf-16"), "the file is UTF-16", crd=NOT_IN_SCHEMA),
    Case("utf16-no-bom", GOOD_YAML.encode("utf-16-le"), "UTF-16 without a byte-order mark", crd=NOT_IN_SCHEMA),
    Case("utf32-bom", GOOD_YAML.encode("utf-32"), "the file is UTF-32", crd=NOT_IN_SCHEMA),
    Case("too-large", raw(GOOD_YAML + "#" * MAX_MANIFEST_BYTES), "larger than 1024 KiB", crd=NOT_IN_SCHEMA),
    Case(
        "duplicate-key",
        raw(GOOD_YAML.replace("condition: whale", "condition: whale\n  condition: rsft_only")),
        "duplicate key 'condition'",
        crd=NOT_IN_SCHEMA,
    ),
    Case(
        "python-tag", raw("apiVersion: !!python/object/apply:os.system ['true']\n"), "not valid YAML", crd=NOT_IN_SCHEMA
    ),
    Case("empty-file", b"", "the file is empty", crd=NOT_IN_SCHEMA),
    Case(
        "second-run-unchecked",
        raw(GOOD_YAML + "---\n" + yaml.safe_dump(document(patched("rsft.learningRate", -1)))),
        "documents 1, 2 are all WhaleRuns",
        crd=NOT_IN_SCHEMA,
    ),
    Case(
        "second-document-garbage",
        raw(GOOD_YAML + "---\njust a string\n"),
        "document 2: not a Kubernetes object",
        crd=NOT_IN_SCHEMA,
    ),
    Case(
        "misspelt-kind-next-to-run",
        raw(GOOD_YAML + "---\n" + yaml.safe_dump({**document(), "kind": "WhaleRuns"})),
        "documents 1, 2 are all WhaleRuns",
        crd=NOT_IN_SCHEMA,
    ),
    Case(
        "huge-unknown-key",
        document({**BASE_SPEC, "x" * 100_000: 1}),
        "unknown field",
        crd="unknown fields are pruned by the API server, not refused",
    ),
    Case(
        "thousands-of-problems",
        document({**BASE_SPEC, **{f"k{i}": i for i in range(5000)}}),
        "more problems",
        crd="unknown fields are pruned by the API server, not refused",
    ),
]


def write_case(tmp_path: Path, case: Case) -> Path:
    path = tmp_path / f"{case.id}.yaml"
    if isinstance(case.content, bytes):
        path.write_bytes(case.content)
    else:
        path.write_text(yaml.safe_dump(case.content, allow_unicode=True, width=10**6))
    return path


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_whale_validate_refuses_with_a_clear_message(tmp_path, case):
    path = write_case(tmp_path, case)
    res = cli.invoke(app, ["validate", str(path)])
    assert res.exit_code == 1, res.output
    assert isinstance(res.exception, SystemExit), repr(res.exception)  # an uncaught exception would land here
    assert case.expect in res.output, res.output
    assert "Traceback" not in res.output
    assert len(res.output) < 8_000, "an error message must not echo the input"


@pytest.mark.parametrize("case", [c for c in CASES if isinstance(c.content, dict)], ids=lambda c: c.id)
def test_the_crd_refuses_what_its_schema_can_express(case):
    if case.crd == "reject":
        assert crd_errors(case.content), "the CRD schema accepts what `whale validate` refuses"
    elif case.crd.startswith("cel:"):
        # CEL is evaluated by the API server only; the rule saying it must be in the schema
        assert case.crd.removeprefix("cel:") in " ".join(cel_messages(SCHEMA))
    else:
        pytest.skip(case.crd)


@pytest.mark.parametrize(
    "case", [c for c in CASES if c.crd == NOT_IN_SCHEMA or isinstance(c.content, bytes)], ids=lambda c: c.id
)
def test_file_level_attacks_stay_small(tmp_path, case):
    """Reading a hostile file never holds more than a few times the file's size (the cap is 1 MiB)."""
    path = write_case(tmp_path, case)
    tracemalloc.start()
    try:
        with pytest.raises(ManifestError) as info:
            load_manifest(path, check_domain=False)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert case.expect in "; ".join(info.value.problems)
    assert peak < 16 * MAX_MANIFEST_BYTES, f"peak {peak} bytes"


def test_dev_zero_is_read_only_up_to_the_cap():
    """An endless file (a device, a FIFO someone points us at) is cut at the cap, not read to the end."""
    with pytest.raises(ManifestError, match="larger than 1024 KiB"):
        load_manifest(Path("/dev/zero"))


def test_a_fifo_without_a_writer_does_not_hang(tmp_path):
    fifo = tmp_path / "run.yaml"
    os.mkfifo(fifo)
    with pytest.raises(ManifestError, match="the file is empty"):
        load_manifest(fifo)


def test_a_directory_is_named(tmp_path):
    res = cli.invoke(app, ["validate", str(tmp_path)])
    assert res.exit_code == 1 and "cannot read the file: Is a directory" in res.output


def test_ignored_documents_are_named(tmp_path):
    secret = {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "proposer"}, "stringData": {"k": "v"}}
    path = tmp_path / "two.yaml"
    path.write_text(yaml.safe_dump(secret) + "---\n" + GOOD_YAML)
    m = load_manifest(path)
    assert m.name == "run-1" and m.ignored == ("document 1 (v1 Secret)",)
    res = cli.invoke(app, ["validate", str(path)])
    assert res.exit_code == 0 and "note: document 1 (v1 Secret) ignored by `whale run`" in res.output


def test_errors_in_the_run_document_say_which_document(tmp_path):
    secret = {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "proposer"}}
    path = tmp_path / "two.yaml"
    path.write_text(yaml.safe_dump(secret) + "---\n" + yaml.safe_dump(document(patched("rsft.learningRate", -1))))
    res = cli.invoke(app, ["validate", str(path)])
    assert res.exit_code == 1 and "two.yaml (document 2): 1 problem(s)" in res.output
    assert "spec.experiment.rsft.learningRate" in res.output


def test_aliases_within_the_bound_still_work(tmp_path):
    """Anchors and merge keys are ordinary YAML: refused only when they expand past the bound."""
    base = {**BASE_SPEC, "evaluation": {"temperature": 0.7}, "rsft": {"sampling": {"temperature": 0.7}}}
    text = yaml.safe_dump(document(base)).replace("temperature: 0.7", "temperature: &t 0.7", 1)
    text = text.replace("temperature: 0.7", "temperature: *t")
    assert "*t" in text and "&t" in text
    path = tmp_path / "alias.yaml"
    path.write_text(text)
    m = load_manifest(path)
    assert m.spec.experiment.evaluation.temperature == m.spec.experiment.rsft.sampling.temperature == 0.7


def test_validate_is_bounded_under_a_hard_memory_limit(tmp_path):
    """The issue's worst files, run as a real `whale validate` with its address space capped at 1 GiB:
    the old code died of MemoryError (a 1e12-step schedule) or RecursionError on these."""
    files = [
        write_case(tmp_path, c)
        for c in CASES
        if c.id
        in ("total-steps-1e12-float", "evaluation-every-step-at-the-bound", "billion-laughs", "deep-block-nesting")
    ]
    limit = 1 << 30
    code = (
        "import resource, sys; resource.setrlimit(resource.RLIMIT_AS, (%d, %d)); "
        "sys.argv = ['whale', 'validate', sys.argv[1]]; from whale.cli import main; main()"
    ) % (limit, limit)
    for path in files:
        out = subprocess.run(
            [sys.executable, "-c", code, str(path)], capture_output=True, text=True, timeout=60, cwd=ROOT
        )
        assert out.returncode == 1, out.stderr
        assert "problem(s)" in out.stderr and "Traceback" not in out.stderr, out.stderr


# ----- one run-name rule ------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["1run", "run-1\n", "Run", "run_1", "-run", "run-", "", "r" * 46, "a.b"])
def test_validate_and_the_operator_refuse_the_same_names(name):
    from whale_operator import names

    with pytest.raises(ValueError):
        layout.check_run_name(name)
    with pytest.raises(names.RunNameError):
        names.check_run_name(name)


@pytest.mark.parametrize("name", ["r", "run-1", "searchqa-adaptive", "r" * layout.RUN_NAME_MAX_LEN])
def test_validate_and_the_operator_accept_the_same_names(name):
    from whale_operator import names

    assert layout.check_run_name(name) == names.check_run_name(name) == name


def test_the_longest_run_name_keeps_its_fixed_children_unhashed():
    """The bound is derived from the operator's suffixes: at the longest allowed name, the children
    named ``<run>-<suffix>`` (vLLM, each registered domain's tools and their policies) keep the whole name."""
    from whale import plugins
    from whale_operator import names

    run = "r" * layout.RUN_NAME_MAX_LEN
    assert names.inference_name(run) == f"{run}-{names.INFERENCE_SUFFIX}"
    assert names.sandbox_policy_name(run) == f"{run}{layout.LONGEST_CHILD_SUFFIX}"
    tools = [t for d in SHIPPED_DOMAINS for t in plugins.load(d).tool_services]
    assert {t.name for t in tools} == {"sandbox", "retriever"}
    for tool in tools:
        assert names.tool_name(run, tool.name) == f"{run}-{tool.name}", tool.name
    assert len(f"{run}{layout.LONGEST_CHILD_SUFFIX}") == layout.DNS_LABEL_MAX_LEN


def test_the_proposer_key_default_is_allowed():
    from whale.core.spec import SecretKeyRef

    assert SecretKeyRef(name="proposer", key="api-key", env=PROPOSER_KEY_ENV).env == PROPOSER_KEY_ENV
    assert SecretKeyRef(name="proposer", key="api-key", env="OPENAI_API_KEY").env == "OPENAI_API_KEY"
    assert (
        json.dumps(
            crd_errors(
                document(
                    patched(
                        "harnessSearch.proposer.apiKeySecret",
                        {"name": "proposer", "key": "api-key", "env": "OPENAI_API_KEY"},
                    )
                )
            )
        )
        == "[]"
    )
