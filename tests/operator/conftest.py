"""Fixtures of the operator suite: the real operator (kopf) against the API emulator on loopback."""

from __future__ import annotations

import contextlib
import copy
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kopf.testing import KopfRunner

from tests.fixtures.kube import EmulatedCluster
from tests.operator.player import WorkloadPlayer, create_run
from whale.core.layout import split_sizes_key
from whale.store import Store, open_store

BASE_SPEC: dict[str, Any] = {
    "domain": "synthetic",
    "condition": "whale",
    "model": {"name": "Qwen/Qwen3.5-2B", "maxModelLen": 4096},
    "schedule": {"totalSteps": 4, "weightStepsPerCycle": 2, "harnessIterationsPerCycle": 2},
    "rsft": {"promptsPerStep": 4, "rolloutsPerPrompt": 2},
    "evaluation": {"intervalSteps": 2},
    "harnessSearch": {
        "proposer": {
            "backend": "anthropic",
            "model": "claude-opus-4-1",
            "apiKeySecret": {"name": "whale-proposer", "key": "api-key"},
        }
    },
}
SPLITS = {"weight": 16, "harness": 8, "test": 8}


def deep_merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(base)
    for k, v in over.items():
        out[k] = deep_merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


@pytest.fixture()
def store(tmp_path: Path) -> Store:
    return open_store(f"file://{tmp_path / 'store'}")


@pytest.fixture()
def operator_env(kube_cluster: EmulatedCluster, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KUBECONFIG", str(kube_cluster.kubeconfig))
    monkeypatch.setenv("WHALE_OPERATOR_METRICS_PORT", "0")
    # the safety-net timer is long on purpose: the tests pass only if watches drive the operator
    monkeypatch.setenv("WHALE_OPERATOR_RESYNC_S", "300")
    monkeypatch.setenv("WHALE_OPERATOR_PROGRESS_S", "0.2")
    monkeypatch.setenv("WHALE_OPERATOR_ERROR_BACKOFF_S", "0.5")
    monkeypatch.setenv("WHALE_OPERATOR_MAX_BACKOFF_S", "2")  # the back-off doubles: bounded for the tests


@pytest.fixture()
def start_operator(operator_env: None, kube_namespace: str, monkeypatch: pytest.MonkeyPatch) -> Any:
    """A context manager running the real operator (``kopf run``) on the test's namespace (its children's watches
    too, as the chart sets them: ``WHALE_OPERATOR_NAMESPACES``)."""
    monkeypatch.setenv("WHALE_OPERATOR_NAMESPACES", kube_namespace)

    @contextlib.contextmanager
    def run() -> Iterator[KopfRunner]:
        args = ["run", "--standalone", "--namespace", kube_namespace, "-m", "whale_operator.handlers"]
        runner = KopfRunner(args, timeout=30)
        try:
            with runner:
                yield runner
        finally:
            if runner.future.done() and runner.future.exception() is None and os.environ.get("WHALE_TEST_KOPF_LOG"):
                Path(os.environ["WHALE_TEST_KOPF_LOG"]).write_text(runner.output)
            if runner.future.done() and runner.future.exception() is None:
                print(
                    "---- operator output ----\n"
                    + "\n".join(
                        line
                        for line in runner.output.splitlines()
                        if "aiohttp.access" not in line and "httpx" not in line and "urllib3" not in line
                    )[-30000:]
                )
        assert runner.exception is None, runner.output[-4000:]
        assert runner.exit_code == 0, runner.output[-4000:]

    return run


@pytest.fixture()
def make_run(kube_cluster: EmulatedCluster, kube_namespace: str, store: Store) -> Any:
    """Create a WhaleRun (the test plays data preparation: split sizes in the store)."""

    def create(
        name: str = "demo", spec: dict[str, Any] | None = None, raw_spec: dict[str, Any] | None = None, **overrides: Any
    ) -> WorkloadPlayer:
        full = (
            raw_spec
            if raw_spec is not None
            else deep_merge(deep_merge(BASE_SPEC, {"storage": {"uri": store.uri}}), spec or {})
        )
        return prepared_run(kube_cluster.api, store, kube_namespace, name, full, **overrides)

    return create


def prepared_run(
    api: Any, store: Store, namespace: str, name: str, spec: dict[str, Any], **overrides: Any
) -> WorkloadPlayer:
    """Create the WhaleRun and play its data preparation: split sizes in the run's own store (and a prepare
    Job, should the operator start one first, finished with the same sizes)."""
    run_store, _uid = create_run(api, store, namespace, name, spec)
    run_store.write_json(split_sizes_key(name), SPLITS)
    return WorkloadPlayer(api, run_store, namespace, name, splits=SPLITS, **overrides)
