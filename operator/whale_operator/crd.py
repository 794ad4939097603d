"""Generate the WhaleRun CustomResourceDefinition from the pydantic models.

The core's spec model (whale.core.spec) gives the schema of its part (domain, condition, experiment, execution) and
keeps ``cluster`` opaque; the operator's cluster model (whale_operator.cluster_spec) gives that section's schema, and
this module adds the CEL rules. The CRD, ``chart/crds/whaleruns.yaml`` (the repository's one copy: the Helm chart
installs it and ``kubectl apply -f chart/crds`` applies it), is never edited by hand: ``make crd`` (``whale crd``)
writes it, and a test fails when the committed file differs.

Pydantic's JSON Schema is turned into a Kubernetes *structural* OpenAPI v3 schema: references inlined,
``anyOf [X, null]`` -> X (``nullable`` only where null is not the default: elsewhere the API server prunes an explicit
null, which the model reads as the default anyway), 2020-12 exclusive bounds -> OpenAPI 3.0 booleans, titles dropped,
cross-field rules as CEL.
The spec's bounds come along as they are (minimum/maximum, maxLength, pattern, maxItems); a map
whose keys have a pattern (``patternProperties``, which Kubernetes does not take) becomes
``additionalProperties`` plus a CEL rule on its keys.
"""

from __future__ import annotations

import copy
from typing import Any

import yaml
from pydantic import BaseModel

from whale.core.convert import MOVED_FIELDS
from whale.core.mutability import IMMUTABLE
from whale.core.spec import (
    API_GROUP,
    API_VERSION,
    CLI_AT_POD,
    INTEGRITY_OFF_UNACKNOWLEDGED,
    KIND,
    PATTERN_HINTS,
    PLURAL,
    PROXY_UNISOLATED,
    RSFT,
    SHORT_NAMES,
    SINGULAR,
    UNISOLATED_UNACKNOWLEDGED,
    AdaptiveHarness,
    Experiment,
    Proposer,
    WhaleRunSpec,
)
from whale.core.status import WhaleRunStatus
from whale_operator.cluster_spec import Cluster


def _default(model: type[BaseModel], field: str) -> Any:
    return model.model_fields[field].default


def _or_default(path: str, model: type[BaseModel], field: str) -> str:
    """``self.<path>`` or the model's default where the field is absent (a rule must not lean on defaulting)."""
    return f"(has(self.{path}) ? self.{path} : {_default(model, field)!r})"


#: ``spec.experiment.harnessSearch.proposer`` as CEL: present?, and its backend (the model's default when absent)
_PROPOSER = "self.experiment.harnessSearch.proposer"
_HAS_PROPOSER = "has(self.experiment.harnessSearch) && has(self.experiment.harnessSearch.proposer)"
_BACKEND = f"({_HAS_PROPOSER} && has({_PROPOSER}.backend) ? {_PROPOSER}.backend : '{_default(Proposer, 'backend')}')"
_NETWORK = f"({_HAS_PROPOSER} && has({_PROPOSER}.network) ? {_PROPOSER}.network : '{_default(Proposer, 'network')}')"
#: whale.metaharness.proposer._loopback: localhost or a loopback address (127.0.0.0/8, ::1)
_LOOPBACK_URL = (
    r"^[A-Za-z][A-Za-z0-9+.-]*://([^/?#@]*@)?((?i:localhost)|127(\.[0-9]{1,3}){3}|\[::1\])(:[0-9]*)?([/?#].*)?$"
)
_SEARCHES = "self.condition != 'rsft_only'"
_S = "self.experiment.schedule"
_BUDGET = f"has({_S}) && (has({_S}.totalEpochs) || has({_S}.totalSteps))"
_E = f"has({_S}) && (has({_S}.weightEpochsPerCycle) || has({_S}.weightStepsPerCycle))"
#: ``spec.execution`` present (the schema defaults it to ``{}``; a rule must not lean on defaulting)
_HAS_EXECUTION = "has(self.execution)"


def _one_unit(knob: str) -> dict[str, str]:
    return {
        "rule": f"!(has(self.{knob}Epochs) && has(self.{knob}Steps))",
        "message": f"give {knob}Epochs or {knob}Steps, not both",
    }


