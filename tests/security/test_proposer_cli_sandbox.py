"""The ``cli`` proposer's agent is untrusted: it runs inside the sandbox, not as a plain subprocess.

A real small agent (a Python program standing in for a coding-agent CLI) reads the archive, writes a
candidate, and tries what a hostile agent would: read the data root (the test split's gold answers),
the checkout, the parent's environment and the host's /proc; write the archive copy; reach the host's
loopback. First the same program runs the way the old backend ran it (a plain subprocess with the
parent's environment minus credential-looking names), to show each attack gets what it goes for on this
machine; then through :class:`CLIAgentProposer`, where every one of them fails and only the archive, the
workspace and the API key it is given are there.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
from pathlib import Path

import pytest

from tests.security.harness_probes import CHECKOUT, gold_file
from whale.metaharness.proposer.base import ProposalRequest
from whale.metaharness.proposer.cli_agent import CLIAgentProposer
from whale.sandbox.policy import SECRET_NAME_RE
from whale.sandbox.process import base_python

AGENT = r"""
import json, os, pathlib, socket, sys
scratch, archive = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
gold, checkout_file, port = sys.argv[3], sys.argv[4], int(sys.argv[5])
results = {}


def attempt(name, fn):
    try:
        results[name] = "OK: " + repr(fn())[:200]
    except BaseException as exc:
        results[name] = "BLOCKED: " + type(exc).__name__


attempt("read the archive", lambda: (archive / "summary.md").read_text())
attempt("read the data root", lambda: open(gold).read())
attempt("list the data root", lambda: os.listdir(os.path.dirname(gold)))
attempt("read the checkout", lambda: open(checkout_file).read())
attempt("write the archive copy", lambda: open(archive / "summary.md", "a").write("owned"))
attempt("add to the archive copy", lambda: open(archive / "planted.txt", "w").write("owned"))
attempt("host loopback", lambda: socket.create_connection(("127.0.0.1", port), timeout=3).send(b"hi"))
attempt("init's environ", lambda: open("/proc/1/environ", "rb").read())
attempt("the parent's environ", lambda: open("/proc/%d/environ" % int(sys.argv[6]), "rb").read())
results["environ"] = sorted(os.environ)
results["marker"] = os.environ.get("WHALE_PARENT_MARKER")
results["key"] = os.environ.get("AGENT_API_KEY")
out = scratch / "candidates"
out.mkdir(exist_ok=True)
(out / "probe.py").write_text("# a candidate\n")
print("REPORT " + json.dumps(results), flush=True)
"""

BLOCKED = (
    "read the data root",
    "list the data root",
    "read the checkout",
    "write the archive copy",
    "add to the archive copy",
    "init's environ",
    "the parent's environ",
)


@pytest.fixture
def setup(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    gold, row = gold_file()
    archive = tmp_path / "work" / "archive"
    archive.mkdir(parents=True)
    (archive / "summary.md").write_text("# summary\nBest so far: i01-incoming\n")
    agent = tmp_path / "agent-install"
    agent.mkdir()
    (agent / "agent.py").write_text(AGENT)
    monkeypatch.setenv("WHALE_PARENT_MARKER", "parent-marker-7f3a")
    monkeypatch.setenv("WHALE_TEST_SECRET_TOKEN", "sk-parent-secret-0b5d")
    return {"gold": gold, "row": row, "archive": archive, "agent": agent, "tmp": tmp_path}


def _argv(setup: dict, port: int) -> list[str]:
    return [
        base_python(),
        str(setup["agent"] / "agent.py"),
        "{scratch}",
        "{archive}",
        str(setup["gold"]),
        str(CHECKOUT / "whale" / "__init__.py"),
        str(port),
        str(os.getpid()),
    ]


def _report(output: str) -> dict:
    line = next(line for line in output.splitlines() if line.startswith("REPORT "))
    return json.loads(line.removeprefix("REPORT "))


def _request(setup: dict, timeout_s: float = 60) -> ProposalRequest:
    return ProposalRequest(
        iteration=2,
        count=1,
        archive_dir=setup["archive"],
        scratch_dir=setup["tmp"] / "scratch",
        skill="skill",
        incoming_code="class Harness: pass",
        incoming_id="i01-incoming",
        prompt_only=False,
        allowed_imports=(),
        timeout_s=timeout_s,
        max_turns=5,
        max_tokens=1000,
    )


@pytest.mark.timeout(120)
def test_the_old_plain_subprocess_reaches_what_the_attacks_go_for(setup: dict, listener):
    """What the sandbox must stop is really there: the old backend's way of running the agent gets it."""
    port, connected = listener
    argv = [
        a.replace("{scratch}", str(setup["tmp"])).replace("{archive}", str(setup["archive"]))
        for a in _argv(setup, port)
    ]
    (setup["tmp"] / "candidates").mkdir()
    env = {k: v for k, v in os.environ.items() if not SECRET_NAME_RE.search(k)}  # the old backend's environment
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60, env=env, check=True)
    got = _report(done.stdout)
    assert got["read the data root"].startswith("OK") and setup["row"]["problem"][:30] in got["read the data root"]
    assert got["read the checkout"].startswith("OK") and got["write the archive copy"].startswith("OK")
    assert got["marker"] == "parent-marker-7f3a"
    assert connected()


