"""The run's harness host (``whale.harness.host``) as an attacker meets it: a hostile harness file sent over the
remote transport to a real host on loopback, at both levels the host runs (``namespaces``, ``pod``).

(a) the store credentials: the host's own environment holds a fake S3 key (served without the fail-closed check,
to show the next wall): the harness's environment is allow-listed and the host's /proc files are closed to it;
and the real entry point refuses to serve at all while it can see a credential. (b) the service-account token:
not readable from the harness, and a host that has one refuses to serve. (c) a TCP connection out: refused
(under ``pod`` the wall is the harness pod's NetworkPolicy: tests/security/test_harness_pod.py). Then the host's
own bounds: the token, closing kills the process group, at most N processes, idle connections, oversize lines.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from synthetic import DOMAIN as SYNTHETIC
from tests.fixtures.harness_host import ROOT, free_port, host_env, start_harness_host
from tests.security.harness_probes import FAKE_SECRET, attack_attempts, gold_file, probe_harness, report
from whale.harness import launch, remote
from whale.harness.host import HostConfig, credential_exposure
from whale.harness.launch import HarnessHost, SandboxLimits
from whale.harness.process import HarnessProcess
from whale.harness.runner import run_episodes
from whale.inference.base import SamplingParams
from whale.inference.scripted import ScriptedClient

ITEM = {"id": "probe-0", "digit": 3, "answer": "3"}
DEADLINE_S = 20.0

#: a host served without main()'s fail-closed check (argv: port, isolation, token), as main() serves it otherwise
SERVE_UNCHECKED = r"""
import asyncio, sys
from whale.harness.host import HarnessHost, HostConfig, _not_dumpable
_not_dumpable()
asyncio.run(HarnessHost(HostConfig(token=sys.argv[3], isolation=sys.argv[2])).serve("127.0.0.1", int(sys.argv[1])))
"""


def wait_listening(port: int, proc: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while True:
        if proc.poll() is not None:
            raise AssertionError(f"host exited {proc.returncode}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            if time.monotonic() > deadline:
                raise AssertionError("host did not listen") from None
            time.sleep(0.05)


async def run_probe(path: Path, host: HarnessHost) -> dict[str, str]:
    episodes = await run_episodes(
        SYNTHETIC,
        path,
        ScriptedClient(["<answer>3</answer>"]),
        [ITEM],
        SamplingParams(),
        limits=SandboxLimits(host=host),
        processes=1,
    )
    assert episodes[0].error is None, episodes[0].error
    return report(episodes[0].messages[0]["content"])


ATTEMPTS = {
    "its own environ": "dict(os.environ)",
    "the host's environ": "read_fd(os.open('/proc/%d/environ' % os.getppid(), os.O_RDONLY))",
    "pid 1's environ": "read_fd(os.open('/proc/1/environ', os.O_RDONLY))",
    "the service-account token": (
        "read_fd(os.open('/var/run/secrets/kubernetes.io/serviceaccount/token', os.O_RDONLY))"
    ),
}


@pytest.mark.parametrize("isolation", ["namespaces", "pod"])
async def test_a_harness_on_the_host_finds_no_credential_and_no_way_out(
    tmp_path: Path, isolation: str, listener
) -> None:
    port, connected = listener
    gold, _ = gold_file()
    outside = tmp_path / "outside"
    outside.mkdir()
    # every way in of the attack report (gold file, checkout, writes, sockets, ...) and the credential probes
    attempts = {**attack_attempts(gold, outside, port), **ATTEMPTS}
    token, host_port = "t0ken-for-this-test", free_port()
    secret_env = {"AWS_SECRET_ACCESS_KEY": FAKE_SECRET, "WHALE_S3_SECRET_KEY": FAKE_SECRET}
    proc = subprocess.Popen(
        [sys.executable, "-c", SERVE_UNCHECKED, str(host_port), isolation, token],
        env=host_env(token, secret_env),
        cwd=ROOT,
    )
    try:
        wait_listening(host_port, proc)
        # the attack's target is there: the secret is in the host's own environment
        assert FAKE_SECRET in Path(f"/proc/{proc.pid}/environ").read_bytes().decode(errors="replace")
        results = await run_probe(probe_harness(tmp_path, attempts), HarnessHost("127.0.0.1", host_port, token))
    finally:
        proc.kill()
        proc.wait(timeout=10)
    assert set(results) == set(attempts)
    assert results["its own environ"].startswith("OK: {") and FAKE_SECRET not in results["its own environ"]
    assert not list(outside.iterdir())
    assert "AWS_" not in results["its own environ"] and launch.HARNESS_TOKEN_ENV not in results["its own environ"]
    opened = {k: v for k, v in results.items() if k != "its own environ" and not v.startswith("BLOCKED")}
    assert opened == {}
    assert not connected()


def test_the_host_refuses_to_serve_while_it_can_see_a_credential() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "whale.harness.host", "--host", "127.0.0.1", "--port", str(free_port())],
        env=host_env("a-token", {"AWS_ACCESS_KEY_ID": "AKIAFAKE"}),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert "refuses to serve" in done.stderr and "$AWS_ACCESS_KEY_ID" in done.stderr


def test_credential_exposure_names_every_credential(tmp_path: Path) -> None:
    token = tmp_path / "token"
    assert credential_exposure({"PATH": "/usr/bin", "WHALE_HARNESS_TOKEN": "x"}, token, ["WHALE_HARNESS_TOKEN"]) == []
    token.write_text("eyJhbGciOi...")
    env = {"AWS_SECRET_ACCESS_KEY": "s", "MINIO_ROOT_PASSWORD": "p", "S3_ACCESS_KEY": "k", "HOME": "/root"}
    found = credential_exposure(env, token)
    assert len(found) == 4 and str(token) in found[0]
    assert {f.split("$")[1].split()[0] for f in found[1:]} == {
        "AWS_SECRET_ACCESS_KEY",
        "MINIO_ROOT_PASSWORD",
        "S3_ACCESS_KEY",
    }
    # the host's own token is expected; any other whale variable holding a key is not
    assert credential_exposure({"WHALE_HARNESS_TOKEN": "x"}, token.with_name("none"), ["WHALE_HARNESS_TOKEN"]) == []


def test_the_host_refuses_an_empty_token_and_clamps_what_callers_ask_for() -> None:
    with pytest.raises(ValueError, match="WHALE_HARNESS_TOKEN"):
        HostConfig(token="")
    config = HostConfig(token="x", isolation="pod", limits=SandboxLimits(memory_bytes=1 << 30, hook_timeout_s=30.0))
    got = config.clamp({"memory_bytes": 1 << 40, "hook_timeout_s": 1.5, "cpu_seconds": "lots", "start_timeout_s": -1})
    assert (got.memory_bytes, got.hook_timeout_s, got.cpu_seconds, got.start_timeout_s) == (1 << 30, 1.5, 3600, 60.0)
    assert got.isolation == "pod" and got.host is None


async def test_a_wrong_token_is_refused(tmp_path: Path, harness_host: HarnessHost) -> None:
    wrong = HarnessHost(harness_host.address, harness_host.port, "not-the-token")
    with pytest.raises(remote.HarnessHostError, match="wrong token"):
        async with HarnessProcess(SYNTHETIC.h0_path(), SYNTHETIC.allowed_imports, SandboxLimits(host=wrong)):
            pass


async def test_an_unreachable_host_fails_the_phase_not_the_candidate() -> None:
    gone = HarnessHost("127.0.0.1", free_port(), "x")
    started = time.monotonic()
    with pytest.raises(launch.IsolationUnavailableError, match="unreachable after 1 s"):
        await remote.spawn_remote(gone, SYNTHETIC.h0_path(), frozenset(), SandboxLimits(host=gone), ready_timeout_s=1)
    assert time.monotonic() - started < 5


async def test_a_caller_waits_for_a_host_that_is_still_starting() -> None:
    """The operator scales the harness pod up with the phase: a workload may be first."""
    port, token = free_port(), "t0ken"
    waiting = asyncio.create_task(
        remote.spawn_remote(
            HarnessHost("127.0.0.1", port, token),
            SYNTHETIC.h0_path(),
            frozenset(SYNTHETIC.allowed_imports),
            SandboxLimits(),
            ready_timeout_s=60,
        )
    )
    # the caller starts first; the host's interpreter takes a while to start, so its first attempts are refused
    proc = subprocess.Popen(
        [sys.executable, "-m", "whale.harness.host", "--host", "127.0.0.1", "--port", str(port)],
        env=host_env(token),
        cwd=ROOT,
    )
    try:
        spawned = await asyncio.wait_for(waiting, 60)
        assert spawned.isolation["level"] == "pod"
        await spawned.kill()
    finally:
        proc.kill()
        proc.wait(timeout=10)


def descendants(pid: int) -> set[int]:
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            ppid = int(stat.rsplit(")", 1)[1].split()[1])
            children.setdefault(ppid, []).append(int(entry))
    out, todo = set(), [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            out.add(child)
            todo.append(child)
    return out


async def poll(predicate, what: str) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {DEADLINE_S} s: {what}")
        await asyncio.sleep(0.05)


@pytest.mark.parametrize("isolation", ["namespaces", "pod"])
async def test_closing_the_connection_kills_the_process_and_the_level_is_the_hosts(isolation: str) -> None:
    with start_harness_host(isolation) as (host, proc):
        harness = HarnessProcess(SYNTHETIC.h0_path(), SYNTHETIC.allowed_imports, SandboxLimits(host=host))
        await harness.start()
        assert harness.isolation["level"] == isolation and harness.isolation["host"].endswith(str(host.port))
        # (c) under namespaces the process has a network namespace of its own, with no interface; under pod the
        # harness pod's NetworkPolicy is the wall (tests/security/test_harness_pod.py)
        assert harness.isolation["network"] == ("netns" if isolation == "namespaces" else "host")
        assert descendants(proc.pid)
        await harness.aclose()
        await poll(lambda: not descendants(proc.pid), "the harness process is gone")


async def test_the_host_serves_at_most_max_connections_processes() -> None:
    with start_harness_host("namespaces", args=("--max-connections", "1")) as (host, _):
        limits = SandboxLimits(host=host)
        async with HarnessProcess(SYNTHETIC.h0_path(), SYNTHETIC.allowed_imports, limits):
            with pytest.raises(remote.HarnessHostError, match="busy"):
                async with HarnessProcess(SYNTHETIC.h0_path(), SYNTHETIC.allowed_imports, limits):
                    pass
        # the slot is free again once the first one is closed
        async with HarnessProcess(SYNTHETIC.h0_path(), SYNTHETIC.allowed_imports, limits) as again:
            assert again.info is not None


async def test_an_idle_connection_is_closed_and_the_caller_restarts_its_process() -> None:
    with start_harness_host("namespaces", args=("--idle-timeout-s", "1")) as (host, proc):
        async with HarnessProcess(SYNTHETIC.h0_path(), SYNTHETIC.allowed_imports, SandboxLimits(host=host)) as h:
            first = h._proc
            assert first is not None
            await poll(lambda: first.returncode is not None, "the idle connection is closed")
            assert not descendants(proc.pid)
            decision, _ = await h.call("start", {"task": {"prompt": "3"}}, {})
            assert h.restarts == 0 and decision["messages"]  # a new process, but nothing failed


async def test_an_oversize_request_line_ends_the_connection(harness_host: HarnessHost) -> None:
    reader, writer = await asyncio.open_connection(harness_host.address, harness_host.port)
    source = SYNTHETIC.h0_path().read_text()
    writer.write(remote.hello(harness_host, source, frozenset(SYNTHETIC.allowed_imports), SandboxLimits()))
    status = await asyncio.wait_for(remote.read_frame(reader), DEADLINE_S)
    assert status is not None and json.loads(status[1])["ok"]
    writer.write(b"x" * (HostConfig(token="x").max_message_bytes + 1))  # no newline: one line over the limit
    frames = []
    while (got := await asyncio.wait_for(remote.read_frame(reader), DEADLINE_S)) is not None:
        frames.append(got[0])
    assert frames[-1] == remote.EXIT
    writer.close()


def test_pod_without_a_harness_host_fails_closed_naming_the_field(monkeypatch: pytest.MonkeyPatch) -> None:
    """``whale run`` has no harness pod: ``pod`` is refused before any phase, and a workload that somehow runs
    without one refuses to start a harness process (never a silent local fallback)."""
    import dataclasses as dc

    from whale.manifest import load_manifest, local_problems
    from whale.workloads.common import harness_limits

    monkeypatch.delenv(launch.HARNESS_HOST_ENV, raising=False)
    m = load_manifest(ROOT / "manifests" / "examples" / "local" / "tiny-synthetic-whale.yaml")
    spec = m.spec.with_sections(**{"sandbox": m.spec.execution.sandbox.model_copy(update={"isolation": "pod"})})
    assert any("spec.execution.sandbox.isolation is pod" in p for p in local_problems(dc.replace(m, spec=spec)))
    with pytest.raises(launch.IsolationUnavailableError, match="spec.execution.sandbox.isolation"):
        harness_limits(spec)
    with pytest.raises(launch.IsolationUnavailableError, match="spec.execution.sandbox.isolation"):
        async_spawn = launch.spawn_worker(SYNTHETIC.h0_path(), frozenset(), SandboxLimits(isolation="pod"))
        asyncio.run(async_spawn)
    # with the operator's environment the workload goes to the host
    monkeypatch.setenv(launch.HARNESS_HOST_ENV, "demo-harness.team-a.svc:7070")
    monkeypatch.setenv(launch.HARNESS_TOKEN_ENV, "tok")
    limits = harness_limits(spec)
    assert limits.host == HarnessHost("demo-harness.team-a.svc", 7070, "tok") and "tok" not in repr(limits)


@pytest.mark.usefixtures("transport")
async def test_an_answer_over_the_limit_fails_the_call_and_the_process_comes_back(tmp_path: Path) -> None:
    """Locally the pipe's reader refuses the line; over the connection the demultiplexer ends it (no buffer grows
    past the limit in the workload)."""
    from whale.harness.process import HarnessError

    path = tmp_path / "big.py"
    path.write_text(
        "from whale.harness.api import BaseHarness, Decision\n\n"
        "class Harness(BaseHarness):\n"
        "    def start(self, task, state):\n"
        "        size = 10 if task.get('small') else 400000\n"
        "        return Decision(messages=[{'role': 'user', 'content': 'x' * size}])\n"
    )
    limits = SandboxLimits(max_response_bytes=1 << 16, hook_timeout_s=5.0)
    async with HarnessProcess(path, SYNTHETIC.allowed_imports, limits) as harness:
        with pytest.raises(HarnessError):
            await harness.call("start", {"task": {}}, {})
        decision, _ = await harness.call("start", {"task": {"small": True}}, {})
        assert decision["messages"][0]["content"] == "x" * 10