def _unchanged() -> dict[str, str]:
    """The one transition rule (checked on update only): the experiment, with the domain and the condition, stays
    as it was (whale.core.mutability). Every optional section of ``experiment`` is defaulted to ``{}``
    (:func:`openapi_schema`), so one left out and one spelling out its defaults compare equal, as they do to
    :func:`whale.core.mutability.experiment_changes`."""
    return {
        "rule": " && ".join(f"self.{name} == oldSelf.{name}" for name in IMMUTABLE),
        "message": "domain, condition and experiment are what the run computes, which may not change once the run "
        "exists: set them back, or create a new WhaleRun (execution and cluster may change)",
    }


#: CEL rules the API server checks before anything reaches the operator: every cross-field rule of the model's
#: validators (whale.core.spec), the operator's own refusals (whale_operator.config.parse_spec, the proposer's
#: spec_problems) and the experiment (transition rules, checked on update: whale.core.mutability). Keyed by the schema path under
#: ``spec`` ("" is spec itself). tests/unit/test_crd_cel.py evaluates them against the same bad manifests
#: `whale validate` refuses.
CEL_RULES: dict[str, list[dict[str, str]]] = {
    "": [
        {
            "rule": f"self.condition == 'mh_only' || {_BUDGET}",
            "message": "conditions that train weights need experiment.schedule.totalEpochs or experiment.schedule.totalSteps",
        },
        {
            "rule": f"self.condition != 'mh_only' || !({_BUDGET}) && !({_E})",
            "message": "mh_only never trains weights: remove experiment.schedule.totalEpochs/totalSteps/weightEpochsPerCycle/"
            "weightStepsPerCycle (mhOnlyIterations sets its length)",
        },
        {
            "rule": f"self.condition != 'whale' || {_E}",
            "message": "condition whale needs E: set experiment.schedule.weightEpochsPerCycle or "
            "experiment.schedule.weightStepsPerCycle",
        },
        {
            "rule": f"!(self.condition in ['rsft_only', 'adaptive_whale']) || !({_E})",
            "message": "weightEpochsPerCycle/weightStepsPerCycle never apply to rsft_only or adaptive_whale: remove them",
        },
        {
            "rule": f"!({_SEARCHES}) || !({_BACKEND} in ['openai', 'anthropic']) || {_HAS_PROPOSER} && "
            f"has({_PROPOSER}.model)",
            "message": "experiment.harnessSearch.proposer.model: backends openai and anthropic need the model to ask",
        },
        {
            "rule": f"!({_SEARCHES}) || {_BACKEND} != 'openai' || {_HAS_PROPOSER} && has({_PROPOSER}.baseUrl)",
            "message": "experiment.harnessSearch.proposer.baseUrl: backend openai needs the endpoint (an OpenAI-compatible "
            "URL)",
        },
        {
            "rule": f"!({_SEARCHES}) || !({_BACKEND} in ['openai', 'anthropic']) || {_HAS_PROPOSER} && "
            f"(has({_PROPOSER}.apiKeySecret) || {_BACKEND} == 'openai' && has({_PROPOSER}.baseUrl) && "
            f"{_PROPOSER}.baseUrl.matches(r'{_LOOPBACK_URL}'))",
            "message": "experiment.harnessSearch.proposer.apiKeySecret: backends openai and anthropic need the API key "
            "Secret "
            "(an openai baseUrl on loopback needs none)",
        },
        {
            "rule": f"!({_SEARCHES}) || !{_HAS_EXECUTION} || !has(self.execution.sandbox) || "
            f"!has(self.execution.sandbox.isolation) || self.execution.sandbox.isolation != 'pod' || {_BACKEND} != 'cli'",
            "message": CLI_AT_POD,
        },
        {
            "rule": f"!({_SEARCHES}) || !{_HAS_EXECUTION} || !has(self.execution.sandbox) || "
            f"!has(self.execution.sandbox.isolation) || self.execution.sandbox.isolation != 'none' || "
            f"{_BACKEND} != 'cli' || {_NETWORK} != 'proxy'",
            "message": PROXY_UNISOLATED,
        },
        {
            "rule": f"{_HAS_EXECUTION} && has(self.execution.storage) && has(self.execution.storage.uri)",
            "message": "execution.storage.uri: the operator needs an object store: set it to s3://bucket[/prefix]",
        },
        {
            "rule": "!has(self.cluster) || !has(self.cluster.admission) || self.cluster.admission != 'jobSet' || "
            f"!{_HAS_EXECUTION} || !has(self.execution.inference) || (!has(self.execution.inference.backend) || "
            "self.execution.inference.backend in ['auto', 'vllm']) && (!has(self.execution.inference.placement) || "
            "self.execution.inference.placement == 'separate')",
            "message": "cluster.admission: jobSet puts each phase's own vLLM server beside its workload; it needs "
            "execution.inference.backend vllm (or auto) and execution.inference.placement separate",
        },
        _unchanged(),
    ],
    "experiment.harnessSearch": [
        {
            "rule": "!has(self.integrity) || !has(self.integrity.action) || self.integrity.action != 'off' || "
            "(has(self.integrity.acknowledgeOff) && self.integrity.acknowledgeOff)",
            "message": INTEGRITY_OFF_UNACKNOWLEDGED,
        },
    ],
    "execution.sandbox": [
        {
            "rule": "!has(self.isolation) || self.isolation != 'none' || "
            "(has(self.acknowledgeUnisolated) && self.acknowledgeUnisolated)",
            "message": UNISOLATED_UNACKNOWLEDGED,
        },
    ],
    "execution.storage": [
        {
            "rule": "!has(self.uri) || !self.uri.startsWith('s3://') || has(self.endpoint)",
            "message": "storage.endpoint: an s3:// store needs the S3 endpoint (host:port of MinIO/S3)",
        },
    ],
    "experiment.schedule": [
        _one_unit("total"),
        {
            "rule": "!(has(self.weightEpochsPerCycle) && has(self.weightStepsPerCycle))",
            "message": "give weightEpochsPerCycle or weightStepsPerCycle, not both",
        },
    ],
    "experiment.schedule.adaptive.weight": [_one_unit("window"), _one_unit("burnIn"), _one_unit("patience")],
    "experiment.schedule.adaptive.harness": [
        {
            "rule": f"{_or_default('maxIterations', AdaptiveHarness, 'max_iterations')} + 1 >= "
            f"{_or_default('minIterations', AdaptiveHarness, 'min_iterations')}",
            "message": "maxIterations (proposer iterations) + 1 (the incoming evaluation) must allow minIterations",
        },
    ],
    "experiment.rsft": [
        {
            "rule": f"{_or_default('microBatchSizePerGpu', RSFT, 'micro_batch_size_per_gpu')} <= "
            f"{_or_default('miniBatchSize', RSFT, 'mini_batch_size')}",
            "message": "microBatchSizePerGpu must be <= miniBatchSize",
        },
        {
            "rule": "!has(self.attention) || !(self.attention in ['flex', 'flash']) || "
            "has(self.packSequences) && self.packSequences",
            "message": "attention flex and flash are the kernels of packed micro-batches: set packSequences: true",
        },
    ],
    "experiment.harnessSearch.proposer": [
        {
            "rule": "!has(self.backend) || self.backend != 'cli' || has(self.command) && size(self.command) > 0",
            "message": "backend 'cli' needs `command` (the agent CLI's argv)",
        },
        {
            "rule": "!has(self.backend) || self.backend != 'replay' || has(self.script)",
            "message": "backend 'replay' needs `script`",
        },
    ],
    "experiment.evaluation": [_one_unit("interval")],
    "experiment.data": [
        {
            "rule": "!has(self.sources) || size(self.sources) == 0 || has(self.source) && self.source == 'full'",
            "message": "sources: only the full data is fetched; set source: full or remove sources",
        },
    ],
}

