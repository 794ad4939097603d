"""The two modules staged into the harness process import only the standard library (and each other):
inside, nothing else exists (``whale.harness.launch.stage_worker_package``)."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

import whale.harness

HARNESS = Path(whale.harness.__file__).resolve().parent
#: the staged package: what these modules may import besides the standard library
STAGED = {"whale", "whale.harness", "whale.harness.api", "whale.harness.worker"}


def imported_modules(path: Path) -> set[str]:
    """Every module an ``import`` / ``from ... import`` anywhere in the file names (lazy ones too)."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                raise AssertionError(f"{path.name}: relative import at line {node.lineno}")
            out.add(node.module or "")
            out.update(f"{node.module}.{a.name}" for a in node.names)  # `from whale.harness import x`
    return out


@pytest.mark.parametrize("name", ["api.py", "worker.py"])
def test_staged_module_imports_only_the_standard_library(name: str) -> None:
    modules = imported_modules(HARNESS / name)
    outside = sorted(
        m for m in modules if m not in STAGED and m.split(".")[0] not in sys.stdlib_module_names and m != "__future__"
    )
    assert outside == [], f"{name} imports {outside}: the harness process has only the standard library"
    assert "whale.harness.api" in modules or name == "api.py"


def test_the_check_sees_a_third_party_import(tmp_path: Path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text(
        "import json\n\ndef f():\n    import pydantic\n    from whale.domain import Domain\n"
        "    from whale.harness import launch\n"
    )
    modules = imported_modules(bad)
    assert {"pydantic", "whale.domain", "whale.harness.launch"} <= modules
    assert [m for m in modules if m not in STAGED and m.split(".")[0] not in sys.stdlib_module_names] != []
