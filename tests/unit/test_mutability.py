"""One mutability rule (whale.core.mutability): the same table of spec edits, asserted against the pure rule, the
local runner's resume check, the operator's check against the spec its children ran with, and the CRD's
transition rules (evaluated by cel-python as the API server would, tests/unit/test_crd_cel.py)."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest

from tests.unit.test_crd_cel import BASE_SPEC, admission_errors, document, nested, patched
from whale.core import layout
from whale.core.mutability import IMMUTABLE, MUTABLE, experiment_changes
from whale.core.spec import WhaleRunSpec
from whale.runner.local import LocalRunner, RunConflictError
from whale.store import open_store
from whale_operator.children import stored_experiment_changes
from whale_operator.crd import CEL_RULES, crd

#: (id, the edit as dotted camelCase paths (None removes; a section by itself: its group is found, test_crd_cel.nested),
#: whether it changes the experiment)
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
    ("domainOptions.mathAnswer", {"domainOptions.mathAnswer": "mathVerify"}, True),
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
        spec = copy.deepcopy(BASE_SPEC)
        spec["experiment"]["rsft"] = {}
        return spec
    return patched(changes)


def _spec(wire: dict[str, Any]) -> WhaleRunSpec:
    return WhaleRunSpec.model_validate(wire)


@pytest.mark.parametrize("edit, changes, experiment", EDITS, ids=IDS)
def test_the_rule(edit: str, changes: dict[str, Any], experiment: bool) -> None:
    found = experiment_changes(_spec(BASE_SPEC), _spec(_edited(changes)))
    assert bool(found) is experiment, found
    assert (f"spec.{nested(edit)}" in [c.path for c in found]) is experiment  # seed also names each part it seeds
    assert all(c.in_experiment for c in found)


@pytest.mark.parametrize("edit, changes, experiment", EDITS, ids=IDS)
def test_the_crd_agrees(edit: str, changes: dict[str, Any], experiment: bool) -> None:
    new = document(_edited(changes))
    assert admission_errors(new) == [], "the edited spec alone is valid"
    refused = [e for e in admission_errors(new, old=document(BASE_SPEC)) if "what the run computes" in e]
    assert len(refused) == (1 if experiment else 0), refused


@pytest.mark.parametrize("edit, changes, experiment", EDITS, ids=IDS)
def test_the_local_runner_agrees(tmp_path: Path, edit: str, changes: dict[str, Any], experiment: bool) -> None:
    store = open_store(str(tmp_path / "store"))
    store.write_json(layout.spec_key("r1"), _spec(BASE_SPEC).to_wire())
    runner = LocalRunner(name="r1", spec=_spec(_edited(changes)), store=store, split_sizes=None, workdir=tmp_path)
    if experiment:
        with pytest.raises(RunConflictError, match=f"spec.{nested(edit)}: "):
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
    assert (f"spec.{nested(edit)}" in [c.path for c in found]) is experiment
    assert found == experiment_changes(_spec(BASE_SPEC), _spec(_edited(changes)))


def test_the_crd_has_one_transition_rule() -> None:
    transition = [r for path, rules in CEL_RULES.items() for r in rules if "oldSelf" in r["rule"]]
    assert [r["rule"] for r in transition] == [
        "self.domain == oldSelf.domain && self.condition == oldSelf.condition && self.experiment == oldSelf.experiment"
    ]
    assert transition == [r for r in CEL_RULES[""] if "oldSelf" in r["rule"]]  # on spec itself
    spec = crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    experiment = spec["properties"]["experiment"]["properties"]
    # an optional section is always stored (defaulted to {}), so leaving it out equals spelling out its defaults
    assert all(experiment[name].get("default") == {} for name in ("schedule", "rsft", "harnessSearch", "data"))
    assert "experiment" in spec["required"] and "default" not in spec["properties"]["experiment"]


def test_every_spec_field_is_experiment_or_execution() -> None:
    names = {(f.alias or n) for n, f in WhaleRunSpec.model_fields.items()}
    assert names == set(IMMUTABLE) | set(MUTABLE) == {"domain", "condition", "experiment", "execution", "cluster"}
    assert not set(IMMUTABLE) & set(MUTABLE)
