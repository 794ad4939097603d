"""Test configuration: fixture modules per area, opt-in markers, hygiene."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

# pytest-xdist's workers inherit COLUMNS=80 from the controller; the command line's consoles are built at import
# and would cut its tables at 80 columns. The suite runs as CI's piped run does, without it (a test that needs a
# width sets COLUMNS itself).
os.environ.pop("COLUMNS", None)

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent
PLUGINS = TESTS / "plugins"

# Each area owns its session fixtures in its own module (real servers on loopback, tiny models).
pytest_plugins = [
    "tests.fixtures.s3",
    "tests.fixtures.kube",
    "tests.fixtures.models",
    "tests.fixtures.servers",
    "tests.fixtures.tools",
    "tests.fixtures.harness_host",
    "tests.fixtures.network",
]

OPT_IN = {"e2e": "--run-e2e", "gpu": "--run-gpu", "cluster": "--run-cluster"}


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--run-e2e", action="store_true", help="run opt-in end-to-end checks (slow, big downloads)")
    parser.addoption("--run-gpu", action="store_true", help="run checks that need a CUDA GPU")
    parser.addoption("--run-cluster", action="store_true", help="run the operator suite against $KUBECONFIG")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        for marker, flag in OPT_IN.items():
            # the marker itself, not the keywords: those also hold the path's folder names (a checkout under a
            # folder named "cluster" or "gpu" would skip everything)
            if item.get_closest_marker(marker) is not None and not config.getoption(flag):
                item.add_marker(pytest.mark.skip(reason=f"opt-in: pass {flag}"))


@pytest.fixture
def counting_domain(monkeypatch: pytest.MonkeyPatch) -> str:
    """Install the test plugin domain 'counting' (tests/plugins) for this process and its children."""
    monkeypatch.syspath_prepend(str(PLUGINS))
    existing = os.environ.get("PYTHONPATH", "")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(p for p in (str(PLUGINS), str(ROOT), existing) if p))
    return "counting"
