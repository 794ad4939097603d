"""Reading a WhaleRun manifest (the file `kubectl apply` and `whale run` both take) and checking it.

Every problem is collected and reported with the field path in the manifest's own camelCase
spelling, so one `whale validate` lists everything to fix.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from whale import domains
from whale.layout import check_run_name
from whale.spec import API_GROUP, API_VERSION, KIND, WhaleRunSpec


class ManifestError(ValueError):
    """A manifest that cannot run; ``problems`` lists every reason, each naming its field."""

    def __init__(self, source: str, problems: list[str]):
        self.source, self.problems = source, problems
        super().__init__(f"{source}: " + "; ".join(problems))


@dataclass(frozen=True)
class Manifest:
    name: str
    namespace: str | None
    spec: WhaleRunSpec
    raw: dict[str, Any] = field(repr=False)


def _loc(loc: tuple[Any, ...]) -> str:
    parts = ["spec"]
    for p in loc:
        parts.append(f"[{p}]" if isinstance(p, int) else str(p))
    return ".".join(parts).replace(".[", "[")


def format_validation_error(exc: ValidationError) -> list[str]:
    out = []
    for err in exc.errors(include_url=False):
        msg = err["msg"].removeprefix("Value error, ")
        if err["type"] == "extra_forbidden":
            msg = "unknown field (check the spelling; fields are camelCase)"
        elif err["type"] == "enum" or err["type"] == "literal_error":
            msg = msg.replace("Input should be", "must be one of:") if "Input should be" in msg else msg
        out.append(f"{_loc(err['loc'])}: {msg}")
    return out


def parse_document(doc: Any, source: str = "manifest", check_domain: bool = True) -> Manifest:
    problems: list[str] = []
    if not isinstance(doc, dict):
        raise ManifestError(source, ["the document is not a mapping; expected a WhaleRun object"])
    api = doc.get("apiVersion")
    if api != f"{API_GROUP}/{API_VERSION}":
        problems.append(f"apiVersion: must be {API_GROUP}/{API_VERSION}, got {api!r}")
    if doc.get("kind") != KIND:
        problems.append(f"kind: must be {KIND}, got {doc.get('kind')!r}")
    meta = doc.get("metadata") or {}
    name = meta.get("name") if isinstance(meta, dict) else None
    if not name:
        problems.append("metadata.name: required (the run's name, a DNS-1123 label)")
    else:
        try:
            check_run_name(str(name))
        except ValueError as exc:
            problems.append(f"metadata.name: {exc}")
    raw_spec = doc.get("spec")
    spec = None
    if not isinstance(raw_spec, dict):
        problems.append("spec: required mapping")
    else:
        try:
            spec = WhaleRunSpec.model_validate(raw_spec)
        except ValidationError as exc:
            problems.extend(format_validation_error(exc))
        if check_domain and isinstance(raw_spec.get("domain"), str):
            known = domains.available()
            if raw_spec["domain"] not in known:
                problems.append(
                    f"spec.domain: unknown domain {raw_spec['domain']!r}; registered: {', '.join(known) or '(none)'}"
                )
    if problems or spec is None:
        raise ManifestError(source, problems)
    return Manifest(name=str(name), namespace=meta.get("namespace"), spec=spec, raw=doc)


def load_manifest(path: Path, check_domain: bool = True) -> Manifest:
    """Load the WhaleRun in ``path`` (the first WhaleRun of a multi-document file)."""
    source = str(path)
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise ManifestError(source, [f"cannot read the file: {exc.strerror}"]) from None
    try:
        docs = [d for d in yaml.safe_load_all(text) if d is not None]
    except yaml.YAMLError as exc:
        raise ManifestError(source, [f"not valid YAML: {exc}"]) from None
    runs = [d for d in docs if isinstance(d, dict) and d.get("kind") == KIND]
    if not runs:
        if len(docs) == 1:
            return parse_document(docs[0], source, check_domain)
        raise ManifestError(source, [f"no {KIND} document in the file"])
    return parse_document(runs[0], source, check_domain)
