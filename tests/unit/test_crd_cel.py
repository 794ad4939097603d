"""CRD parity: what `whale validate` (and the operator's create path) refuses, the API server refuses too.

The generated CRD is evaluated as the API server does for a create or an update: structural defaults, the
OpenAPI schema (bounds, enums, patterns read as RE2 reads them), keyed lists (``x-kubernetes-list-type: map``)
and every ``x-kubernetes-validations`` CEL rule, evaluated by cel-python (celpy) with ``self`` (and ``oldSelf``
on update) bound where the rule sits. ``upperAscii`` is Kubernetes' strings extension, given here as such.
"""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any

import celpy
import jsonschema
import pytest
import yaml
from typer.testing import CliRunner

from whale.cli import app
from whale.core.convert import TO_EXECUTION, TO_EXPERIMENT, convert_v1alpha1
from whale_operator.crd import CEL_RULES, crd

ROOT = Path(__file__).resolve().parents[2]
SCHEMA = crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
cli = CliRunner()
_CEL = celpy.Environment()


def _upper_ascii(s: Any) -> Any:
    return celpy.celtypes.StringType(re.sub(r"[a-z]+", lambda m: m.group(0).upper(), str(s)))


_PROGRAMS: dict[str, Any] = {}


def _program(rule: str) -> Any:
    if rule not in _PROGRAMS:
        _PROGRAMS[rule] = _CEL.program(_CEL.compile(rule), functions={"upperAscii": _upper_ascii})
    return _PROGRAMS[rule]


def _strict_pattern(validator, pattern, instance, schema):
    """``pattern`` as RE2 reads it: ``$`` is the end of the text (Python's would match before a final newline)."""
    if isinstance(instance, str):
        translated = re.sub(r"(?<!\\)\$$", r"\\Z", pattern) if pattern.endswith("$") else pattern
        if not re.search(translated, instance):
            yield jsonschema.ValidationError(f"{instance!r} does not match {pattern!r}")


_Structural = jsonschema.validators.extend(jsonschema.Draft4Validator, {"pattern": _strict_pattern})


def _defaulted(schema: dict[str, Any], value: Any) -> Any:
    """The API server's structural defaulting: a missing property with a ``default`` gets it, in every object
    that is there (an absent object stays absent)."""
    if isinstance(value, dict) and "properties" in schema:
        out = dict(value)
        for prop, sub in schema["properties"].items():
            if prop not in out and "default" in sub:
                out[prop] = copy.deepcopy(sub["default"])
            if prop in out:
                out[prop] = _defaulted(sub, out[prop])
        return out
    if isinstance(value, dict) and isinstance(schema.get("additionalProperties"), dict):
        return {k: _defaulted(schema["additionalProperties"], v) for k, v in value.items()}
    if isinstance(value, list) and "items" in schema:
        return [_defaulted(schema["items"], v) for v in value]
    return value


def _cel_errors(schema: dict[str, Any], value: Any, old: Any, path: str) -> list[str]:
    out: list[str] = []
    if schema.get("x-kubernetes-list-type") == "map" and isinstance(value, list):
        keys = [tuple(item.get(k) for k in schema["x-kubernetes-list-map-keys"]) for item in value]
        dup = {k for k in keys if keys.count(k) > 1}
        if dup:
            out.append(f"{path}: Duplicate value: {sorted(dup)}")
    for rule in schema.get("x-kubernetes-validations", []):
        transition = "oldSelf" in rule["rule"]
        if transition and old is None:
            continue  # transition rules are checked on update only
        bound = {"self": celpy.json_to_cel(value)}
        if transition:
            bound["oldSelf"] = celpy.json_to_cel(old)
        result = _program(rule["rule"]).evaluate(bound)
        if not isinstance(result, celpy.celtypes.BoolType) or not bool(result):  # an error refuses too
            out.append(f"{path}: {rule['message']}")
    if isinstance(value, dict) and "properties" in schema:
        for prop, sub in schema["properties"].items():
            if prop in value:
                sub_old = old.get(prop) if isinstance(old, dict) else None
                out += _cel_errors(sub, value[prop], sub_old, f"{path}.{prop}")
    elif isinstance(value, dict) and isinstance(schema.get("additionalProperties"), dict):
        for k, v in value.items():
            sub_old = old.get(k) if isinstance(old, dict) else None
            out += _cel_errors(schema["additionalProperties"], v, sub_old, f"{path}[{k}]")
    elif isinstance(value, list) and "items" in schema:
        for i, v in enumerate(value):
            out += _cel_errors(schema["items"], v, None, f"{path}[{i}]")
    return out


