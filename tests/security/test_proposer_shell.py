"""The proposer's ``run_shell``: bash over the read-only archive copy, in a fresh sandbox per call.

The proposer is untrusted, so its shell gets the archive copy (read-only), its own candidates
(read-only) and a scratch home — and nothing else: not the data root (the test split's gold answers),
not the checkout, not the network, not the parent's environment; every call is bounded in time and
output. Each test runs a real command through the real sandbox and checks both the refusal and that
the host is unchanged. ``where`` runs a test twice: the sandbox started here (``local``, ``whale run``) and
on a real harness host on loopback at level ``namespaces`` (``remote``, the cluster path: the archive goes
as a snapshot).
"""

from __future__ import annotations

import asyncio
import socket
from pathlib import Path

import pytest

from tests.security.harness_probes import CHECKOUT, gold_file
from whale.harness.launch import HarnessHost
from whale.metaharness.proposer.tools import SHELL_OUTPUT_BYTES, ProposerTools, SandboxShell, Toolbox
from whale.metaharness.proposer.workspace import Workspace


@pytest.fixture(params=["local", "remote"])
def host(request: pytest.FixtureRequest) -> HarnessHost | None:
    """None: the shell's sandbox starts here; else the commands run on the real harness host."""
    return request.getfixturevalue("harness_host") if request.param == "remote" else None


@pytest.fixture
def archive(tmp_path: Path) -> Path:
    root = tmp_path / "work" / "archive"
    (root / "candidates" / "i01-incoming").mkdir(parents=True)
    (root / "summary.md").write_text("# summary\nBest so far: i01-incoming\n")
    (root / "candidates" / "i01-incoming" / "traces.jsonl").write_text('{"reward": 0.0}\n{"reward": 1.0}\n')
    return root


@pytest.mark.timeout(60)
def test_the_shell_reads_the_archive_and_runs_the_standard_tools(
    archive: Path, tmp_path: Path, host: HarnessHost | None
):
    candidates = tmp_path / "scratch" / "candidates"
    candidates.mkdir(parents=True)
    (candidates / "mine.py").write_text("# my candidate\n")
    shell = SandboxShell(archive, candidates, host=host)
    out = shell.run_sync(
        "pwd; cat summary.md; grep -c reward candidates/i01-incoming/traces.jsonl; "
        "cat $CANDIDATES/mine.py; python3 -c 'import json, statistics; print(statistics.mean([0, 1]))'"
    )
    assert out.startswith("exit: 0\n")
    assert (
        (str(archive) in out if host is None else "/archive\n" in out)
        and "Best so far: i01-incoming" in out
        and "\n2\n" in out
    )
    assert "# my candidate" in out and "0.5" in out


@pytest.mark.timeout(60)
def test_the_shell_cannot_read_the_data_root_or_the_checkout_or_the_parent_environment(
    archive: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, host: HarnessHost | None
):
    gold, row = gold_file()
    assert row["problem"][:30] in gold.read_text()  # it is there, on the host
    monkeypatch.setenv("WHALE_PARENT_MARKER", "parent-marker-7f3a")
    out = SandboxShell(archive, host=host).run_sync(
        f"cat {gold}; ls {gold.parent}; cat {CHECKOUT / 'whale' / '__init__.py'}; ls /work /root /home /tmp; "
        "cat /proc/1/environ; env"
    )
    assert row["problem"][:30] not in out and "No such file or directory" in out
    assert "import" not in out.split("[stderr]")[0]  # nothing of the checkout's source came back
    assert "parent-marker-7f3a" not in out and "WHALE_PARENT_MARKER" not in out
    assert "HOME=/scratch" in out


@pytest.mark.timeout(60)
def test_the_shell_cannot_change_the_archive(archive: Path, host: HarnessHost | None):
    before = (archive / "summary.md").read_text()
    out = SandboxShell(archive, host=host).run_sync(
        "echo owned > summary.md; touch planted; rm -rf candidates; echo ok > $HOME/mine && cat $HOME/mine"
    )
    assert "Read-only file system" in out and "\nok\n" in out  # the scratch home is writable, the archive is not
    assert (archive / "summary.md").read_text() == before
    assert not (archive / "planted").exists() and (archive / "candidates" / "i01-incoming").is_dir()


@pytest.mark.timeout(60)
def test_the_shell_has_no_network(archive: Path, host: HarnessHost | None):
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen()
    srv.setblocking(False)
    port = srv.getsockname()[1]
    try:
        out = SandboxShell(archive, host=host).run_sync(
            f"echo hi > /dev/tcp/127.0.0.1/{port} && echo CONNECTED; "
            f"python3 -c 'import socket; socket.create_connection((\"127.0.0.1\", {port}), timeout=2)' "
            "&& echo CONNECTED2"
        )
        assert "CONNECTED" not in out
        with pytest.raises(BlockingIOError):
            srv.accept()
    finally:
        srv.close()


@pytest.mark.timeout(60)
def test_every_call_is_bounded_in_time_and_output(archive: Path, host: HarnessHost | None):
    shell = SandboxShell(archive, host=host)
    out = shell.run_sync("sleep 100 & sleep 100", timeout_s=1)
    assert out.startswith("exit: stopped after 1 s")
    out = shell.run_sync("yes")
    assert out.startswith(f"exit: stopped: the output passed {SHELL_OUTPUT_BYTES} bytes")
    assert len(out) < SHELL_OUTPUT_BYTES + 2000
    assert (
        SandboxShell(archive, host=host).run_sync("echo x", timeout_s=10_000).startswith("exit: 0")
    )  # capped, not refused


@pytest.mark.timeout(60)
def test_bad_calls_come_back_as_errors_through_the_toolbox(archive: Path, tmp_path: Path, host: HarnessHost | None):
    shell = SandboxShell(archive, host=host)
    box = Toolbox(Workspace(archive, tmp_path / "scratch", 1), ProposerTools(shell=shell))
    assert asyncio.run(box.call("run_shell", {"command": ""})) == "error: `command` must be a non-empty string"
    assert asyncio.run(box.call("run_shell", {"command": "x" * 9000})).startswith("error: the command is 9000")
    assert asyncio.run(box.call("run_shell", {"command": "ls", "timeout_s": "soon"})).startswith("error: timeout_s")
    assert "summary.md" in asyncio.run(box.call("run_shell", {"command": "ls"}))
    without = Toolbox(Workspace(archive, tmp_path / "scratch", 1), None)
    assert asyncio.run(without.call("run_shell", {"command": "ls"})) == "error: run_shell is not available in this run"
    assert "run_shell" not in {s["function"]["name"] for s in without.specs}
