"""What handing a ``cli`` agent's session to the proposer-agent container costs (issue 29): the wall time of one agent
session started in-process (``whale run``'s way) against the same session over the exchange directory to a real
runner process (a cluster's way: ``python -m whale.metaharness.proposer.agent_exchange``), for an agent that writes
one candidate and exits. Each session is a real sandbox (``namespaces``, no network); the runner is started once.

    PYTHONPATH=. .venv/bin/python benchmarks/agent_exchange_overhead.py [--sessions 10] [--json OUT]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

AGENT = "import pathlib, sys; (pathlib.Path(sys.argv[1]) / 'candidates' / 'c.py').write_text('# c\\n')\n"


def session_times(proposer, request, sessions: int) -> list[float]:
    out = []
    for _ in range(sessions):
        started = time.monotonic()
        report = asyncio.run(proposer.propose(request))
        out.append(time.monotonic() - started)
        if [p.name for p in report.proposals] != ["c"]:
            raise RuntimeError(f"the session proposed {report.proposals}: {report.notes}")
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=10)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()

    from whale.metaharness.proposer import agent_exchange as ex
    from whale.metaharness.proposer.base import ProposalRequest
    from whale.metaharness.proposer.cli_agent import CLIAgentProposer
    from whale.sandbox.process import base_python

    tmp = Path(tempfile.mkdtemp(prefix="whale-exchange-bench-"))
    exchange = tmp / "whale-agent"
    archive = exchange / "work" / "archive"
    archive.mkdir(parents=True)
    (archive / "summary.md").write_text("# summary\n")
    install = tmp / "agent"
    install.mkdir()
    (install / "agent.py").write_text(AGENT)
    argv = [base_python(), str(install / "agent.py"), "{scratch}"]
    request = ProposalRequest(
        iteration=2,
        count=1,
        archive_dir=archive,
        scratch_dir=tmp / "scratch",
        skill="skill",
        incoming_code="",
        incoming_id="i01-incoming",
        prompt_only=False,
        allowed_imports=(),
        timeout_s=60,
        max_turns=1,
        max_tokens=1,
    )
    in_process = session_times(
        CLIAgentProposer(argv, read_paths=[str(install)], network="none"), request, args.sessions
    )
    runner = subprocess.Popen(
        [sys.executable, "-m", ex.RUNNER_MODULE, "--exchange", str(exchange), "--network", "none"]
        + ["--read-path", str(install)],
        env={"PATH": "/usr/bin:/bin"},
    )
    try:
        deadline = time.monotonic() + 30
        while not (exchange / ex.READY).exists():
            if time.monotonic() > deadline or runner.poll() is not None:
                raise RuntimeError("the runner did not start")
            time.sleep(0.05)
        exchanged = session_times(
            CLIAgentProposer(argv, launcher=ex.ExchangeLauncher(exchange)), request, args.sessions
        )
    finally:
        runner.terminate()
        runner.wait(timeout=10)
    result = {
        "sessions": args.sessions,
        "in_process_s": in_process,
        "exchange_s": exchanged,
        "in_process_median_s": round(statistics.median(in_process), 4),
        "exchange_median_s": round(statistics.median(exchanged), 4),
        "overhead_median_s": round(statistics.median(exchanged) - statistics.median(in_process), 4),
        "poll_s": ex.POLL_S,
    }
    text = json.dumps(result, indent=2)
    print(text)
    if args.json:
        args.json.write_text(text + "\n")


if __name__ == "__main__":
    main()