@pytest.mark.timeout(120)
def test_the_agent_in_its_sandbox_reads_the_archive_writes_a_candidate_and_nothing_else(setup: dict, listener):
    port, connected = listener
    before = (setup["archive"] / "summary.md").read_text()
    proposer = CLIAgentProposer(
        _argv(setup, port), {"AGENT_API_KEY": "sk-agent-key"}, read_paths=[str(setup["agent"])], network="none"
    )
    report = asyncio.run(proposer.propose(_request(setup)))

    assert report.stopped_by == "exit" and report.notes == [], report.notes
    assert [p.name for p in report.proposals] == ["probe"] and report.proposals[0].code == "# a candidate\n"
    got = _report(report.transcript[0]["output_tail"])
    assert "Best so far: i01-incoming" in got["read the archive"]
    assert {name: got[name] for name in BLOCKED if not got[name].startswith("BLOCKED")} == {}
    assert got["host loopback"].startswith("BLOCKED")
    assert setup["row"]["problem"][:30] not in report.transcript[0]["output_tail"]
    # only the sandbox's fixed variables and the key it is given: nothing of the parent's environment
    assert got["key"] == "sk-agent-key" and got["marker"] is None
    assert "WHALE_TEST_SECRET_TOKEN" not in got["environ"] and "WHALE_PARENT_MARKER" not in got["environ"]
    assert set(got["environ"]) <= {
        "AGENT_API_KEY",
        "HOME",
        "TMPDIR",
        "PATH",
        "LANG",
        "LC_ALL",
        "PYTHONDONTWRITEBYTECODE",
        "PYTHONIOENCODING",
        "OMP_NUM_THREADS",
        "OPENBLAS_NUM_THREADS",
        "MKL_NUM_THREADS",
        "TOKENIZERS_PARALLELISM",
        "MPLBACKEND",
        "TZ",
        "IS_SANDBOX",  # the reference's wrapper tells Claude Code it runs sandboxed (a flag, no secret)
    }
    # the archive copy is unchanged, and the host's loopback saw nothing
    assert (setup["archive"] / "summary.md").read_text() == before
    assert not (setup["archive"] / "planted.txt").exists()
    assert not connected()
    assert report.transcript[0]["isolation"]["network"] == "netns"


@pytest.mark.timeout(120)
def test_with_network_host_the_agent_reaches_the_network_and_still_nothing_else(setup: dict, listener):
    """``network: host`` (asked for by name: the agent reaches what its launcher reaches) opens the network only."""
    port, connected = listener
    proposer = CLIAgentProposer(
        _argv(setup, port), {"AGENT_API_KEY": "k"}, read_paths=[str(setup["agent"])], network="host"
    )
    report = asyncio.run(proposer.propose(_request(setup)))
    got = _report(report.transcript[0]["output_tail"])
    assert got["host loopback"].startswith("OK") and connected()
    assert {name: got[name] for name in BLOCKED if not got[name].startswith("BLOCKED")} == {}
    assert got["marker"] is None and report.transcript[0]["isolation"]["network"] == "host"


@pytest.mark.timeout(120)
def test_every_process_of_the_agent_is_killed_at_its_deadline(setup: dict, tmp_path: Path):
    """A session past its timeout is killed with everything it started, a setsid'd escapee included."""
    sleep = f"time.sleep(600.{os.getpid()})"  # names this test's processes only
    escapee = tmp_path / "agent-install" / "escape.py"
    escapee.write_text(
        "import os, subprocess, sys, time\n"
        f"subprocess.Popen([sys.executable, '-c', 'import time; {sleep}'], start_new_session=True)\n"
        "print('pid', os.getpid(), flush=True)\n"
        f"{sleep}\n"
    )
    proposer = CLIAgentProposer([base_python(), str(escapee)], read_paths=[str(setup["agent"])], network="none")
    report = asyncio.run(proposer.propose(_request(setup, timeout_s=2)))
    assert report.stopped_by == "timeout" and report.seconds < 40
    # nothing of the sandbox is left: no process runs the escapee's sleep
    leftovers = subprocess.run(["pgrep", "-f", sleep], capture_output=True, text=True, check=False)
    ours = [pid for pid in leftovers.stdout.split() if _is_sandboxed(int(pid))]
    assert ours == []


def _is_sandboxed(pid: int) -> bool:
    """A process under a sandbox uid (the launcher's, >= 200000): one this test's sandbox left behind."""
    try:
        with open(f"/proc/{pid}/status") as fh:
            uid = next(int(line.split()[1]) for line in fh if line.startswith("Uid:"))
    except (OSError, StopIteration):
        return False
    return uid >= 200_000
