"""What may change when a run resumes: one rule for `whale run`, the operator and the CRD.

A WhaleRun's spec has two kinds of field. The *experiment* is what the run computes: its domain and condition,
the base model, the schedule, the weight and harness phases, the evaluation, the data and the domain's scoring
options. Its completed phases, checkpoints and split sizes were made from it, so once a run has started it may
not change: another experiment is another run. Everything else is *execution*, how and where the run is carried
out (storage, retry, suspend, inference topology, train engine knobs, sandbox, tracking, cluster placement), and
may change between two runners of one run or mid-run on a cluster.

:data:`EXPERIMENT` is the one list. :func:`experiment_changes` is the check both controllers run (the local
runner against the spec in the store when it resumes, the operator against the spec its children ran with), and
whale/crd.py turns the same list into the CRD's transition rules (one per section), so the API server refuses
what the controllers would.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from pydantic import BaseModel

from whale.core.spec import WhaleRunSpec


class Section(StrEnum):
    """A top-level ``spec`` section that belongs to the experiment, by its wire (camelCase) name."""

    DOMAIN = "domain"
    CONDITION = "condition"
    MODEL = "model"
    SCHEDULE = "schedule"
    RSFT = "rsft"
    HARNESS_SEARCH = "harnessSearch"
    EVALUATION = "evaluation"
    DATA = "data"
    #: the domain options of v1alpha1: how a domain scores answers (mathAnswer, chessMove, searchAnswer, judge);
    #: the domain's data options (mathSet, corpus) sit in ``data``
    VERIFIER = "verifier"
    #: the one seed spread into data, rsft, evaluation and harnessSearch (each part carries its own after that)
    SEED = "seed"

    @property
    def attribute(self) -> str:
        """The field's name on :class:`WhaleRunSpec` (snake_case)."""
        return _ATTRIBUTES[self.value]

    @property
    def required(self) -> bool:
        """A manifest always gives it (no default): a rule on it need not ask whether it is there."""
        return WhaleRunSpec.model_fields[self.attribute].is_required()

    @property
    def defaulted_object(self) -> bool:
        """An optional section that is an object: the CRD defaults it to ``{}``, so an absent section and one
        that spells out its defaults are the same section on the API server, as they are to pydantic."""
        return isinstance(WhaleRunSpec.model_fields[self.attribute].default, BaseModel)


_ATTRIBUTES = {(f.alias or name): name for name, f in WhaleRunSpec.model_fields.items()}

#: the experiment: what a run computes, fixed once it has started (the rest of the spec is execution)
EXPERIMENT: tuple[Section, ...] = tuple(Section)
_EXPERIMENT_NAMES = frozenset(s.value for s in EXPERIMENT)
#: the execution: every other top-level field (wire names), free to change on resume
EXECUTION: tuple[str, ...] = tuple(name for name in _ATTRIBUTES if name not in _EXPERIMENT_NAMES)

_ABSENT: Any = object()


@dataclass(frozen=True)
class FieldChange:
    """One field that differs between two specs, by its camelCase path under ``spec``."""

    path: str
    before: Any
    after: Any

    @property
    def section(self) -> str:
        """The top-level section the field is in (``rsft`` for ``spec.rsft.learningRate``)."""
        return self.path.removeprefix("spec.").split(".")[0].split("[")[0]

    @property
    def in_experiment(self) -> bool:
        return self.section in _EXPERIMENT_NAMES

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
