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
