"""whale.dev/v1alpha1 manifests as whale.dev/v1alpha2: the one conversion, pure.

v1alpha1 kept every section at the top of ``spec``; v1alpha2 groups them by owner: ``experiment`` (what the run
computes, fixed once it has a phase), ``execution`` (how it is carried out, free to change on resume) and
``cluster`` (the operator's pod placement), beside ``domain`` and ``condition``. Nothing is renamed inside a
section; the conversion moves sections, and the fields one domain read (``data.mathSet``, ``verifier.chessMove``...:
:data:`DOMAIN_FIELDS`) into ``experiment.domainOptions``, dropping those of another domain (v1alpha1 ignored them). `whale run` and `whale validate` convert an old
manifest on load (with a one-line notice); `whale migrate` rewrites the file (whale.migrate); the model reads an
old spec too (a store's ``spec.json`` written by an older WHALE), by the same function.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

GROUP = "whale.dev"
V1ALPHA1 = f"{GROUP}/v1alpha1"
V1ALPHA2 = f"{GROUP}/v1alpha2"

#: v1alpha1's top-level sections that v1alpha2 puts under ``spec.experiment``: (wire name, Python name)
TO_EXPERIMENT = (
    ("model", "model"),
    ("schedule", "schedule"),
    ("rsft", "rsft"),
    ("harnessSearch", "harness_search"),
    ("evaluation", "evaluation"),
    ("data", "data"),
    ("verifier", "verifier"),
    ("seed", "seed"),
    ("domainOptions", "domain_options"),
)
#: v1alpha1's top-level sections that v1alpha2 puts under ``spec.execution``
TO_EXECUTION = (
    ("storage", "storage"),
    ("inference", "inference"),
    ("retry", "retry"),
    ("train", "train"),
    ("sandbox", "sandbox"),
    ("suspend", "suspend"),
    ("tracking", "tracking"),
    ("resumeFrom", "resume_from"),
)
_MOVED = {name for pair in TO_EXPERIMENT + TO_EXECUTION for name in pair}
#: v1alpha1's fields of one domain, in ``data`` and ``verifier``, that v1alpha2 puts in
#: ``spec.experiment.domainOptions`` (validated there by the domain's own model): (section, wire name, Python
#: name, the domain that read it). Only this table of the conversion names domains
DOMAIN_FIELDS = (
    ("data", "mathSet", "math_set", "math_reasoning"),
    ("data", "syntheticTask", "synthetic_task", "synthetic"),
    ("data", "corpus", "corpus", "search_qa"),
    ("verifier", "mathAnswer", "math_answer", "math_reasoning"),
    ("verifier", "chessMove", "chess_move", "chess_puzzles"),
    ("verifier", "searchAnswer", "search_answer", "search_qa"),
)
_KNOWN_DOMAINS = {f[3] for f in DOMAIN_FIELDS}


def domain_field(section: str, key: str, domain: Any) -> str | None:
    """Where a v1alpha1 ``<section>.<key>`` goes: its name in ``domainOptions`` when the run's domain read it (or
    the domain is not one v1alpha1 knew), ``""`` when v1alpha1 ignored it (another domain's field: dropped), None
    when it is not a domain field."""
    for sec, wire, py, owner in DOMAIN_FIELDS:
        if sec == section and key in (wire, py):
            return wire if domain == owner or domain not in _KNOWN_DOMAINS else ""
    return None


def _split_domain_fields(experiment: dict[str, Any], domain: Any) -> None:
    """Move the domain fields of ``data`` and ``verifier`` (either spelling) into ``domainOptions``, in place."""
    options: dict[str, Any] = {}
    for section_pair in (("data", "data"), ("verifier", "verifier")):
        for key in section_pair:
            part = experiment.get(key)
            if not isinstance(part, Mapping):
                continue
            rest = {}
            for k, v in part.items():
                name = domain_field(section_pair[0], k, domain)
                if name is None:
                    rest[k] = v
                elif name:
                    options[name] = v
            if rest or len(rest) == len(part):
                experiment[key] = rest
            else:
                del experiment[key]  # a section that held only domain fields
    if options:
        experiment["domainOptions"] = {**options, **dict(experiment.get("domainOptions") or {})}


def is_v1alpha1_spec(spec: Any) -> bool:
    """A mapping with a v1alpha1 section at its top and neither v1alpha2 group: a flat (old) spec."""
    return (
        isinstance(spec, Mapping)
        and "experiment" not in spec
        and "execution" not in spec
        and any(key in _MOVED for key in spec)
    )


def _group(spec: Mapping[str, Any], pairs: tuple[tuple[str, str], ...]) -> dict[str, Any]:
    """The sections of ``pairs`` that ``spec`` has, by the name it spells them with (wire or Python)."""
    return {key: spec[key] for pair in pairs for key in pair if key in spec}


def raw_section(spec: Any, name: str) -> Any:
    """A section of a raw (unvalidated) spec of either version by its v1alpha1 wire name (``storage``,
    ``sandbox``...), or None: for code that reads a WhaleRun's body before (or without) the model."""
    if not isinstance(spec, Mapping):
        return None
    if name in spec:
        return spec[name]
    group = "experiment" if name in {w for w, _ in TO_EXPERIMENT} else "execution"
    part = spec.get(group)
    return part.get(name) if isinstance(part, Mapping) else None


def convert_v1alpha1_spec(spec: Mapping[str, Any]) -> dict[str, Any]:
    """A v1alpha1 ``spec`` as v1alpha2's: each section moved under ``experiment`` or ``execution``, every other
    key (domain, condition, cluster, or a typo the model then names) left at the top. Pure: a new mapping."""
    out = {key: value for key, value in spec.items() if key not in _MOVED}
    experiment, execution = _group(spec, TO_EXPERIMENT), _group(spec, TO_EXECUTION)
    _split_domain_fields(experiment, spec.get("domain"))
    if experiment:
        out["experiment"] = experiment
    if execution:
        out["execution"] = execution
    return out


def convert_v1alpha1(manifest: Mapping[str, Any]) -> dict[str, Any]:
    """A whale.dev/v1alpha1 WhaleRun as whale.dev/v1alpha2 (a new mapping; metadata and status as they are).
    Any other document comes back unchanged (a copy of its top level)."""
    out = dict(manifest)
    if manifest.get("apiVersion") != V1ALPHA1:
        return out
    out["apiVersion"] = V1ALPHA2
    if isinstance(manifest.get("spec"), Mapping):
        out["spec"] = convert_v1alpha1_spec(manifest["spec"])
    return out


#: fields v1alpha2 moved after its release, read where they were with a one-line notice: (old path under spec,
#: new path under spec). ``cluster`` is the operator's and opaque to the core; the eviction cap is a retry policy
#: the core decides with (whale.core.alternation), so it lives in ``execution.retry``.
MOVED_FIELDS = ((("cluster", "maxEvictions"), ("execution", "retry", "maxEvictions")),)


def moved_fields(spec: Any) -> list[str]:
    """The notices of the moved fields a raw v1alpha2 ``spec`` still sets where they were (none: [])."""
    return [
        f"spec.{'.'.join(old)} is read as spec.{'.'.join(new)}, where it now lives: move it there"
        for old, new in MOVED_FIELDS
        if _get(spec, old) is not None
    ]


def move_fields(spec: Any) -> Any:
    """``spec`` with each moved field set where it was put where it now is (a new mapping; anything else as it
    is). Given in both places, it is left for the model to refuse (the old place is no field of it any more)."""
    if not isinstance(spec, Mapping):
        return spec
    out: Any = spec
    for old, new in MOVED_FIELDS:
        value = _get(out, old)
        if value is None or _get(out, new) is not None:
            continue
        out = _set(_set(out, old, None), new, value)
    return out


def _get(node: Any, path: tuple[str, ...]) -> Any:
    for key in path:
        if not isinstance(node, Mapping):
            return None
        node = node.get(key)
    return node


def _set(node: Any, path: tuple[str, ...], value: Any) -> dict[str, Any]:
    """A copy of ``node`` with ``path`` set to ``value`` (None: removed), copying only the mappings on the path."""
    out = dict(node) if isinstance(node, Mapping) else {}
    head, rest = path[0], path[1:]
    if rest:
        out[head] = _set(out.get(head), rest, value)
    elif value is None:
        out.pop(head, None)
    else:
        out[head] = value
    return out
