"""The proposer's ``run_shell`` on the run's harness host (the cluster path, #16) as an attacker meets it.

At ``spec.execution.sandbox.isolation: pod`` the harness-search pod, which holds the store credentials, starts no
sandbox: each command goes to the harness host with a snapshot of the archive and the candidates, and runs
there in a fresh directory. The attacks: read the caller's store credentials (its environment), a
service-account token, the data root (through a link planted in the archive), the host's caller token, and
open a socket. At ``namespaces`` every wall is the sandbox's and is checked here on loopback; at ``pod`` the
network and filesystem walls are the harness pod's (its NetworkPolicy and its own filesystem: see
tests/security/test_harness_pod.py and tests/operator/test_pod_security.py), and what is checked here is what
the host itself guarantees: the command's environment is allow-listed and nothing of the caller but the
snapshot reaches it. Then the snapshot's own bounds (links, paths out of its roots, size, entries).
"""

from __future__ import annotations

import asyncio
import io
import json
import socket
import tarfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.fixtures.harness_host import start_harness_host
from tests.security.harness_probes import FAKE_SECRET, gold_file
from whale.harness import remote, shell
from whale.harness.launch import HARNESS_TOKEN_ENV, HarnessHost
from whale.metaharness.proposer.tools import ProposerTools, SandboxShell, Toolbox
from whale.metaharness.proposer.workspace import Workspace

SERVICE_ACCOUNT_TOKEN = "/var/run/secrets/kubernetes.io/serviceaccount/token"


@pytest.fixture(scope="module", params=["namespaces", "pod"])
def level_host(request: pytest.FixtureRequest) -> Iterator[tuple[str, HarnessHost]]:
    with start_harness_host(request.param) as (host, _):
        yield request.param, host


@pytest.fixture
def archive(tmp_path: Path) -> Path:
    root = tmp_path / "work" / "archive"
    (root / "candidates" / "i01-incoming").mkdir(parents=True)
    (root / "summary.md").write_text("# summary\nBest so far: i01-incoming\n")
    return root