def admission_errors(doc: dict[str, Any], old: dict[str, Any] | None = None) -> list[str]:
    """What the API server says to a create (``old`` None) or an update of ``doc``."""
    doc = _defaulted(SCHEMA, doc)
    errors = [f"{'.'.join(str(p) for p in e.absolute_path)}: {e.message}" for e in _Structural(SCHEMA).iter_errors(doc)]
    if errors:
        return errors  # the API server stops at the schema; CEL runs on a valid object
    return _cel_errors(SCHEMA, doc, _defaulted(SCHEMA, old) if old is not None else None, "")


# ----- the documents --------------------------------------------------------------------------------

BASE_SPEC: dict[str, Any] = {
    "domain": "counting",
    "condition": "whale",
    "experiment": {
        "model": {"name": "tiny"},
        "schedule": {"totalSteps": 10, "weightStepsPerCycle": 4, "harnessIterationsPerCycle": 2},
        "harnessSearch": {"proposer": {"baseUrl": "http://127.0.0.1:8000/v1", "model": "local-proposer"}},
    },
    "execution": {
        "storage": {"uri": "s3://whale/runs", "endpoint": "minio.whale.svc:9000", "credentialsSecret": "whale-s3"},
    },
}
#: a v1alpha1 section's v1alpha2 group (``rsft`` -> ``experiment``), for the dotted paths of the cases below
_GROUP = {**{w: "experiment" for w, _ in TO_EXPERIMENT}, **{w: "execution" for w, _ in TO_EXECUTION}}


def nested(path: str) -> str:
    """A dotted path as v1alpha1 spelt it (``rsft.learningRate``) under v1alpha2's groups."""
    head = path.split(".")[0]
    return f"{_GROUP[head]}.{path}" if head in _GROUP else path


def document(spec: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "whale.dev/v1alpha2",
        "kind": "WhaleRun",
        "metadata": {"name": "run-1", "namespace": "whale"},
        "spec": spec,
    }


def patched(changes: dict[str, Any], drop: tuple[str, ...] = ()) -> dict[str, Any]:
    """BASE_SPEC with dotted camelCase paths set (``None``: removed) and ``drop`` removed; a path may name a
    section by itself (``rsft.learningRate``): it is looked for in its group (:func:`nested`)."""
    spec = copy.deepcopy(BASE_SPEC)
    for path, value in [*changes.items(), *((p, None) for p in drop)]:
        *parents, leaf = nested(path).split(".")
        node = spec
        for k in parents:
            node = node.setdefault(k, {})
        if value is None:
            node.pop(leaf, None)
        else:
            node[leaf] = value
    return spec


def whale_validate(tmp_path: Path, spec: dict[str, Any]) -> tuple[int, str]:
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(document(spec)))
    res = cli.invoke(app, ["validate", "--target", "cluster", str(path)])
    return res.exit_code, res.output


def operator_refusal(spec: dict[str, Any]) -> str | None:
    """The operator's create path (whale_operator.config.parse_spec): its message, or None if it accepts."""
    from whale_operator.config import SpecError, parse_spec

    try:
        parse_spec(spec)
    except SpecError as exc:
        return str(exc)
    return None


@pytest.fixture(autouse=True)
def _plugin(counting_domain):
    return counting_domain


