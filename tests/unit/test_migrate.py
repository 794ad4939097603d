"""whale.dev/v1alpha1 -> v1alpha2: the one conversion (whale.core.convert), `whale migrate` (whale.migrate) and the
old manifests of the repository's history (tests/fixtures/manifests_v1alpha1: the examples as they were before
v1alpha2), each loading to the same spec as its migrated form."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from whale.cli import app
from whale.core.convert import V1ALPHA1, V1ALPHA2, convert_v1alpha1, convert_v1alpha1_spec, is_v1alpha1_spec
from whale.core.spec import WhaleRunSpec
from whale.manifest import ManifestError, load_manifest, parse_document
from whale.migrate import MigrateError, migrate_text

ROOT = Path(__file__).resolve().parents[2]
OLD = sorted((ROOT / "tests" / "fixtures" / "manifests_v1alpha1").glob("*.yaml"))
EXAMPLES = sorted((ROOT / "manifests" / "examples").rglob("*.yaml"))
cli = CliRunner()

FLAT = {
    "domain": "synthetic",
    "condition": "rsft_only",
    "model": {"name": "tiny"},
    "schedule": {"totalSteps": 4},
    "rsft": {"learningRate": 1e-6},
    "storage": {"uri": "s3://b/p", "endpoint": "minio:9000"},
    "suspend": True,
    "resumeFrom": "0b6f1c9e-3d4a-4f5b-8c7d-2e1f0a9b8c7d",
    "seed": 7,
    "cluster": {"queueName": "q"},
}


def test_the_conversion_moves_each_section_to_its_owner_and_changes_nothing_else():
    before = copy.deepcopy(FLAT)
    doc = {"apiVersion": V1ALPHA1, "kind": "WhaleRun", "metadata": {"name": "r"}, "spec": FLAT}
    out = convert_v1alpha1(doc)
    assert before == FLAT, "pure: the input is not changed"
    assert out["apiVersion"] == V1ALPHA2 and out["metadata"] == {"name": "r"}
    assert out["spec"] == {
        "domain": "synthetic",
        "condition": "rsft_only",
        "cluster": {"queueName": "q"},
        "experiment": {
            "model": {"name": "tiny"},
            "schedule": {"totalSteps": 4},
            "rsft": {"learningRate": 1e-6},
            "seed": 7,
        },
        "execution": {
            "storage": {"uri": "s3://b/p", "endpoint": "minio:9000"},
            "suspend": True,
            "resumeFrom": "0b6f1c9e-3d4a-4f5b-8c7d-2e1f0a9b8c7d",
        },
    }
    assert convert_v1alpha1(out) == out, "a v1alpha2 document comes back as it is"
    secret = {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "s"}}
    assert convert_v1alpha1(secret) == secret
    assert not is_v1alpha1_spec(out["spec"]) and is_v1alpha1_spec(FLAT)


def test_a_spec_stored_by_an_older_whale_reads_as_the_same_spec():
    """A store's spec.json written as v1alpha1 (flat) reads through the same conversion."""
    assert WhaleRunSpec.model_validate(FLAT) == WhaleRunSpec.model_validate(convert_v1alpha1_spec(FLAT))
    assert WhaleRunSpec.model_validate(FLAT).execution.storage.uri == "s3://b/p"
    assert WhaleRunSpec.model_validate(FLAT).experiment.rsft.seed == 7  # the one seed still spreads


@pytest.mark.parametrize("path", OLD, ids=lambda p: p.stem)
def test_every_old_manifest_loads_to_the_same_spec_as_its_migrated_form(path: Path, tmp_path: Path):
    old = load_manifest(path)
    assert old.converted_from == V1ALPHA1
    text = path.read_text()
    migrated = migrate_text(text)
    assert migrated.documents == 1
    new_path = tmp_path / path.name
    new_path.write_text(migrated.text)
    new = load_manifest(new_path)
    assert new.converted_from is None and new.raw["apiVersion"] == V1ALPHA2
    assert new.spec == old.spec and new.name == old.name
    # the comments stay, each once, in their order
    comments = [line.split("#", 1)[1] for line in text.splitlines() if "#" in line]
    assert [line.split("#", 1)[1] for line in migrated.text.splitlines() if "#" in line] == comments
    assert migrate_text(migrated.text).documents == 0, "migrating again changes nothing"


