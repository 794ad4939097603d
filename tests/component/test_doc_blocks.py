"""The command blocks of README.md and docs/ fenced as ```` ```bash runnable ```` run as written on Linux: each
block is one bash script (``set -euo pipefail``), run from a scratch folder that holds the repository's
``manifests/`` (so the blocks' relative paths resolve and nothing they write lands in the checkout), with the
project's ``whale`` on ``PATH``; it must exit 0 within its bound. Blocks not marked runnable need a run, a
cluster or minutes of CPU (``make demo``, ``make compare``) and are checked for their commands and options only
(``tests/unit/test_doc_commands.py``)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
RUNNABLE = re.compile(r"```bash runnable\n(.*?)```", re.S)
BLOCKS = [
    pytest.param(doc, block, id=f"{doc.name}#{n}")
    for doc in DOCS
    for n, block in enumerate(RUNNABLE.findall(doc.read_text(encoding="utf-8")), start=1)
]


def test_the_docs_hold_runnable_blocks():
    assert {p.values[0].name for p in BLOCKS} >= {"README.md", "cli.md"}


@pytest.mark.timeout(300)
@pytest.mark.parametrize("doc,block", BLOCKS)
def test_a_runnable_block_runs_as_written(doc: Path, block: str, tmp_path: Path) -> None:
    (tmp_path / "manifests").symlink_to(ROOT / "manifests")
    bin_dir = Path(sys.executable).parent  # the environment's `whale` script lives beside its python
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}", "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run(
        ["bash", "-c", "set -euo pipefail\n" + block],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert proc.returncode == 0, (
        f"{doc.name} block failed:\n{block}\n--- stdout\n{proc.stdout[-3000:]}\n--- stderr\n{proc.stderr[-3000:]}"
    )
