"""`benchmarks/startup.py` runs end to end and writes its figures (the CI smoke of the start-up benchmark, issue
#32; no timing is asserted), and what keeps `whale --version` fast: it imports none of the command line."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

import whale

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.timeout(300)
def test_the_startup_benchmark_writes_its_figures(tmp_path):
    out = tmp_path / "startup.json"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "startup.py"), "--repeats", "1", "--json", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=280,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    result = json.loads(out.read_text())
    assert set(result["wall_s"]) == {"pass", "version", "validate"}
    assert all(len(w) == 1 and w[0] > 0 for w in result["wall_s"].values())
    assert set(result["ratio_to_python"]) == {"version", "validate"}
    assert result["manifest"] == "manifests/examples/math-whale.yaml"
    assert "x python" in proc.stdout


def test_version_is_answered_before_the_command_line_is_imported():
    probe = (
        "import sys; sys.argv = ['whale', '--version']; from whale.__main__ import main; main(); "
        "heavy = sorted(m for m in ('typer', 'rich', 'pydantic', 'yaml', 'whale.cli', 'whale.core.spec') "
        "if m in sys.modules); print(heavy)"
    )
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=True)
    assert proc.stdout.splitlines() == [f"whale {whale.version()}", "[]"]