def test_the_history_fixtures_cover_every_example():
    assert len(OLD) >= 24
    assert {p.name for p in OLD} == {p.name for p in EXAMPLES}


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
def test_every_example_is_v1alpha2(path: Path):
    assert yaml.safe_load(path.read_text())["apiVersion"] == V1ALPHA2
    assert migrate_text(path.read_text()).documents == 0


def test_whale_migrate_rewrites_in_place_keeps_other_documents_and_checks(tmp_path: Path):
    secret = "apiVersion: v1\nkind: Secret   # kept as written\nmetadata: {name: s}\n"
    path = tmp_path / "run.yaml"
    path.write_text(secret + "---\n" + (ROOT / "tests/fixtures/manifests_v1alpha1/tiny-cpu.yaml").read_text())
    res = cli.invoke(app, ["migrate", "--check", str(path)])
    assert res.exit_code == 1 and f"run `whale migrate {path}`" in res.output
    res = cli.invoke(app, ["migrate", str(path)])
    assert res.exit_code == 0 and f"{path}: migrated to {V1ALPHA2}" in res.output
    assert path.read_text().startswith(secret + "---\n")
    assert [d["apiVersion"] for d in yaml.safe_load_all(path.read_text())] == ["v1", V1ALPHA2]
    res = cli.invoke(app, ["migrate", "--check", str(path)])
    assert res.exit_code == 0 and f"already {V1ALPHA2}" in res.output


def test_a_layout_it_cannot_move_by_lines_is_refused_and_the_file_left_alone(tmp_path: Path):
    flow = f"apiVersion: {V1ALPHA1}\nkind: WhaleRun\nmetadata: {{name: r}}\nspec: {{domain: synthetic}}\n"
    with pytest.raises(MigrateError, match="migrate it by hand"):
        migrate_text(flow)
    path = tmp_path / "flow.yaml"
    path.write_text(flow)
    res = cli.invoke(app, ["migrate", str(path)])
    assert res.exit_code == 1 and "migrate it by hand" in res.output and "Traceback" not in res.output
    assert path.read_text() == flow


def test_an_old_manifest_is_read_with_a_notice_and_a_flat_new_one_is_refused(tmp_path: Path):
    old = ROOT / "tests/fixtures/manifests_v1alpha1/tiny-cpu.yaml"
    res = cli.invoke(app, ["validate", "--target", "cluster", str(old)])
    assert res.exit_code == 0, res.output
    assert f"note: {old} is {V1ALPHA1}, read as {V1ALPHA2}; `whale migrate {old}` rewrites it" in res.output
    flat = {"apiVersion": V1ALPHA2, "kind": "WhaleRun", "metadata": {"name": "r"}, "spec": FLAT}
    with pytest.raises(ManifestError) as refused:
        parse_document(flat, check_domain=False)
    assert any("run `whale migrate FILE`" in p and "spec.rsft" in p for p in refused.value.problems)


def test_a_cluster_dump_becomes_objects_to_create_each_resuming_its_store():
    from whale.migrate import migrate_cluster_dump

    old = yaml.safe_load((ROOT / "tests/fixtures/manifests_v1alpha1/math-whale.yaml").read_text())
    old["metadata"].update(
        uid="0b6f1c9e-3d4a-4f5b-8c7d-2e1f0a9b8c7d",
        resourceVersion="42",
        annotations={"kubectl.kubernetes.io/last-applied-configuration": "{}", "team": "a"},
    )
    old["status"] = {"phase": "Running"}
    dump = yaml.safe_dump({"apiVersion": "v1", "kind": "List", "items": [old, {**old, "apiVersion": V1ALPHA2}]})
    result = migrate_cluster_dump(dump)
    assert result.documents == 1
    (new,) = list(yaml.safe_load_all(result.text))
    assert new["metadata"] == {
        "name": "math-whale",
        "namespace": "whale",
        "labels": old["metadata"]["labels"],
        "annotations": {"team": "a"},
    }
    assert "status" not in new and new["apiVersion"] == V1ALPHA2
    assert new["spec"]["execution"]["resumeFrom"] == "0b6f1c9e-3d4a-4f5b-8c7d-2e1f0a9b8c7d"
    parsed = parse_document(new, check_domain=False).spec
    assert (
        parsed.experiment == load_manifest(ROOT / "tests/fixtures/manifests_v1alpha1/math-whale.yaml").spec.experiment
    )


