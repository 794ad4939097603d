"""The CRD is generated from the model; the committed file must be exactly what the generator makes."""

from __future__ import annotations

from pathlib import Path

import yaml

from whale_operator.crd import crd, render

COMMITTED = Path(__file__).resolve().parents[2] / "chart" / "crds" / "whaleruns.yaml"


def test_committed_crd_matches_the_generator():
    assert COMMITTED.read_text() == render(), "run `make crd` (whale crd > chart/crds/whaleruns.yaml)"


def _walk(node, path=""):
    if isinstance(node, dict):
        yield path, node
        for k, v in node.items():
            yield from _walk(v, f"{path}.{k}")
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from _walk(v, f"{path}[{i}]")


def test_schema_is_structural():
    schema = crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    for path, node in _walk(schema):
        assert "$ref" not in node and "anyOf" not in node and "title" not in node, path
        if isinstance(node.get("exclusiveMinimum"), (int, float)) and not isinstance(
            node.get("exclusiveMinimum"), bool
        ):
            raise AssertionError(f"{path}: exclusiveMinimum must be a boolean in OpenAPI v3.0")


def test_crd_identity_defaults_enums_and_columns():
    c = yaml.safe_load(COMMITTED.read_text())
    assert c["metadata"]["name"] == "whaleruns.whale.dev"
    names = c["spec"]["names"]
    assert (names["kind"], names["plural"], names["shortNames"]) == ("WhaleRun", "whaleruns", ["wr"])
    assert c["spec"]["scope"] == "Namespaced"
    version = c["spec"]["versions"][0]
    assert version["name"] == "v1alpha2" and version["subresources"] == {"status": {}}
    assert [v["name"] for v in c["spec"]["versions"]] == ["v1alpha2"]  # v1alpha1 is migrated, not served
    spec = version["schema"]["openAPIV3Schema"]["properties"]["spec"]
    assert spec["properties"]["condition"]["enum"] == ["rsft_only", "mh_only", "whale", "adaptive_whale"]
    experiment = spec["properties"]["experiment"]
    assert experiment["properties"]["rsft"]["properties"]["promptsPerStep"]["default"] == 256
    assert experiment["properties"]["schedule"]["properties"]["maxCycles"]["default"] == 30
    assert set(spec["required"]) == {"domain", "condition", "experiment"} and experiment["required"] == ["model"]
    assert set(spec["properties"]) == {"domain", "condition", "experiment", "execution", "cluster"}
    columns = {col["name"]: col["jsonPath"] for col in version["additionalPrinterColumns"]}
    assert columns["Phase"] == ".status.phase" and columns["Cycle"] == ".status.cycle"
    assert columns["Best"] == ".status.best.meanAtK" and columns["Rollouts"] == ".status.rolloutsSpent"
    assert columns["Final"] == ".status.final.meanAtK"
    assert columns["Age"] == ".metadata.creationTimestamp"
    status = version["schema"]["openAPIV3Schema"]["properties"]["status"]["properties"]
    assert status["phase"]["enum"] == ["Pending", "Running", "Suspended", "Interrupted", "Succeeded", "Failed"]


def test_committed_reference_doc_matches_the_model():
    from whale.docgen import render as render_reference

    committed = COMMITTED.parents[2] / "docs" / "reference.md"
    assert committed.read_text() == render_reference(), "run `python -m whale.docgen > docs/reference.md`"


def _spec_schema():
    return crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]


def test_every_number_in_the_spec_is_bounded():
    """The API server refuses what pydantic refuses: every integer and number has both bounds."""
    for path, node in _walk(_spec_schema()):
        if node.get("type") in ("integer", "number"):
            assert "minimum" in node and "maximum" in node, path
            assert node["minimum"] >= -(2**63) and node["maximum"] <= 2**63 - 1, path


def test_collections_are_bounded_and_kubernetes_can_take_the_schema():
    """Kubernetes has no patternProperties or propertyNames; CEL rules need bounded inputs to pass its
    cost estimate, so every list and map has a maximum size and every string under a rule a maximum length."""
    for path, node in _walk(_spec_schema()):
        assert "patternProperties" not in node and "propertyNames" not in node, path
        if node.get("type") == "array":
            assert "maxItems" in node, path
        if node.get("type") == "object" and "additionalProperties" in node:
            assert "maxProperties" in node, path
        if node.get("type") == "string" and ("x-kubernetes-validations" in node or "pattern" in node):
            assert "maxLength" in node, path


def test_the_schema_carries_the_names_and_quantities():
    spec = _spec_schema()["properties"]
    cluster = spec["cluster"]["properties"]
    quantity = cluster["workerResources"]["properties"]["requests"]["additionalProperties"]
    assert quantity["pattern"].startswith("^") and quantity["maxLength"] == 64
    assert cluster["tolerations"]["items"]["properties"]["effect"]["enum"] == [
        "NoSchedule",
        "PreferNoSchedule",
        "NoExecute",
    ]
    experiment = spec["experiment"]["properties"]
    env = experiment["harnessSearch"]["properties"]["proposer"]["properties"]["apiKeySecret"]["properties"]["env"]
    assert "LD_" in env["not"]["pattern"] and env["x-kubernetes-validations"]
    threshold = experiment["rsft"]["properties"]["scoreThreshold"]
    assert (threshold["minimum"], threshold["maximum"], threshold["exclusiveMaximum"]) == (0, 1, True)


def test_the_crd_exists_once_in_the_repository():
    root = COMMITTED.parents[2]
    found = [
        p.relative_to(root)
        for pattern in ("*.yaml", "*.yml", "*.json")
        for p in root.rglob(pattern)
        if ".venv" not in p.parts and ".git" not in p.parts and "whaleruns.whale.dev" in p.read_text(errors="ignore")
    ]
    assert found == [COMMITTED.relative_to(root)]


def test_nullable_only_where_null_is_not_the_default():
    """``X | None = None``: null and absent read alike (the API server prunes an explicit null), so the schema says
    nothing; ``X | None = <value>``: null is a value of its own (``stallAfterSeconds: null`` = never), kept."""
    from whale.core.spec import WhaleRunSpec

    nullable = [path for path, node in _walk(_spec_schema()) if node.get("nullable")]
    assert ".properties.execution.properties.retry.properties.stallAfterSeconds" in nullable
    assert all("default" in dict(_walk(_spec_schema()))[p] for p in nullable), nullable
    storage = _spec_schema()["properties"]["execution"]["properties"]["storage"]["properties"]
    assert "nullable" not in storage["endpoint"] and "nullable" not in storage["uri"]
    doc = yaml.safe_load((COMMITTED.parents[2] / "manifests/examples/tiny-cpu.yaml").read_text())["spec"]
    pruned = WhaleRunSpec.model_validate(doc)
    explicit = {**doc, "execution": {**doc.get("execution", {}), "resumeFrom": None}}
    assert WhaleRunSpec.model_validate(explicit) == pruned  # what the pruned null reads as


def test_the_cluster_section_is_the_operators_model_and_the_moved_field_is_kept_without_a_default():
    from whale_operator.cluster_spec import Cluster

    cluster = _spec_schema()["properties"]["cluster"]["properties"]
    assert set(cluster) == {f.alias or n for n, f in Cluster.model_fields.items()} | {"maxEvictions"}
    assert (
        "default" not in cluster["maxEvictions"]
        and "execution.retry.maxEvictions" in cluster["maxEvictions"]["description"]
    )
    retry = _spec_schema()["properties"]["execution"]["properties"]["retry"]["properties"]
    assert "default" not in retry["maxEvictions"] and retry["maxEvictions"]["maximum"] == 1000
