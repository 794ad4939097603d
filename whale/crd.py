"""Generate the WhaleRun CustomResourceDefinition from the pydantic model.

The CRD under ``manifests/crd/`` is never edited by hand: ``whale crd > manifests/crd/whaleruns.yaml``
writes it, and a test fails when the committed file differs. Pydantic's JSON Schema is turned into
a Kubernetes *structural* OpenAPI v3 schema: references inlined, ``anyOf [X, null]`` -> nullable
X, 2020-12 exclusive bounds -> OpenAPI 3.0 booleans, titles dropped, cross-field rules as CEL.
The spec's bounds come along as they are (minimum/maximum, maxLength, pattern, maxItems); a map
whose keys have a pattern (``patternProperties``, which Kubernetes does not take) becomes
``additionalProperties`` plus a CEL rule on its keys.
"""

from __future__ import annotations

import copy
from typing import Any

import yaml
from pydantic import BaseModel

from whale.spec import (
    API_GROUP,
    API_VERSION,
    KIND,
    PATTERN_HINTS,
    PLURAL,
    SHORT_NAMES,
    SINGULAR,
    WhaleRunSpec,
    WhaleRunStatus,
)

#: CEL rules the API server checks before anything reaches the operator (pydantic checks them too).
CEL_RULES: dict[str, list[dict[str, str]]] = {
    "schedule": [
        {
            "rule": "!(has(self.totalEpochs) && has(self.totalSteps))",
            "message": "give totalEpochs or totalSteps, not both",
        },
        {
            "rule": "!(has(self.weightEpochsPerCycle) && has(self.weightStepsPerCycle))",
            "message": "give weightEpochsPerCycle or weightStepsPerCycle, not both",
        },
    ],
    "evaluation": [
        {
            "rule": "!(has(self.intervalEpochs) && has(self.intervalSteps))",
            "message": "give intervalEpochs or intervalSteps, not both",
        },
    ],
    "spec": [
        {
            "rule": "self.condition == 'mh_only' || has(self.schedule) && "
            "(has(self.schedule.totalEpochs) || has(self.schedule.totalSteps))",
            "message": "conditions that train weights need schedule.totalEpochs or schedule.totalSteps",
        },
    ],
}

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
        if nullable:
            merged["nullable"] = True
            if merged.get("default", 0) is None:
                merged.pop("default")
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
    spec["x-kubernetes-validations"] = CEL_RULES["spec"]
    for prop, rules in CEL_RULES.items():
        if prop in spec["properties"]:
            spec["properties"][prop]["x-kubernetes-validations"] = rules
    _strip_additional(spec)
    status = _schema(WhaleRunStatus, keep_defaults=False)
    _strip_additional(status)
    status.pop("required", None)
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


HEADER = "# GENERATED by `whale crd` from whale/spec.py -- do not edit by hand.\n"


def render() -> str:
    return HEADER + yaml.safe_dump(crd(), sort_keys=False, width=120)