def test_the_eviction_cap_set_where_v1alpha2_had_it_is_read_where_it_now_lives_with_a_notice(tmp_path: Path):
    """``cluster.maxEvictions`` moved to ``execution.retry.maxEvictions`` (the core decides with it; ``cluster`` is the
    operator's): a manifest or a stored spec that sets the old one keeps its value, and `whale validate` says so."""
    from whale.core.convert import move_fields

    doc = yaml.safe_load((ROOT / "manifests/examples/tiny-cpu.yaml").read_text())
    doc["spec"]["cluster"] = {"queueName": "gpu", "maxEvictions": 3}
    spec = WhaleRunSpec.model_validate(doc["spec"])
    assert spec.execution.retry.max_evictions == 3 and spec.cluster == {"queueName": "gpu"}
    assert WhaleRunSpec.model_validate(move_fields(doc["spec"])) == spec
    assert WhaleRunSpec.model_validate({**FLAT, "cluster": {"maxEvictions": 0}}).execution.retry.max_evictions == 0
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(doc))
    res = cli.invoke(app, ["validate", "--target", "cluster", str(path)])
    assert res.exit_code == 0, res.output
    assert "spec.cluster.maxEvictions is read as spec.execution.retry.maxEvictions" in res.output
    assert parse_document(doc, check_domain=False).notices == (
        "spec.cluster.maxEvictions is read as spec.execution.retry.maxEvictions, where it now lives: move it there",
    )


MOVED_DOC = """\
apiVersion: whale.dev/v1alpha2
kind: WhaleRun
metadata:
  name: capped
spec:
  domain: synthetic
  condition: rsft_only
  experiment:
    model:
      name: tiny
    schedule:
      totalSteps: 4
  execution:
    storage:
      uri: file:///tmp/s   # the store
  cluster:
    queueName: gpu
    # how often Kueue may evict
    maxEvictions: 3  # three
"""


@pytest.mark.parametrize(
    "text",
    [
        MOVED_DOC,
        MOVED_DOC.replace("    queueName: gpu\n", ""),  # the section held only the moved field
        MOVED_DOC.replace("  execution:\n    storage:\n      uri: file:///tmp/s   # the store\n", ""),
        MOVED_DOC.replace("    storage:\n", "    retry:\n      maxAttempts: 2\n    storage:\n"),
    ],
    ids=["beside-others", "alone", "no-execution", "into-retry"],
)
def test_whale_migrate_puts_a_moved_field_where_it_now_lives_keeping_comments(text: str, tmp_path: Path):
    out = migrate_text(text)
    assert out.documents == 1
    new = yaml.safe_load(out.text)
    assert new["spec"]["execution"]["retry"]["maxEvictions"] == 3 and "maxEvictions" not in new["spec"].get(
        "cluster", {}
    )
    assert WhaleRunSpec.model_validate(new["spec"]) == WhaleRunSpec.model_validate(yaml.safe_load(text)["spec"])
    assert "maxEvictions: 3  # three" in out.text and "# how often Kueue may evict" in out.text
    assert migrate_text(out.text).documents == 0  # done once
    path = tmp_path / "run.yaml"
    path.write_text(text)
    assert cli.invoke(app, ["migrate", "--check", str(path)]).exit_code == 1
    res = cli.invoke(app, ["migrate", str(path)])
    assert res.exit_code == 0 and path.read_text() == out.text, res.output


def test_whale_migrate_refuses_a_moved_field_set_in_both_places():
    both = MOVED_DOC.replace("    storage:\n", "    retry:\n      maxEvictions: 5\n    storage:\n")
    with pytest.raises(MigrateError, match="both set"):
        migrate_text(both)