@pytest.mark.timeout(90)
def test_a_remote_command_finds_no_credential_and_no_way_out(
    level_host: tuple[str, HarnessHost], archive: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    level, host = level_host
    gold, row = gold_file()
    (archive / "data").symlink_to(gold.parent)  # a link planted in the archive: never followed into the snapshot
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", FAKE_SECRET)  # the search pod's store credentials
    monkeypatch.setenv("WHALE_S3_SECRET_KEY", FAKE_SECRET)
    listening = socket.socket()
    listening.bind(("127.0.0.1", 0))
    listening.listen()
    listening.setblocking(False)
    port = listening.getsockname()[1]
    try:
        out = SandboxShell(archive, host=host).run_sync(
            f"env; cat {SERVICE_ACCOUNT_TOKEN}; ls; cat data/{gold.name}; "
            f"echo hi > /dev/tcp/127.0.0.1/{port} && echo CONNECTED; true",
            timeout_s=20,
        )
        connected = True
        try:
            listening.accept()[0].close()
        except BlockingIOError:
            connected = False
    finally:
        listening.close()
    assert out.startswith("exit: 0\n") and "summary.md" in out  # it ran, on the snapshot
    assert FAKE_SECRET not in out and "AWS_" not in out and "S3_SECRET" not in out
    assert HARNESS_TOKEN_ENV not in out and host.token not in out
    assert row["problem"][:30] not in out and f"data/{gold.name}: No such file or directory" in out
    assert f"{SERVICE_ACCOUNT_TOKEN}: No such file or directory" in out
    if level == "namespaces":
        assert "CONNECTED" not in out and not connected
    # at pod the socket's wall is the harness pod's NetworkPolicy (no egress): test_harness_pod.py


@pytest.mark.timeout(90)
def test_a_remote_command_writes_nothing_back_and_is_bounded(level_host: tuple[str, HarnessHost], archive: Path):
    _, host = level_host
    before = (archive / "summary.md").read_text()
    sh = SandboxShell(archive, host=host)
    out = sh.run_sync("echo owned > summary.md; touch planted; echo ok > $HOME/mine && cat $HOME/mine")
    assert "\nok\n" in out
    assert (archive / "summary.md").read_text() == before and not (archive / "planted").exists()
    # each call starts from a fresh extraction: the previous call's writes are gone
    assert "owned" not in sh.run_sync("cat summary.md; ls")
    assert sh.run_sync("sleep 100 & sleep 100", timeout_s=1).startswith("exit: stopped after 1 s")
    assert sh.run_sync("yes").startswith(f"exit: stopped: the output passed {shell.SHELL_OUTPUT_BYTES} bytes")


@pytest.mark.timeout(60)
def test_a_wrong_token_or_an_unreachable_host_comes_back_as_an_error(
    harness_host: HarnessHost, archive: Path, tmp_path: Path
) -> None:
    wrong = HarnessHost(harness_host.address, harness_host.port, "not-the-token")
    box = Toolbox(Workspace(archive, tmp_path / "scratch", 1), ProposerTools(shell=SandboxShell(archive, host=wrong)))
    answer = asyncio.run(box.call("run_shell", {"command": "ls"}))
    assert answer.startswith("error: the sandboxed shell did not run") and "wrong token" in answer


def _tar(entries: list[tarfile.TarInfo], payload: bytes = b"x") -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for info in entries:
            tar.addfile(info, io.BytesIO(payload) if info.isreg() else None)
    return buffer.getvalue()


def _entry(name: str, kind: bytes = tarfile.REGTYPE, target: str = "") -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.linkname = kind, target
    info.size = 1 if kind == tarfile.REGTYPE else 0
    return info


@pytest.mark.parametrize(
    ("entry", "why"),
    [
        (_entry("archive/../../escape"), "outside archive/ and candidates/"),
        (_entry("/etc/owned"), "outside archive/ and candidates/"),
        (_entry("elsewhere/file"), "outside archive/ and candidates/"),
        (_entry("archive/link", tarfile.SYMTYPE, "/etc/passwd"), "not a plain file or directory"),
        (_entry("archive/hard", tarfile.LNKTYPE, "archive/x"), "not a plain file or directory"),
        (_entry("archive/fifo", tarfile.FIFOTYPE), "not a plain file or directory"),
    ],
)
def test_an_unsafe_snapshot_is_refused_before_anything_is_written(
    tmp_path: Path, entry: tarfile.TarInfo, why: str
) -> None:
    dest = tmp_path / "dest"
    with pytest.raises(shell.SnapshotError, match=why):
        shell.unpack(_tar([_entry("archive/ok"), entry]), dest)
    assert not (dest / "archive" / "ok").exists()
    assert not (tmp_path / "escape").exists()


def test_a_snapshot_over_its_bounds_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(shell, "MAX_SNAPSHOT_MEMBERS", 3)
    with pytest.raises(shell.SnapshotError, match="more than 3 entries"):
        shell.unpack(_tar([_entry(f"archive/f{i}") for i in range(5)]), tmp_path / "a")
    monkeypatch.setattr(shell, "MAX_SNAPSHOT_EXTRACTED_BYTES", 10)
    with pytest.raises(shell.SnapshotError, match="extracts to more than 10 bytes"):
        big = _entry("archive/big")
        big.size = 11
        shell.unpack(_tar([big], b"y" * 11), tmp_path / "b")
    with pytest.raises(shell.SnapshotError, match="not a readable tar.gz"):
        shell.unpack(b"not a tar", tmp_path / "c")
    # the packing side refuses too, with a message the agent can act on
    (tmp_path / "arch").mkdir()
    for i in range(5):
        (tmp_path / "arch" / f"f{i}").write_text("z")
    with pytest.raises(shell.SnapshotError, match="too large to send"):
        shell.pack(tmp_path / "arch", None)


async def test_the_host_refuses_a_snapshot_larger_than_it_accepts(harness_host: HarnessHost) -> None:
    reader, writer = await remote.connect(harness_host, 10)
    try:
        line = {"token": harness_host.token, "kind": remote.SHELL, "command": "ls", "timeout_s": 5}
        writer.write(json.dumps({**line, "snapshot_bytes": shell.MAX_SNAPSHOT_BYTES + 1}).encode() + b"\n")
        await writer.drain()
        got = await asyncio.wait_for(remote.read_frame(reader), 20)
    finally:
        writer.close()
    assert got is not None and got[0] == remote.STATUS
    answer = json.loads(got[1])
    assert answer["ok"] is False and "snapshot_bytes must be an integer" in answer["error"]
