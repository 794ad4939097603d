"""The other proposer paths through the real search workload: an external agent CLI (a real
subprocess that reads the archive and writes a candidate), a CLI that hangs past its timeout, and
an unreachable chat endpoint. Failures are recorded and the phase still ends with a result."""

from __future__ import annotations

import socket
import sys
import time
from pathlib import Path

import pytest

from tests.component.test_search_phase import GOOD, PHASE, RUN, SETTINGS, _request, _spec
from tests.fixtures.proposer_double import DigitSayerPolicyDouble
from whale import layout
from whale.metaharness.archive import Archive
from whale.store import open_store
from whale.workloads.search import run_search

AGENT_CLI = '''
import pathlib, sys
scratch, archive, n = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2]), int(sys.argv[3])
prompt = sys.stdin.read()
assert "Harness search, iteration" in prompt, prompt[:200]
traces = (archive / "candidates" / "i01-incoming" / "traces.jsonl").read_text()
assert "The digit is" in traces
out = scratch / "candidates"
out.mkdir()
(out / "extract.py").write_text(pathlib.Path(sys.argv[4]).read_text())
(out / "extract.md").write_text("Traces show the digit without the tag; wrap it.")
print("wrote 1 candidate of", n)
'''


def _cli_spec(command: list[str], timeout_s: int = 60) -> dict:
    spec = _spec("http://unused/v1")
    spec["harnessSearch"]["proposer"] = {"backend": "cli", "command": command, "timeoutSeconds": timeout_s}
    return spec


@pytest.mark.timeout(120)
def test_cli_agent_writes_a_candidate_that_is_accepted(tmp_path: Path):
    agent = tmp_path / "agent.py"
    agent.write_text(AGENT_CLI)
    good = tmp_path / "good.py"
    good.write_text(GOOD)
    store = open_store(str(tmp_path / "store"))
    _request(store, _cli_spec([sys.executable, str(agent), "{scratch}", "{archive}", "{n}", str(good)]), iterations=2)
    result = run_search(store, RUN, PHASE, client=DigitSayerPolicyDouble(), settings=SETTINGS)
    assert result.accepted_candidate == "i02-c1" and result.accepted_score == 1.0
    archive = Archive(store, layout.archive_prefix(RUN, 1))
    record = store.read_json(archive.iteration_key(2))
    assert record["backend"] == "cli" and record["proposals"] == ["extract"] and record["notes"] == []
    assert "wrote 1 candidate of 3" in store.read_text(archive.key("iterations", "02-transcript.jsonl"))
    assert store.read_text(archive.candidate_key("i02-c1", "rationale.md")).startswith("Traces show")


@pytest.mark.timeout(120)
def test_hanging_cli_is_killed_at_its_timeout_and_the_phase_goes_on(tmp_path: Path):
    store = open_store(str(tmp_path / "store"))
    _request(store, _cli_spec([sys.executable, "-c", "import time; time.sleep(600)"], timeout_s=2), iterations=2)
    t0 = time.monotonic()
    result = run_search(store, RUN, PHASE, client=DigitSayerPolicyDouble(), settings=SETTINGS)
    assert time.monotonic() - t0 < 60
    assert result.accepted_candidate == "i01-incoming" and result.iterations == 2
    record = store.read_json(Archive(store, layout.archive_prefix(RUN, 1)).iteration_key(2))
    assert record["stopped_by"] == "timeout" and any("timeout" in n for n in record["notes"])
    assert record["candidates"] == []


@pytest.mark.timeout(120)
def test_unreachable_chat_endpoint_is_recorded_not_fatal(tmp_path: Path):
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    store = open_store(str(tmp_path / "store"))
    _request(store, _spec(f"http://127.0.0.1:{port}/v1"), iterations=2)
    result = run_search(store, RUN, PHASE, client=DigitSayerPolicyDouble(), settings=SETTINGS)
    assert result.iterations == 2 and result.accepted_candidate == "i01-incoming"
    record = store.read_json(Archive(store, layout.archive_prefix(RUN, 1)).iteration_key(2))
    assert record["stopped_by"] == "error" and "cannot reach" in record["notes"][0]