#: lists whose items are keyed (the API server refuses a duplicate key; server-side apply merges by it)
LIST_MAP_KEYS: dict[str, list[str]] = {"spec.experiment.data.sources": ["name"], "status.conditions": ["type"]}

PRINTER_COLUMNS = [
    {"name": "Phase", "type": "string", "jsonPath": ".status.phase"},
    {"name": "Cycle", "type": "integer", "jsonPath": ".status.cycle"},
    {"name": "Stage", "type": "string", "jsonPath": ".status.stage"},
    {"name": "Step", "type": "integer", "jsonPath": ".status.step"},
    {"name": "Best", "type": "number", "jsonPath": ".status.best.meanAtK", "description": "best test mean@k"},
    {
        "name": "Final",
        "type": "number",
        "jsonPath": ".status.final.meanAtK",
        "description": "test mean@k of the run's final evaluation point",
    },
    {"name": "Rollouts", "type": "integer", "jsonPath": ".status.rolloutsSpent"},
    {"name": "Domain", "type": "string", "jsonPath": ".spec.domain", "priority": 1},
    {"name": "Condition", "type": "string", "jsonPath": ".spec.condition", "priority": 1},
    {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
]

_DROP = {"title", "$defs", "discriminator"}


def _structural(node: Any, defs: dict[str, Any], keep_defaults: bool = True) -> Any:
    if isinstance(node, list):
        return [_structural(n, defs, keep_defaults) for n in node]
    if not isinstance(node, dict):
        return node
    if "$ref" in node:
        target = copy.deepcopy(defs[node["$ref"].split("/")[-1]])
        extra = {k: v for k, v in node.items() if k != "$ref"}
        target.update(extra)
        return _structural(target, defs, keep_defaults)
    if "anyOf" in node:
        options = [o for o in node["anyOf"] if o != {"type": "null"}]
        nullable = len(options) < len(node["anyOf"])
        rest = {k: v for k, v in node.items() if k != "anyOf"}
        if len(options) == 1:
            merged = _structural(options[0], defs, keep_defaults)
            merged.update(_structural(rest, defs, keep_defaults))
        else:  # a union of scalars: let the API server accept it, pydantic checks the rest
            merged = (
                {"x-kubernetes-int-or-string": True}
                if all(o.get("type") in ("integer", "string") for o in options)
                else {}
            )
            merged.update(_structural(rest, defs, keep_defaults))
        # ``X | None = None``: null and absent are one value, so no ``nullable`` (the API server prunes an explicit
        # null, as the model reads it: None). ``nullable`` only where null differs from the default (``| None = 3600``)
        if nullable and not ("default" in node and node["default"] is None):
            merged["nullable"] = True
        return merged
    if "patternProperties" in node:
        return _structural(_keys_by_cel(node), defs, keep_defaults)
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key in _DROP:
            continue
        if key == "const":
            out["enum"] = [value]
        elif key == "exclusiveMinimum":
            out["minimum"], out["exclusiveMinimum"] = value, True
        elif key == "exclusiveMaximum":
            out["maximum"], out["exclusiveMaximum"] = value, True
        elif key == "properties":
            out["properties"] = {k: _structural(v, defs, keep_defaults) for k, v in value.items()}
        elif key == "description" and isinstance(value, str):
            # a docstring's source line breaks are no breaks of the text (`kubectl explain` wraps it itself)
            out["description"] = " ".join(value.split())
        elif key == "default":
            # Object defaults are implied by their fields' own defaults; keep scalar/list defaults.
            if keep_defaults and not isinstance(value, dict) and value is not None:
                out["default"] = value
        else:
            out[key] = _structural(value, defs, keep_defaults)
    if out.get("type") == "object" and "properties" not in out and "additionalProperties" not in out:
        out["x-kubernetes-preserve-unknown-fields"] = True
    return out


def _keys_by_cel(node: dict[str, Any]) -> dict[str, Any]:
    """``{patternProperties: {P: X}, propertyNames: {maxLength: N}}`` -> ``additionalProperties: X``
    and a CEL rule that every key matches P (RE2, as the pattern) and is at most N long."""
    ((pattern, values),) = node["patternProperties"].items()
    names = node.get("propertyNames", {})
    rule = f"self.all(k, k.matches(r'{pattern}')"
    if "maxLength" in names:
        rule += f" && size(k) <= {names['maxLength']}"
    rule += ")"
    hint = PATTERN_HINTS.get(pattern, f"must match {pattern}")
    rest = {k: v for k, v in node.items() if k not in ("patternProperties", "propertyNames")}
    rules = [*rest.pop("x-kubernetes-validations", []), {"rule": rule, "message": f"every key {hint}"}]
    return {**rest, "additionalProperties": values, "x-kubernetes-validations": rules}


def _schema(model: type[BaseModel], keep_defaults: bool) -> dict[str, Any]:
    raw = model.model_json_schema(by_alias=True, mode="validation")
    return _structural(raw, raw.get("$defs", {}), keep_defaults)


def openapi_schema() -> dict[str, Any]:
    spec = _schema(WhaleRunSpec, keep_defaults=True)
    spec.pop("additionalProperties", None)
    # the core keeps ``cluster`` opaque; its schema is the operator's model
    opaque = spec["properties"]["cluster"]
    spec["properties"]["cluster"] = {**_schema(Cluster, keep_defaults=True), "description": opaque["description"]}
    _keep_moved(spec)
    for path, rules in CEL_RULES.items():
        node = _at(spec, path)
        node["x-kubernetes-validations"] = [*node.get("x-kubernetes-validations", []), *rules]
    # present on every stored object, so the transition rule compares like with like
    experiment = spec["properties"]["experiment"]["properties"]
    for name, info in Experiment.model_fields.items():
        if isinstance(info.default, BaseModel):
            experiment[info.alias or name]["default"] = {}
    spec["properties"]["execution"]["default"] = {}
    # the domain's own options: a mapping the domain validates (the operator asks it), kept as written
    options = experiment["domainOptions"]
    experiment["domainOptions"] = {
        "type": "object",
        "description": options["description"],
        "x-kubernetes-preserve-unknown-fields": True,
        "maxProperties": options["maxProperties"],
    }
    _strip_additional(spec)
    status = _schema(WhaleRunStatus, keep_defaults=False)
    _strip_additional(status)
    status.pop("required", None)
    for path, keys in LIST_MAP_KEYS.items():
        top, _, rest = path.partition(".")
        node = _at(spec if top == "spec" else status, rest)
        if node.get("type") != "array" or not set(keys) <= set(node["items"].get("required", [])):
            raise ValueError(f"{path}: a map list needs its keys {keys} required in every item")
        node["x-kubernetes-list-type"] = "map"
        node["x-kubernetes-list-map-keys"] = keys
    return {
        "type": "object",
        "required": ["spec"],
        "properties": {
            "apiVersion": {"type": "string"},
            "kind": {"type": "string"},
            "metadata": {"type": "object"},
            "spec": spec,
            "status": status,
        },
    }


def _keep_moved(spec: dict[str, Any]) -> None:
    """A field v1alpha2 moved (whale.core.convert.MOVED_FIELDS) stays in the schema where it was, without a default,
    so the API server keeps it on an object written before the move (it prunes what the schema lacks) and the model
    reads it where it now lives; the new place has no default either (the model's applies), so an object that sets
    only the old one is not given the new one by the API server."""
    for old, new in MOVED_FIELDS:
        target = _at(spec, ".".join(new))
        target.pop("default", None)
        kept = {k: v for k, v in target.items() if k != "description"}
        where = "spec." + ".".join(new)
        parent = _at(spec, ".".join(old[:-1]))
        parent["properties"][old[-1]] = {**kept, "description": f"moved to {where}, read from here while that is unset"}


def _at(schema: dict[str, Any], path: str) -> dict[str, Any]:
    """The schema node at a dotted property path ("" is ``schema`` itself)."""
    node = schema
    for prop in filter(None, path.split(".")):
        node = node["properties"][prop]
    return node


def _strip_additional(node: Any) -> None:
    """``additionalProperties: false`` is pydantic's 'forbid'; Kubernetes prunes unknown fields instead."""
    if isinstance(node, dict):
        if node.get("additionalProperties") is False:
            node.pop("additionalProperties")
        for v in node.values():
            _strip_additional(v)
    elif isinstance(node, list):
        for v in node:
            _strip_additional(v)


def crd() -> dict[str, Any]:
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{PLURAL}.{API_GROUP}"},
        "spec": {
            "group": API_GROUP,
            "scope": "Namespaced",
            "names": {
                "kind": KIND,
                "plural": PLURAL,
                "singular": SINGULAR,
                "shortNames": SHORT_NAMES,
                "listKind": f"{KIND}List",
                "categories": ["whale"],
            },
            "versions": [
                {
                    "name": API_VERSION,
                    "served": True,
                    "storage": True,
                    "schema": {"openAPIV3Schema": openapi_schema()},
                    "subresources": {"status": {}},
                    "additionalPrinterColumns": PRINTER_COLUMNS,
                }
            ],
        },
    }


HEADER = (
    "# GENERATED by `whale crd` from whale/core/spec.py and operator/whale_operator/cluster_spec.py -- do not edit "
    "by hand.\n"
)


def render() -> str:
    return HEADER + yaml.safe_dump(crd(), sort_keys=False, width=120)
