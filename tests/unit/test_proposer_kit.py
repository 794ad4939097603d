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