#: (id, spec, what the CRD's message says). The issue's examples first, then one per cross-field rule.
BAD: list[tuple[str, dict[str, Any], str]] = [
    ("whale-without-E", patched({}, drop=("schedule.weightStepsPerCycle",)), "condition whale needs E"),
    (
        "mh-only-with-weight-budget",
        patched({"condition": "mh_only"}, drop=("schedule.weightStepsPerCycle",)),
        "mh_only never trains weights",
    ),
    (
        "mh-only-with-E",
        patched({"condition": "mh_only"}, drop=("schedule.totalSteps",)),
        "mh_only never trains weights",
    ),
    ("no-storage-uri", patched({}, drop=("storage.uri",)), "execution.storage.uri: the operator needs an object store"),
    ("s3-without-endpoint", patched({}, drop=("storage.endpoint",)), "an s3:// store needs the S3 endpoint"),
    ("cpu-lots", patched({"cluster.workerResources": {"requests": {"cpu": "lots"}}}), "does not match"),
    (
        "toleration-sometimes",
        patched({"cluster.tolerations": [{"key": "gpu", "operator": "Exists", "effect": "Sometimes"}]}),
        "is not one of",
    ),
    (
        "toleration-value-with-exists",
        patched({"cluster.tolerations": [{"key": "gpu", "operator": "Exists", "value": "x"}]}),
        "value must be empty when operator is Exists",
    ),
    (
        "toleration-without-key",
        patched({"cluster.tolerations": [{"operator": "Equal", "value": "x"}]}),
        "a toleration without a key must have operator Exists",
    ),
    (
        "rsft-needs-budget",
        patched({"condition": "rsft_only"}, drop=("schedule",)),
        "need experiment.schedule.totalEpochs",
    ),
    ("rsft-only-with-E", patched({"condition": "rsft_only"}), "never apply to rsft_only or adaptive_whale"),
    ("adaptive-with-E", patched({"condition": "adaptive_whale"}), "never apply to rsft_only or adaptive_whale"),
    ("epochs-and-steps", patched({"schedule.totalEpochs": 2.0}), "give totalEpochs or totalSteps, not both"),
    (
        "E-epochs-and-steps",
        patched({"schedule.weightEpochsPerCycle": 0.5}),
        "give weightEpochsPerCycle or weightStepsPerCycle, not both",
    ),
    (
        "adaptive-window-both",
        patched(
            {"condition": "adaptive_whale", "schedule.adaptive": {"weight": {"windowEpochs": 0.2, "windowSteps": 3}}},
            drop=("schedule.weightStepsPerCycle",),
        ),
        "give windowEpochs or windowSteps, not both",
    ),
    (
        "adaptive-patience-both",
        patched(
            {
                "condition": "adaptive_whale",
                "schedule.adaptive": {"weight": {"patienceEpochs": 0.2, "patienceSteps": 3}},
            },
            drop=("schedule.weightStepsPerCycle",),
        ),
        "give patienceEpochs or patienceSteps, not both",
    ),
    (
        "adaptive-harness-too-short",
        patched(
            {"condition": "adaptive_whale", "schedule.adaptive": {"harness": {"minIterations": 9, "maxIterations": 4}}},
            drop=("schedule.weightStepsPerCycle",),
        ),
        "must allow minIterations",
    ),
    (
        "adaptive-harness-default-min",
        patched(
            {"condition": "adaptive_whale", "schedule.adaptive": {"harness": {"maxIterations": 3}}},
            drop=("schedule.weightStepsPerCycle",),
        ),
        "must allow minIterations",
    ),
    (
        "eval-epochs-and-steps",
        patched({"evaluation": {"intervalEpochs": 0.1, "intervalSteps": 2}}),
        "give intervalEpochs or intervalSteps, not both",
    ),
    (
        "micro-above-mini",
        patched({"rsft": {"miniBatchSize": 4, "microBatchSizePerGpu": 8}}),
        "microBatchSizePerGpu must be <= miniBatchSize",
    ),
    (
        "micro-above-default-mini",
        patched({"rsft": {"microBatchSizePerGpu": 65}}),
        "microBatchSizePerGpu must be <= miniBatchSize",
    ),
    ("flex-without-packing", patched({"rsft": {"attention": "flex"}}), "set packSequences: true"),
    ("cli-without-command", patched({"harnessSearch.proposer": {"backend": "cli"}}), "backend 'cli' needs `command`"),
    (
        "cli-at-pod",
        patched(
            {"harnessSearch.proposer": {"backend": "cli", "command": ["agent", "{prompt}"]}, "sandbox.isolation": "pod"}
        ),
        "backend: cli cannot run at execution.sandbox.isolation pod",
    ),
    (
        "cli-proxy-unisolated",
        patched(
            {
                "harnessSearch.proposer": {"backend": "cli", "command": ["agent", "{prompt}"]},
                "sandbox": {"isolation": "none", "acknowledgeUnisolated": True},
            }
        ),
        "network: proxy needs execution.sandbox.isolation namespaces",
    ),
    (
        "cli-allow-ip-literal",
        patched(
            {"harnessSearch.proposer": {"backend": "cli", "command": ["agent"], "allowHosts": ["169.254.169.254"]}}
        ),
        "does not match",
    ),
    (
        "replay-without-script",
        patched({"harnessSearch.proposer": {"backend": "replay"}}),
        "backend 'replay' needs `script`",
    ),
    (
        "openai-without-model",
        patched({"harnessSearch.proposer": {"baseUrl": "http://127.0.0.1:8000/v1"}}),
        "need the model to ask",
    ),
    ("openai-without-endpoint", patched({"harnessSearch.proposer": {"model": "m"}}), "needs the endpoint"),
    ("no-proposer-at-all", patched({}, drop=("harnessSearch",)), "need the model to ask"),
    (
        "openai-remote-without-key",
        patched({"harnessSearch.proposer": {"model": "m", "baseUrl": "https://api.example.com/v1"}}),
        "need the API key Secret",
    ),
    (
        "openai-lookalike-host-without-key",
        patched({"harnessSearch.proposer": {"model": "m", "baseUrl": "http://127.0.0.1.example.com/v1"}}),
        "need the API key Secret",
    ),
    (
        "anthropic-without-key",
        patched({"harnessSearch.proposer": {"backend": "anthropic", "model": "claude"}}),
        "need the API key Secret",
    ),
    (
        "sources-twice",
        patched({"data": {"source": "full", "sources": [{"name": "nq-train"}, {"name": "nq-train"}]}}),
        "Duplicate value",
    ),
    ("sources-without-full", patched({"data": {"sources": [{"name": "nq-train"}]}}), "only the full data is fetched"),
    (
        "env-ld-preload",
        patched({"harnessSearch.proposer.apiKeySecret": {"name": "k", "key": "k", "env": "LD_PRELOAD"}}),
        "should not be valid",
    ),
    (
        "env-whale-variable",
        patched({"harnessSearch.proposer.apiKeySecret": {"name": "k", "key": "k", "env": "whale_s3_endpoint"}}),
        "WHALE_ variables are the workloads' own",
    ),
    (
        "jobset-colocated",
        patched({"cluster.admission": "jobSet", "inference": {"backend": "vllm", "placement": "colocated"}}),
        "cluster.admission: jobSet puts each phase's own vLLM server beside its workload",
    ),
    (
        "jobset-external-server",
        patched({"cluster.admission": "jobSet", "inference": {"backend": "openai", "baseUrl": "http://x/v1"}}),
        "cluster.admission: jobSet puts each phase's own vLLM server beside its workload",
    ),
    ("admission-unknown", patched({"cluster.admission": "kueue"}), "is not one of"),
    ("gang-unknown", patched({"cluster.gangScheduling": "volcano"}), "is not one of"),
    ("scheduler-name-bad", patched({"cluster.schedulerName": "My Scheduler"}), "does not match"),
    (
        "resource-key",
        patched({"cluster.workerResources": {"requests": {"cpu; rm -rf": "1"}}}),
        "every key must be a qualified name",
    ),
]


