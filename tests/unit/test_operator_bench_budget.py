"""The operator benchmark's account of the creation burst's target (``creation_budget``): what the window the target
allows leaves the operator once the emulator, the driver and the S3 server have spent what they spent, each Python
process on one interpreter lock. Synthetic figures, so each rule is seen to decide."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

# the benchmarks are scripts, importing each other by name (their folder on the path, as when they run)
sys.path.append(str(Path(__file__).resolve().parents[2] / "benchmarks"))
from operator_bench import creation_budget

PINNED = {"operator": [0], "emulator_and_driver": [1]}


def results(create_s: float, emulator: float, driver: float, operator: float, store: float = 0.0) -> dict[str, Any]:
    burst = {
        "per_run_s": {"n": 200},
        "emulator_cpu_s": emulator,
        "driver_cpu_s": driver,
        "store_cpu_s": store,
        "process_cpu_s": operator,
    }
    return {"create_s": create_s, "creation_burst": burst}


def test_sharing_the_cores_the_operator_gets_what_the_others_leave_of_the_window() -> None:
    # runs made in 1 s: the burst over within 2 s, 4 CPU-s on two cores, 2.5 of them the others'
    budget = creation_budget(results(1.0, 1.5, 1.0, 3.0), None, 2, True)
    assert budget["window_s"] == pytest.approx(2.0) and budget["others_cpu_s"] == pytest.approx(2.5)
    assert budget["others_fit"] is True
    assert budget["operator_allowed_cpu_s"] == pytest.approx(1.5)
    assert budget["operator_allowed_per_run_s"] == pytest.approx(0.0075)
    assert budget["operator_cpu_per_run_s"] == pytest.approx(0.015)
    assert budget["reachable"] is False  # 3 CPU-s spent against 1.5 left
    assert creation_budget(results(1.0, 1.5, 1.0, 1.2), None, 2, True)["reachable"] is True


def test_the_operator_never_gets_more_than_one_core_of_the_window() -> None:
    # sixteen cores and little else to do: still one interpreter lock, so the window's length at most
    budget = creation_budget(results(1.0, 0.5, 0.5, 2.5), None, 16, True)
    assert budget["operator_allowed_cpu_s"] == pytest.approx(2.0)
    assert budget["reachable"] is False


def test_an_emulator_busier_than_its_one_core_puts_the_target_out_of_any_operators_reach() -> None:
    # 2.2 CPU-s of one Python process in a 2-s window: the API server's stand-in could not have kept up
    budget = creation_budget(results(1.0, 2.2, 0.2, 0.1), None, 2, True)
    assert budget["others_fit"] is False and budget["reachable"] is False
    # with the emulator in the driver's process (--no-emulator-process) their CPU shares one lock
    assert creation_budget(results(1.0, 1.2, 1.0, 0.1), None, 4, False)["others_fit"] is False
    assert creation_budget(results(1.0, 1.2, 1.0, 0.1), None, 4, True)["others_fit"] is True


def test_on_cores_of_its_own_the_operator_has_them_and_the_others_have_theirs() -> None:
    budget = creation_budget(results(1.0, 1.4, 0.5, 1.9), PINNED, 2, True)
    assert budget["operator_allowed_cpu_s"] == pytest.approx(2.0)  # its core over the window
    assert budget["others_fit"] is True and budget["reachable"] is True
    # the emulator and the driver needing more than their one core holds in the window
    crowded = creation_budget(results(1.0, 1.5, 0.6, 1.9), PINNED, 2, True)
    assert crowded["others_fit"] is False and crowded["reachable"] is False
