"""The layers hold: the pure core imports no engine and does no I/O; the core never imports the operator."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def test_import_contracts_are_kept():
    exe = shutil.which("lint-imports") or str(Path(sys.executable).parent / "lint-imports")
    if not Path(exe).exists():
        pytest.fail("import-linter is not installed (it is in the [test] extra)")
    out = subprocess.run([exe], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-2000:]
    assert "0 broken" in out.stdout


def test_nothing_is_importable_as_operator():
    out = subprocess.run(
        [sys.executable, "-c", "import operator; print(operator.__file__)"],
        cwd="/",
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert "site-packages" not in out.stdout and out.stdout.strip().endswith("/operator.py")
    assert not (ROOT / "operator" / "__init__.py").exists()


def _cluster_reads(path: Path) -> list[str]:
    """``<x>.cluster.<field>`` and ``<x>.cluster[...]`` in one file: a read of a field of the cluster section."""
    import ast

    tree = ast.parse(path.read_text(), str(path))
    out = []
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Attribute | ast.Subscript)
            and isinstance(node.value, ast.Attribute)
            and node.value.attr == "cluster"
        ):
            out.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    return out


def test_the_core_and_the_domains_never_read_a_field_of_the_cluster_section():
    """``spec.cluster`` is the operator's (whale_operator.cluster_spec): the library keeps it as written and reads
    none of it (a policy the core decides with, like the eviction cap, lives in ``execution``)."""
    reads = [r for base in ("whale", "domains") for p in sorted((ROOT / base).rglob("*.py")) for r in _cluster_reads(p)]
    assert reads == []
    assert _cluster_reads(ROOT / "operator/whale_operator/builders/pods.py"), "the check finds the operator's reads"
