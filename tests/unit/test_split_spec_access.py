"""scripts/split_spec_access.py, the codemod from the flat v1alpha1 spec to v1alpha2's owners: what it rewrites, that
a second run changes nothing, and that the repository needs no run (a file merged from an older branch fails here
until the codemod is run on it)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "split_spec_access.py"
_spec = importlib.util.spec_from_file_location("split_spec_access", SCRIPT)
assert _spec is not None and _spec.loader is not None
codemod = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(codemod)

OLD = '''from whale.core.spec import RunPhase, WhaleRunSpec, WhaleRunStatus


def f(spec, m):
    """Reads ``spec.rsft.learningRate`` and `spec.data.mathSet`; a Job's own ``spec.suspend`` stays."""
    lr = spec.rsft.learning_rate + m.spec.storage.uri + WhaleRunSpec.model_validate(x).schedule.total_steps
    spec = spec.model_copy(update={"train": spec.train.model_copy(update={"num_nodes": 2})})
    return spec.domain, spec.condition, spec.cluster, spec.model_dump(), spec.resume_from
'''
NEW = '''from whale.core.spec import WhaleRunSpec
from whale.core.status import RunPhase, WhaleRunStatus


def f(spec, m):
    """Reads ``spec.experiment.rsft.learningRate`` and `spec.experiment.domainOptions.mathSet`; a Job's own ``spec.suspend`` stays."""
    lr = spec.experiment.rsft.learning_rate + m.spec.execution.storage.uri + WhaleRunSpec.model_validate(x).experiment.schedule.total_steps
    spec = spec.with_sections(**{"train": spec.execution.train.model_copy(update={"num_nodes": 2})})
    return spec.domain, spec.condition, spec.cluster, spec.model_dump(), spec.execution.resume_from
'''


def test_it_rewrites_paths_copies_and_status_imports_and_a_second_run_changes_nothing(tmp_path: Path):
    path = tmp_path / "mod.py"
    path.write_text(OLD.replace("a Job's own ``spec.suspend``", "its ``spec.suspend``"))
    once = codemod.rewrite(path)
    assert once == NEW.replace("a Job's own ``spec.suspend``", "its ``spec.suspend``")
    path.write_text(once)
    assert codemod.rewrite(path) == once


def test_a_v1alpha1_document_literal_in_a_test_is_converted(tmp_path: Path):
    text = 'DOC = {"apiVersion": "whale.dev/v1alpha1", "kind": "WhaleRun", "spec": {"rsft": {}}}\n'
    once = codemod.convert_document_literals(text)
    assert "DOC = convert_v1alpha1({" in once and "from whale.core.convert import convert_v1alpha1" in once
    assert codemod.convert_document_literals(once) == once


def test_the_repository_is_already_rewritten():
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--check"], cwd=ROOT, capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, f"run `python scripts/split_spec_access.py` on:\n{done.stdout}"