@pytest.mark.parametrize("case_id, spec, message", BAD, ids=[c[0] for c in BAD])
def test_what_whale_refuses_the_crd_refuses(tmp_path, case_id, spec, message):
    code, output = whale_validate(tmp_path, spec)
    cluster_refusal = operator_refusal(spec)
    assert code == 1 or cluster_refusal is not None, f"neither `whale validate` nor the operator refuses it: {output}"
    errors = admission_errors(document(spec))
    assert errors, "the CRD admits what whale refuses"
    assert any(message in e for e in errors), errors


def test_the_good_documents_are_admitted(tmp_path):
    """The control: the base document and every example are valid both ways, so each refusal above is the
    bad part's doing (a rule that refuses too much fails here)."""
    assert admission_errors(document(BASE_SPEC)) == []
    assert whale_validate(tmp_path, BASE_SPEC)[0] == 0
    for loopback in ("http://localhost:8000/v1", "http://127.0.0.1/v1", "http://[::1]:8000/v1"):
        assert admission_errors(document(patched({"harnessSearch.proposer.baseUrl": loopback}))) == [], loopback
    examples = sorted((ROOT / "manifests" / "examples").glob("*.yaml"))
    assert len(examples) >= 13
    for path in examples:
        doc = yaml.safe_load(path.read_text())
        assert admission_errors(doc) == [], path.name


