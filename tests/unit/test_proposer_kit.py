"""The prototyping kit's files: the domain's tool code shipped importable, nothing outside the kit."""

from __future__ import annotations

import pytest

from whale.metaharness.proposer.kit import prototype_kit


def test_modules_become_importable_packages_and_the_api_is_the_harness_api():
    kit = prototype_kit(
        "API", "H", [{"id": "1", "question": "q"}], {}, {"search_qa/tool.py": "T", "whale/harness/api.py": "FAKE"}
    )
    assert kit["proto/search_qa/tool.py"] == "T" and kit["proto/search_qa/__init__.py"] == ""
    assert kit["proto/whale/__init__.py"] == kit["proto/whale/harness/__init__.py"] == ""
    assert kit["proto/whale/harness/api.py"] == "API"  # a domain's module never replaces the harness API


@pytest.mark.parametrize("path", ["../escape.py", "/etc/x.py", "a/../../b.py", "notes.txt"])
def test_a_module_path_outside_the_kit_is_refused(path):
    with pytest.raises(ValueError, match="relative .py path inside the kit"):
        prototype_kit("API", "H", [], {}, {path: "x"})


def test_the_offline_kit_has_no_service_client_and_says_where_the_tools_are(tmp_path):
    from whale.metaharness.proposer.agent import place_kit
    from whale.metaharness.proposer.kit import offline_kit

    kit = prototype_kit("API", "H", [{"id": "1", "question": "q"}], {"retriever": "http://r"})
    offline = offline_kit(kit)
    assert set(kit) - set(offline) == {"proto/tools.py", "proto/services.json"}
    assert "try_harness" in offline["proto/README.md"] and offline["proto/tasks.jsonl"] == kit["proto/tasks.jsonl"]
    place_kit(tmp_path, offline)
    assert (tmp_path / "proto" / "whale" / "harness" / "api.py").read_text() == "API"
    assert not list(tmp_path.rglob("*.part"))
    with pytest.raises(ValueError, match="outside proto/"):
        place_kit(tmp_path, {"proto/../summary.md": "x"})
    assert not (tmp_path / "summary.md").exists()
