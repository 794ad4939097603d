"""What may change when a run resumes: one rule for `whale run`, the operator and the CRD.

A WhaleRun's spec is grouped by owner (whale.core.spec). ``domain``, ``condition`` and ``experiment`` are what the
run computes: its completed phases, checkpoints and split sizes were made from them, so once a run has started they
may not change (another experiment is another run). ``execution`` (storage, retry, suspend, inference topology,
train engine, sandbox, tracking) and ``cluster`` (pod placement) are how and where it is carried out, and may change
between two runners of one run or mid-run on a cluster.

:data:`IMMUTABLE` is the one list. :func:`experiment_changes` is the check both controllers run (the local runner
against the spec in the store when it resumes, the operator against the spec its children ran with), and
whale_operator/crd.py turns the same list into the CRD's one transition rule, so the API server refuses what the
controllers would.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from whale.core.spec import WhaleRunSpec

#: the top-level fields of ``spec`` (wire names) fixed once a run has started: what it computes
IMMUTABLE: tuple[str, ...] = ("domain", "condition", "experiment")
#: the rest, free to change on resume
MUTABLE: tuple[str, ...] = tuple(
    f.alias or name for name, f in WhaleRunSpec.model_fields.items() if (f.alias or name) not in IMMUTABLE
)

_ABSENT: Any = object()


@dataclass(frozen=True)
class FieldChange:
    """One field that differs between two specs, by its camelCase path under ``spec``."""

    path: str
    before: Any
    after: Any

    @property
    def section(self) -> str:
        """The top-level field the change is in (``experiment`` for ``spec.experiment.rsft.learningRate``)."""
        return self.path.removeprefix("spec.").split(".")[0].split("[")[0]

    @property
    def in_experiment(self) -> bool:
        return self.section in IMMUTABLE

    def __str__(self) -> str:
        return f"{self.path}: {_show(self.before)} -> {_show(self.after)}"


def _show(value: Any) -> str:
    if value is _ABSENT:
        return "(unset)"
    text = json.dumps(value, sort_keys=True) if not isinstance(value, str) else value
    return text if len(text) <= 80 else text[:77] + "..."


def spec_changes(before: Any, after: Any, path: str = "spec") -> list[FieldChange]:
    """The fields that differ between two wire specs (camelCase dicts), leaves only, in path order."""
    if isinstance(before, Mapping) and isinstance(after, Mapping):
        out: list[FieldChange] = []
        for key in sorted(set(before) | set(after)):
            out += spec_changes(before.get(key, _ABSENT), after.get(key, _ABSENT), f"{path}.{key}")
        return out
    if isinstance(before, list) and isinstance(after, list) and len(before) == len(after):
        return [
            c for i, (b, a) in enumerate(zip(before, after, strict=True)) for c in spec_changes(b, a, f"{path}[{i}]")
        ]
    return [] if before == after else [FieldChange(path, before, after)]


def experiment_changes(stored: WhaleRunSpec, new: WhaleRunSpec) -> list[FieldChange]:
    """The experiment's fields in which ``new`` differs from ``stored`` (the spec the run ran with), leaves by
    path; empty when ``new`` may replace ``stored`` on resume. Both are compared as the model writes them, so a
    default spelled out and one left out are the same value."""
    return [c for c in spec_changes(stored.to_wire(), new.to_wire()) if c.in_experiment]
