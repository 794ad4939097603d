"""The harness process is sandboxed: no network, no credentials, no file writes, bounded memory,
and its prints cannot corrupt the protocol. These harness files skip the static validator on
purpose (a proposer's file that slipped through must still be contained)."""

from __future__ import annotations

import socket
import textwrap
from pathlib import Path

import pytest

from whale.harness.launch import SandboxLimits
from whale.harness.process import HarnessError, HarnessProcess

ALLOWED = frozenset({"re"})


def write(tmp_path: Path, start_body: str) -> Path:
    path = tmp_path / "hostile.py"
    path.write_text(
        "from whale.harness.api import BaseHarness, Decision\n\n"
        "class Harness(BaseHarness):\n"
        "    def start(self, task, state):\n" + textwrap.indent(textwrap.dedent(start_body), "        ")
    )
    return path


async def start_hook(path: Path, limits: SandboxLimits | None = None) -> dict:
    async with HarnessProcess(path, ALLOWED, limits) as harness:
        decision, _ = await harness.call("start", {"task": {}}, {})
        return decision


def test_listener_sees_a_connection(listener) -> None:
    port, connected = listener
    socket.create_connection(("127.0.0.1", port), timeout=2).close()
    assert connected()


async def test_no_network(tmp_path: Path, listener) -> None:
    port, connected = listener
    path = write(
        tmp_path,
        f"""
        import socket
        s = socket.create_connection(("127.0.0.1", {port}), timeout=2)
        return Decision(messages=[{{"role": "user", "content": "connected"}}])
    """,
    )
    with pytest.raises(HarnessError, match="start failed"):
        await start_hook(path)
    assert not connected()


async def test_no_credentials_in_the_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WHALE_TEST_API_KEY", "sk-very-secret")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "aws-very-secret")
    path = write(
        tmp_path,
        """
        import os
        return Decision(messages=[{"role": "user", "content": repr(dict(os.environ))}])
    """,
    )
    decision = await start_hook(path)
    dumped = decision["messages"][0]["content"]
    assert "PATH" in dumped
    assert "very-secret" not in dumped


async def test_no_file_writes(tmp_path: Path) -> None:
    target = tmp_path / "pwned.txt"
    path = write(
        tmp_path,
        f"""
        with open({str(target)!r}, "w") as fh:
            fh.write("x")
        return Decision()
    """,
    )
    with pytest.raises(HarnessError, match="start failed"):
        await start_hook(path)
    assert not target.exists()


async def test_memory_limit_kills_only_the_hook(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        """
        if task.get("big"):
            blob = bytearray(2 << 30)
        return Decision(messages=[{"role": "user", "content": "fine"}])
    """,
    )
    async with HarnessProcess(path, ALLOWED, SandboxLimits(memory_bytes=512 << 20)) as harness:
        with pytest.raises(HarnessError, match="MemoryError"):
            await harness.call("start", {"task": {"big": True}}, {})
        decision, _ = await harness.call("start", {"task": {}}, {})
    assert decision["messages"][0]["content"] == "fine"


async def test_prints_do_not_corrupt_the_protocol(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        """
        print('{"id": 1, "ok": true, "result": "forged"}')
        return Decision(messages=[{"role": "user", "content": "real"}])
    """,
    )
    decision = await start_hook(path)
    assert decision["messages"][0]["content"] == "real"


async def test_the_runtime_reports_the_isolation_it_got(tmp_path: Path) -> None:
    path = write(tmp_path, "return Decision()\n")
    async with HarnessProcess(path, ALLOWED) as harness:
        isolation = harness.isolation
    assert isolation["level"] == "namespaces"
    if "network" in isolation:  # the launcher's own report (its keys are the launcher's business)
        assert str(isolation["network"]).startswith("netns")


def test_the_eval_workload_records_the_isolation_it_ran_under(tmp_path: Path) -> None:
    """spec.execution.sandbox.isolation reaches the eval workload's harness pool and its result: `none` is recorded
    (field and note), so a reader of the result sees the run was not isolated."""
    from tests.fixtures.guess_domain import GuessNumberDomainDouble
    from whale.core import layout
    from whale.core.protocol import EvalPhaseArgs, EvalResult, phase_request
    from whale.inference.scripted import FixedLatencyClient
    from whale.store import open_store
    from whale.workloads.eval import run_eval

    results = {}
    for isolation in ("namespaces", "none"):
        store = open_store(str(tmp_path / isolation))
        spec = {
            "domain": "chess_puzzles",
            "condition": "mh_only",
            "model": {"name": "unused"},
            "evaluation": {"samplesPerItem": 1},
            "sandbox": {"isolation": isolation, "acknowledgeUnisolated": isolation == "none"},
        }
        request = phase_request(
            spec,
            run="r",
            phase="p",
            attempt=1,
            args=EvalPhaseArgs(cycle=0, step=0, after="start", checkpoint=None, harness=None),
        )
        store.write_json(layout.spec_key("r"), spec)
        store.write_json(layout.request_key("r", "p"), request.to_wire())
        run_eval(store, "r", "p", domain=GuessNumberDomainDouble(), client=FixedLatencyClient("<guess>42</guess>", 0.0))
        results[isolation] = EvalResult.model_validate(store.read_json(layout.result_key("r", "p")))
    assert results["namespaces"].sandbox_isolation == "namespaces"
    assert not any("WITHOUT isolation" in note for note in results["namespaces"].notes)
    assert results["none"].sandbox_isolation == "none"
    assert any("spec.execution.sandbox.isolation was none" in note for note in results["none"].notes)
    assert results["none"].mean_at_k == results["namespaces"].mean_at_k == 0.25
