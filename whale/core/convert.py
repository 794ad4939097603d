"""whale.dev/v1alpha1 manifests as whale.dev/v1alpha2: the one conversion, pure.

v1alpha1 kept every section at the top of ``spec``; v1alpha2 groups them by owner: ``experiment`` (what the run
computes, fixed once it has a phase), ``execution`` (how it is carried out, free to change on resume) and
``cluster`` (the operator's pod placement), beside ``domain`` and ``condition``. Nothing is renamed or dropped
inside a section, so the conversion only moves sections. `whale run` and `whale validate` convert an old
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


def convert_v1alpha1_spec(spec: Mapping[str, Any]) -> dict[str, Any]:
    """A v1alpha1 ``spec`` as v1alpha2's: each section moved under ``experiment`` or ``execution``, every other
    key (domain, condition, cluster, or a typo the model then names) left at the top. Pure: a new mapping."""
    out = {key: value for key, value in spec.items() if key not in _MOVED}
    experiment, execution = _group(spec, TO_EXPERIMENT), _group(spec, TO_EXECUTION)
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