def test_hostile_manifests_of_the_security_suite_are_refused_with_cel_evaluated():
    """tests/security/test_manifests.py: each case it says the CRD refuses (schema or a named CEL rule) is
    refused here with every CEL rule really evaluated, its store given so no other rule is what refuses."""
    from tests.security.test_manifests import CASES

    checked = 0
    for case in CASES:
        if not isinstance(case.content, dict) or not (case.crd == "reject" or case.crd.startswith("cel:")):
            continue
        doc = convert_v1alpha1(copy.deepcopy(case.content))
        doc["spec"].setdefault("execution", {}).setdefault("storage", BASE_SPEC["execution"]["storage"])
        errors = admission_errors(doc)
        assert errors, case.id
        if case.crd.startswith("cel:"):
            assert any(case.crd.removeprefix("cel:") in e for e in errors), (case.id, errors)
        checked += 1
    assert checked >= 30


@pytest.mark.parametrize(
    "path, value",
    [
        ("domain", "other"),
        ("condition", "rsft_only"),
        ("model.name", "other"),
        ("model.revision", "a1b2c3"),
        ("data", {"source": "full"}),
    ],
)
def test_the_experiment_is_immutable(path, value):
    """One rule for the experiment (whale.core.mutability; the whole table is tests/unit/test_mutability.py)."""
    old = document(BASE_SPEC)
    new = document(patched({path: value}))
    if path == "condition":
        new = document(patched({path: value}, drop=("schedule.weightStepsPerCycle",)))
    assert admission_errors(new) == [], "the new spec alone is valid"
    assert any("experiment are what the run computes" in e for e in admission_errors(new, old=old))


def test_other_fields_may_change_on_update():
    old = document(BASE_SPEC)
    new = document(patched({"suspend": True, "retry": {"maxAttempts": 5}, "storage.uri": "s3://moved/runs"}))
    assert admission_errors(new, old=old) == []


def test_every_rule_compiles_and_the_conditions_are_a_map_list():
    for rules in CEL_RULES.values():
        for rule in rules:
            _program(rule["rule"])
    conditions = SCHEMA["properties"]["status"]["properties"]["conditions"]
    assert conditions["x-kubernetes-list-type"] == "map"
    assert conditions["x-kubernetes-list-map-keys"] == ["type"]
    assert "type" in conditions["items"]["required"]
