"""A ``cli`` proposer's agent on a cluster: the process tree that runs it holds only the agent's API key.

The search container holds the store credentials, the vLLM key and the harness host's caller token; before issue #29's
wall the agent's sandbox was started from that same process, so the agent's only wall against them was the sandbox.
Now the search hands each session to the ``proposer-agent`` container's runner
(:mod:`whale.metaharness.proposer.agent_exchange`) through a shared directory. Here both sides run for real: the
runner as its own process, started with exactly the command and environment the operator renders for that container
(the Secret's value filled in), the search side in this process with the search container's keys in its environment,
and the hostile agent of tests/security/test_proposer_cli_sandbox.py inside the runner's sandbox.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.fixtures.kube import wait_for
from tests.security.harness_probes import CHECKOUT, gold_file
from tests.security.test_proposer_cli_sandbox import AGENT, BLOCKED, _report, _request
from whale.metaharness.proposer import agent_exchange as ex
from whale.metaharness.proposer.base import ProposerError, ProposerUnavailable
from whale.metaharness.proposer.cli_agent import AgentJob, AgentWalls, CLIAgentProposer
from whale.sandbox.process import base_python
from whale.tools.process import stop_process
from whale_operator import builders
from whale_operator.cluster_spec import ClusterRunSpec

pytestmark = pytest.mark.timeout(120)

#: what the search container holds (and the agent must never): store keys, the vLLM key, the caller token
SEARCH_KEYS = {
    "AWS_ACCESS_KEY_ID": "AKIA-search-store-key",
    "AWS_SECRET_ACCESS_KEY": "store-secret-9c1e",
    "WHALE_INFERENCE_API_KEY": "vllm-key-41d2",
    "WHALE_HARNESS_TOKEN": "caller-token-77aa",
}
AGENT_KEY = "sk-agent-key-5e0f"


def cli_spec(agent_install: Path) -> ClusterRunSpec:
    from tests.operator.test_least_privilege import EXAMPLES, wire_of

    wire = wire_of(next(p for p in EXAMPLES if p.stem == "math-whale"))
    proposer = {
        "backend": "cli",
        "command": ["agent", "{prompt}"],
        "network": "none",
        "readPaths": [str(agent_install)],
        "apiKeySecret": {"name": "whale-proposer", "key": "api-key", "env": "AGENT_API_KEY"},
    }
    return ClusterRunSpec.model_validate({**wire, "harnessSearch": {**wire["harnessSearch"], "proposer": proposer}})


def rendered_runner(spec: ClusterRunSpec, exchange: Path, secrets: dict[str, str]) -> tuple[list[str], dict[str, str]]:
    """The operator's proposer-agent container as a local process: its command (this interpreter, this exchange
    directory) and its environment (every entry it renders, each Secret reference resolved; PATH as an image has)."""
    container = builders.proposer_agent_container(spec)
    command = [sys.executable if a == "python" else a for a in container["command"]]
    command[command.index("--exchange") + 1] = str(exchange)
    env = {"PATH": os.environ["PATH"]}
    for entry in container["env"]:
        ref = entry.get("valueFrom", {}).get("secretKeyRef")
        env[entry["name"]] = secrets[f"{ref['name']}/{ref['key']}"] if ref else entry["value"]
    assert "envFrom" not in container
    return command, env


@pytest.fixture
def setup(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    gold, row = gold_file()
    exchange = tmp_path / "whale-agent"
    archive = exchange / "whale-search-x" / "archive"  # the search's workdir is on the shared volume
    archive.mkdir(parents=True)
    (archive / "summary.md").write_text("# summary\nBest so far: i01-incoming\n")
    agent = tmp_path / "agent-install"
    agent.mkdir()
    (agent / "agent.py").write_text(AGENT)
    for name, value in SEARCH_KEYS.items():  # this process plays the search container
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("WHALE_PARENT_MARKER", "parent-marker-7f3a")
    return {"gold": gold, "row": row, "archive": archive, "agent": agent, "tmp": tmp_path, "exchange": exchange}


@pytest.fixture
def runner(setup: dict[str, Any]) -> Iterator[subprocess.Popen[str]]:
    command, env = rendered_runner(cli_spec(setup["agent"]), setup["exchange"], {"whale-proposer/api-key": AGENT_KEY})
    proc = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        wait_for(
            lambda: (setup["exchange"] / ex.READY).exists() or proc.poll() is not None, 30, what="the runner's ready"
        )
        assert proc.poll() is None, proc.communicate(timeout=10)[0]
        yield proc
    finally:
        stop_process(proc)


def environ_of(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes()
    return dict(item.split("=", 1) for item in raw.decode().split("\0") if "=" in item)


def agent_argv(setup: dict[str, Any], port: int) -> list[str]:
    return [
        base_python(),
        str(setup["agent"] / "agent.py"),
        "{scratch}",
        "{archive}",
        str(setup["gold"]),
        str(CHECKOUT / "whale" / "__init__.py"),
        str(port),
        str(os.getpid()),  # the search process: holds the store keys
    ]


def test_the_agents_process_tree_holds_its_key_and_none_of_the_searchs(setup: dict[str, Any], runner, listener):
    port, connected = listener
    # the runner (the agent's parent, PID 1's side of its sandbox) holds the agent's key and nothing of the search's
    seen = environ_of(runner.pid)
    assert seen.get("AGENT_API_KEY") == AGENT_KEY
    assert not set(SEARCH_KEYS) & set(seen) and not any(v in seen.values() for v in SEARCH_KEYS.values())
    # the search side: no key, the exchange launcher (as from_spec builds it from the search container's environment)
    proposer = CLIAgentProposer(agent_argv(setup, port), launcher=ex.ExchangeLauncher(setup["exchange"]))
    report = asyncio.run(proposer.propose(_request(setup)))
    assert report.stopped_by == "exit" and report.notes == [], report.notes
    assert [p.name for p in report.proposals] == ["probe"] and report.proposals[0].code == "# a candidate\n"
    tail = report.transcript[0]["output_tail"]
    got = _report(tail)
    assert "Best so far: i01-incoming" in got["read the archive"]  # the archive copy, read at the search's path
    assert {name: got[name] for name in BLOCKED if not got[name].startswith("BLOCKED")} == {}
    assert got["key"] == AGENT_KEY and got["marker"] is None
    assert not set(SEARCH_KEYS) & set(got["environ"]) and not any(v in tail for v in SEARCH_KEYS.values())
    assert not connected() and report.transcript[0]["isolation"]["network"] == "netns"
    # every file of the session is gone from the exchange but the runner's ready mark
    left = sorted(p.relative_to(setup["exchange"]).as_posix() for p in setup["exchange"].rglob("*") if p.is_file())
    assert [p for p in left if not p.startswith("whale-search-x/")] == [ex.READY]


def test_the_runner_refuses_to_serve_where_it_sees_a_credential_of_the_search(setup: dict[str, Any], capsys):
    argv = ["--exchange", str(setup["exchange"]), "--key-env", "AGENT_API_KEY"]
    for name, value in SEARCH_KEYS.items():
        assert ex.main(argv, environ={"AGENT_API_KEY": AGENT_KEY, name: value}) == 2
        assert f"${name}" in capsys.readouterr().err
    assert not (setup["exchange"] / ex.READY).exists()  # it never said it was ready
    assert ex.main(argv, environ={}) == 2 and "$AGENT_API_KEY" in capsys.readouterr().err
    token = setup["tmp"] / "token"
    token.write_text("t")
    assert ex.exposure({"AGENT_API_KEY": AGENT_KEY}, "AGENT_API_KEY", token) == [
        f"a service-account token at {token} (set automountServiceAccountToken: false)"
    ]
    assert ex.exposure({"AGENT_API_KEY": AGENT_KEY}, "AGENT_API_KEY", setup["tmp"] / "none") == []


def test_without_its_container_the_search_fails_closed_naming_it(setup: dict[str, Any]):
    proposer = CLIAgentProposer(["agent"], launcher=ex.ExchangeLauncher(setup["exchange"], ready_wait_s=0.3))
    with pytest.raises(ProposerUnavailable, match="proposer-agent container is not running"):
        asyncio.run(proposer.propose(_request(setup)))
    # ready, but it never answers: the request is withdrawn at the deadline and the search fails
    (setup["exchange"] / ex.READY).write_text("{}")
    launcher = ex.ExchangeLauncher(setup["exchange"], answer_margin_s=0.2, grace_s=0)
    job = AgentJob(files={}, archive_dir=str(setup["archive"]), timeout_s=0.3)
    with pytest.raises(ProposerUnavailable, match="did not answer request .* within 0 s.*-c proposer-agent"):
        launcher.run(job)
    assert list((setup["exchange"] / ex.REQUESTS).iterdir()) == []


def test_the_runner_refuses_what_it_should_not_run(setup: dict[str, Any]):
    walls = AgentWalls(network="none")
    requests = setup["exchange"] / ex.REQUESTS
    requests.mkdir(parents=True)
    outside = AgentJob(files={}, archive_dir=str(setup["tmp"]), timeout_s=5)
    cases = {
        "outside": (outside.to_wire(), "outside the exchange directory"),
        "unisolated": ({**outside.to_wire(), "isolation": "none"}, "runs agents at isolation namespaces"),
        "timeout": ({**outside.to_wire(), "timeoutS": True}, "timeoutS"),
        "files": ({**outside.to_wire(), "files": {"a": 1}}, "files must map names to texts"),
    }
    for name, (wire, said) in cases.items():
        path = requests / f"{name}.json"
        path.write_text(json.dumps(wire))
        assert said in ex.handle(setup["exchange"], path, walls, "namespaces")["error"], name
    path = requests / "garbled.json"
    path.write_text("{")
    assert "malformed" in ex.handle(setup["exchange"], path, walls, "namespaces")["error"]


def test_jobs_and_results_round_trip():
    job = AgentJob(files={"PROMPT.md": "p"}, archive_dir="/whale-agent/a", timeout_s=60.0, isolation="namespaces")
    assert AgentJob.from_wire(json.loads(json.dumps(job.to_wire()))) == job
    from whale.sandbox import SandboxResult
    from whale.sandbox.policy import Outcome

    result = SandboxResult(
        outcome=Outcome.TIMEOUT,
        returncode=None,
        stdout="o",
        stderr="e",
        error_type="SIGKILL",
        wall_s=1.5,
        isolation={"network": "netns"},
        stdout_truncated=True,
        files={"whale-result.json": b"\x00\xff{}"},
        files_not_collected={"x": "missing"},
    )
    assert ex.result_from_wire(json.loads(json.dumps(ex.result_to_wire(result)))) == result
    with pytest.raises(ProposerError, match="malformed"):
        ex.result_from_wire({"outcome": "exploded"})


def test_the_operator_starts_this_module():
    assert builders.AGENT_RUNNER_MODULE == ex.RUNNER_MODULE
