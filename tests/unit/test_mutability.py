"""One mutability rule (whale.core.mutability): the same table of spec edits, asserted against the pure rule, the
local runner's resume check, the operator's check against the spec its children ran with, and the CRD's
transition rules (evaluated by cel-python as the API server would, tests/unit/test_crd_cel.py)."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest

from tests.unit.test_crd_cel import BASE_SPEC, admission_errors, document, patched
from whale.core import layout
from whale.core.mutability import EXECUTION, EXPERIMENT, experiment_changes
from whale.core.spec import WhaleRunSpec
from whale.crd import CEL_RULES, crd
from whale.runner.local import LocalRunner, RunConflictError
from whale.store import open_store
from whale_operator.children import stored_experiment_changes

#: (id, the edit as dotted camelCase paths (None removes), whether it changes the experiment)
EDITS: list[tuple[str, dict[str, Any], bool]] = [
    ("rsft.learningRate", {"rsft.learningRate": 3e-6}, True),  # once refused locally, accepted on a cluster
    ("rsft.microBatchSizePerGpu", {"rsft.microBatchSizePerGpu": 1}, True),
    ("model.name", {"model.name": "other"}, True),
    ("model.revision", {"model.revision": "a1b2c3"}, True),
    ("schedule.totalSteps", {"schedule.totalSteps": 12}, True),
    ("harnessSearch.proposer.model", {"harnessSearch.proposer.model": "another"}, True),
    ("evaluation.samplesPerItem", {"evaluation.samplesPerItem": 4}, True),
    ("data.harnessSize", {"data.harnessSize": 8}, True),
    ("data.dataDir", {"data.dataDir": "/elsewhere"}, True),
    ("verifier.mathAnswer", {"verifier.mathAnswer": "mathVerify"}, True),
    ("seed", {"seed": 7}, True),
    ("domain", {"domain": "other"}, True),
    ("storage.uri", {"storage.uri": "s3://elsewhere/runs"}, False),  # once accepted locally, refused on a cluster
    ("storage.endpoint", {"storage.endpoint": "elsewhere:9000"}, False),
    ("resumeFrom", {"resumeFrom": "0b6f1c9e-3d4a-4f5b-8c7d-2e1f0a9b8c7d"}, False),
    ("suspend", {"suspend": True}, False),
    ("retry.maxAttempts", {"retry.maxAttempts": 5}, False),
    ("inference.maxConcurrency", {"inference.maxConcurrency": 3}, False),
    ("inference.tensorParallelSize", {"inference.tensorParallelSize": 2}, False),
    ("train.gpusPerNode", {"train.gpusPerNode": 2}, False),
    ("sandbox.isolation", {"sandbox.isolation": "pod"}, False),
    ("tracking.project", {"tracking.project": "p"}, False),
    ("cluster.priorityClassName", {"cluster.priorityClassName": "high"}, False),
    ("rsft spelled out", {"rsft": {}}, False),  # a section left out and one spelling out its defaults are one
]
IDS = [e[0] for e in EDITS]


@pytest.fixture(autouse=True)
def _plugin(counting_domain):
    return counting_domain


def _edited(changes: dict[str, Any]) -> dict[str, Any]:
    if set(changes) == {"rsft"}:  # BASE_SPEC leaves rsft out: give it, empty
        return {**copy.deepcopy(BASE_SPEC), "rsft": {}}
    return patched(changes)


def _spec(wire: dict[str, Any]) -> WhaleRunSpec:
    return WhaleRunSpec.model_validate(wire)


@pytest.mark.parametrize("edit, changes, experiment", EDITS, ids=IDS)
def test_the_rule(edit: str, changes: dict[str, Any], experiment: bool) -> None:
    found = experiment_changes(_spec(BASE_SPEC), _spec(_edited(changes)))
    assert bool(found) is experiment, found
    assert (f"spec.{edit}" in [c.path for c in found]) is experiment  # seed also names each part it seeds
    assert all(c.in_experiment for c in found)


@pytest.mark.parametrize("edit, changes, experiment", EDITS, ids=IDS)
def test_the_crd_agrees(edit: str, changes: dict[str, Any], experiment: bool) -> None:
    new = document(_edited(changes))
    assert admission_errors(new) == [], "the edited spec alone is valid"
    refused = [e for e in admission_errors(new, old=document(BASE_SPEC)) if "part of the experiment" in e]
    assert [e.split(" ")[1] for e in refused] == ([edit.split(".")[0]] if experiment else []), refused


@pytest.mark.parametrize("edit, changes, experiment", EDITS, ids=IDS)
def test_the_local_runner_agrees(tmp_path: Path, edit: str, changes: dict[str, Any], experiment: bool) -> None:
    store = open_store(str(tmp_path / "store"))
    store.write_json(layout.spec_key("r1"), _spec(BASE_SPEC).to_wire())
    runner = LocalRunner(name="r1", spec=_spec(_edited(changes)), store=store, split_sizes=None, workdir=tmp_path)
    if experiment:
        with pytest.raises(RunConflictError, match=f"spec.{edit}: "):
            runner.claim()
        assert store.read_json(layout.spec_key("r1")) == _spec(BASE_SPEC).to_wire()  # untouched
    else:
        runner.claim()
        assert store.read_json(layout.spec_key("r1")) == _spec(_edited(changes)).to_wire()


@pytest.mark.parametrize("edit, changes, experiment", EDITS, ids=IDS)
def test_the_operator_agrees(tmp_path: Path, edit: str, changes: dict[str, Any], experiment: bool) -> None:
    store = open_store(str(tmp_path / "store"))
    store.write_json(layout.spec_key("r1"), _spec(BASE_SPEC).to_wire())  # what the children ran with
    found = stored_experiment_changes(store, "r1", _spec(_edited(changes)))
    assert (f"spec.{edit}" in [c.path for c in found]) is experiment
    assert found == experiment_changes(_spec(BASE_SPEC), _spec(_edited(changes)))


def test_the_crd_has_one_transition_rule_per_experiment_section() -> None:
    transition = [r for r in CEL_RULES[""] if "oldSelf" in r["rule"]]
    assert [r["message"].split(" ", 1)[0] for r in transition] == [s.value for s in EXPERIMENT]
    assert not [r for path, rules in CEL_RULES.items() if path for r in rules if "oldSelf" in r["rule"]]
    by_section = {r["message"].split(" ", 1)[0]: r["rule"] for r in transition}
    assert by_section["model"] == "self.model == oldSelf.model"  # required: always there
    assert by_section["rsft"] == "has(self.rsft) == has(oldSelf.rsft) && (!has(self.rsft) || self.rsft == oldSelf.rsft)"
    spec = crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]
    # an optional section is always stored (defaulted to {}), so leaving it out equals spelling out its defaults
    assert all(spec[s.value].get("default") == {} for s in EXPERIMENT if s.defaulted_object)
    assert not [name for name in EXECUTION if "default" in spec[name] and spec[name]["default"] == {}]


def test_every_spec_field_is_experiment_or_execution() -> None:
    names = {(f.alias or n) for n, f in WhaleRunSpec.model_fields.items()}
    assert names == {s.value for s in EXPERIMENT} | set(EXECUTION)
    assert not {s.value for s in EXPERIMENT} & set(EXECUTION)
