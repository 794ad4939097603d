"""Render docs/reference.md (every spec and status field) from the model, like the CRD.

``python -m whale.docgen > docs/reference.md``; a test fails when the committed file drifts.
"""

from __future__ import annotations

import enum
import types
import typing
from typing import Any

from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

from whale.core.status import WhaleRunStatus


def _range(constraints: list[Any]) -> str:
    """`` in [1, 1000000]`` from the numeric bounds among pydantic's constraints (empty if none)."""
    found: dict[str, Any] = {}
    for c in constraints:
        for item in [c, *getattr(c, "metadata", [])]:  # a FieldInfo inside Annotated carries its own
            for attr in ("ge", "gt", "le", "lt"):
                if getattr(item, attr, None) is not None:
                    found[attr] = getattr(item, attr)
    if not found or not ({"ge", "gt"} & found.keys() and {"le", "lt"} & found.keys()):
        return ""
    names = {2**63 - 1: "2^63-1", -(2**63): "-2^63"}
    low = f"[{names.get(found['ge'], found['ge'])}" if "ge" in found else f"({found['gt']}"
    high = f"{names.get(found['le'], found['le'])}]" if "le" in found else f"{found['lt']})"
    return f" in {low}, {high}"


def _type_name(annotation: Any, constraints: list[Any] | None = None) -> str:
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin is typing.Annotated:
        return _type_name(args[0]) + _range(list(args[1:]))
    if constraints and origin not in (list, tuple, dict):
        return _type_name(annotation) + _range(constraints)
    if origin in (typing.Union, types.UnionType):
        names = [_type_name(a) for a in args if a is not type(None)]
        return " \\| ".join(names) + (" \\| null" if type(None) in args else "")
    if origin is typing.Literal:
        return " \\| ".join(f"`{a}`" for a in args)
    if origin in (list, tuple):
        return f"list of {_type_name(args[0])}" if args else "list"
    if origin is dict:
        return f"map of {_type_name(args[1])}" if args else "map"
    if isinstance(annotation, type) and issubclass(annotation, enum.Enum):
        return " \\| ".join(f"`{m.value}`" for m in annotation)
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return "object"
    return getattr(annotation, "__name__", str(annotation))


def _default(info: FieldInfo) -> str:
    if info.is_required():
        return "**required**"
    value = info.get_default(call_default_factory=True)
    if value is PydanticUndefined or value is None:
        return ""
    if isinstance(value, BaseModel):
        return ""
    if isinstance(value, enum.Enum):
        value = value.value
    if value in ([], {}):
        return ""
    return f"`{value}`"


def _model_of(annotation: Any) -> type[BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in typing.get_args(annotation):
        found = _model_of(arg)
        if found is not None:
            return found
    return None


def _rows(model: type[BaseModel], prefix: str) -> list[tuple[str, str, str, str]]:
    rows = []
    for name, info in model.model_fields.items():
        wire = info.alias or name
        path = f"{prefix}.{wire}"
        nested = _model_of(info.annotation)
        doc = (info.description or "").replace("|", "\\|").replace("\n", " ")
        if nested is not None and typing.get_origin(info.annotation) not in (list, dict):
            sub_doc = (nested.__doc__ or "").strip().split("\n\n")[0].replace("\n", " ")
            rows.append((path, "object", "", doc or sub_doc))
            rows.extend(_rows(nested, path))
        else:
            rows.append((path, _type_name(info.annotation, info.metadata), _default(info), doc))
    return rows


#: the domains shipped with whale (domains/), whose options the reference lists
SHIPPED_DOMAINS = ("chess_puzzles", "math_reasoning", "search_qa", "synthetic")


def _domain_options() -> list[tuple[str, type[BaseModel]]]:
    from whale import plugins

    out = []
    for name in SHIPPED_DOMAINS:
        model = getattr(plugins.load(name), "options_model", None)
        if model is not None and model.model_fields:
            out.append((name, model))
    return out


def render() -> str:
    out = [
        "# WhaleRun reference",
        "",
        "Generated from `whale/core/spec.py` (and `operator/whale_operator/cluster_spec.py`: `spec.cluster`) by "
        "`python -m whale.docgen` -- do not edit by hand.",
        "Defaults are the paper's. Field names are as written in a manifest (camelCase).",
        "Numbers are strict (a count is never `true` or `1.5`, a float never `.inf` or `.nan`) and lie in the ranges",
        "shown; Kubernetes names and quantities follow the API server's own rules. The CRD carries the same bounds.",
        "",
        "## spec",
        "",
        "| field | type | default | meaning |",
        "|---|---|---|---|",
    ]
    # the core keeps spec.cluster opaque; the operator's model types it (whale_operator.cluster_spec)
    from whale_operator.cluster_spec import ClusterRunSpec

    out += [f"| `{p}` | {t} | {d} | {m} |" for p, t, d, m in _rows(ClusterRunSpec, "spec")]
    out += [
        "",
        "## Domain options",
        "",
        "`spec.experiment.domainOptions` is validated by the run's domain (its `options.py`); these are the options of "
        "the domains shipped with whale. A field a domain does not have is refused, naming it and the domain's options.",
    ]
    for name, model in _domain_options():
        out += ["", f"### {name}", "", "| field | type | default | meaning |", "|---|---|---|---|"]
        out += [f"| `{p}` | {t} | {d} | {m} |" for p, t, d, m in _rows(model, "spec.experiment.domainOptions")]
    out += ["", "## status", "", "| field | type | meaning |", "|---|---|---|"]
    out += [f"| `{p}` | {t} | {m} |" for p, t, _, m in _rows(WhaleRunStatus, "status")]
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    print(render(), end="")
