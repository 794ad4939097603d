"""Hostile harness files, written as a proposer could write them (the attack report of issue #12), and
what the security tests need around them: where the gold data is, and a reader for the probe's report.

A probe harness tries each way in inside ``start`` and reports, for each, ``"OK: <what it got>"`` or
``"BLOCKED: <exception type>"`` in the content of the one message it returns. These files do not pass
the static gate (that is tested on its own); the tests run them straight through the runtime, as a file
that slipped past the gate would run.
"""

from __future__ import annotations

import ast
import json
import textwrap
from pathlib import Path
from typing import Any

import whale
from whale.domain import default_data_root

#: the checkout the tests run from (a harness must not read it)
CHECKOUT = Path(whale.__file__).resolve().parents[1]
#: a fake credential the tests put into the runtime's environment
FAKE_SECRET = "sk-whale-fake-secret-0123456789"


def gold_file() -> tuple[Path, dict[str, Any]]:
    """The AIME 2024 file of the shipped sample data (the report's target) and its first row."""
    path = default_data_root() / "math_reasoning" / "aime_2024.jsonl"
    row = json.loads(path.read_text(encoding="utf-8").splitlines()[0])
    return path, {"id": str(row["id"]), "problem": row["problem"], "answer": str(row["answer"]).strip()}


PROBE_HEADER = """\
import random
import socket
from whale.harness.api import BaseHarness, Decision

os = random._os   # the report's way in: a module attribute that is the os module


def attempt(results, name, fn):
    try:
        value = fn()
        results[name] = "OK: " + repr(value)[:300]
    except BaseException as exc:
        results[name] = "BLOCKED: " + type(exc).__name__


def read_fd(fd):
    data = b""
    while True:
        chunk = os.read(fd, 65536)
        if not chunk:
            return data
        data += chunk


class Harness(BaseHarness):
    def start(self, task, state):
        results = {}
"""


def probe_harness(tmp_path: Path, attempts: dict[str, str], name: str = "probe.py") -> Path:
    """A probe harness whose ``start`` runs each attempt (an expression, name -> source)."""
    lines = [f"        attempt(results, {key!r}, lambda: {expr})" for key, expr in attempts.items()]
    body = "\n".join(lines) + '\n        return Decision(messages=[{"role": "user", "content": repr(results)}])\n'
    path = tmp_path / name
    path.write_text(PROBE_HEADER + body, encoding="utf-8")
    return path


def report(content: str) -> dict[str, str]:
    """The probe's report from the content of its message."""
    return ast.literal_eval(content)


def attack_attempts(gold: Path, target_dir: Path, listener_port: int) -> dict[str, str]:
    """Every way in of the attack report (and neighbours), as expressions for :func:`probe_harness`."""
    verifier = CHECKOUT / "domains" / "math_reasoning" / "verifier.py"
    return {
        "bytes-path os.open of the gold file": f"read_fd(os.open({str(gold).encode()!r}, os.O_RDONLY))",
        "str-path os.open of the gold file": f"read_fd(os.open({str(gold)!r}, os.O_RDONLY))",
        "os.open with a dir_fd": (
            f"read_fd(os.open({gold.name!r}, os.O_RDONLY, dir_fd=os.open({str(gold.parent)!r}, os.O_RDONLY)))"
        ),
        "gold via /proc/self/root": f"read_fd(os.open('/proc/self/root' + {str(gold)!r}, os.O_RDONLY))",
        "listing the data root": f"os.listdir({str(gold.parent)!r})",
        "scanning the data root": f"[e.name for e in os.scandir({str(gold.parent)!r})]",
        "reading the checkout": f"read_fd(os.open({str(verifier)!r}, os.O_RDONLY))",
        "os.open O_WRONLY|O_CREAT outside scratch": (
            f"os.open({str(target_dir / 'created.txt')!r}, os.O_WRONLY | os.O_CREAT, 0o644)"
        ),
        "overwriting a file outside scratch": (
            f"os.open({str(target_dir / 'verifier.py')!r}, os.O_WRONLY | os.O_TRUNC)"
        ),
        "the runtime's environ via /proc/<ppid>": "read_fd(os.open('/proc/%d/environ' % os.getppid(), os.O_RDONLY))",
        "its own environ": "dict(os.environ)",
        "import whale.rsft": "__import__('whale.rsft').rsft",
        "import math_reasoning": "__import__('math_reasoning')",
        "connecting a socket": f"socket.create_connection(('127.0.0.1', {listener_port}), timeout=2)",
        "opening a descriptor by number": "open(0).read()",
        "a subprocess": "os.system('true')",
        "frame introspection": "(lambda g: (next(g), g.gi_frame.f_back))((i for i in [1]))",
    }


#: runs the probe in a fresh runtime process (argv: harness path), so that a secret in that process's
#: environment is in its /proc/<pid>/environ (a variable set later by a running process is not)
RUN_PROBE = r"""
import asyncio, json, os, sys
from synthetic import DOMAIN
from whale.harness.runner import run_episodes
from whale.inference.base import SamplingParams
from whale.inference.scripted import ScriptedClient

item = {"id": "probe-0", "digit": 3, "answer": "3"}
episodes = asyncio.run(run_episodes(DOMAIN, sys.argv[1], ScriptedClient(["<answer>3</answer>"]), [item],
                                    SamplingParams(), processes=1))
with open(f"/proc/{os.getpid()}/environ", "rb") as fh:
    own = fh.read().decode(errors="replace")
print(json.dumps({"error": episodes[0].error, "content": episodes[0].messages[0]["content"] if episodes[0].messages else "",
                  "trace": episodes[0].to_json(), "runtime_environ": own}))
"""


def run_probe_in_child(path: Path, env: dict[str, str]) -> dict[str, Any]:
    """Run one synthetic episode under the probe in a new runtime process with ``env`` added to its
    environment; its report, trace and that process's own /proc environ."""
    import os
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-c", RUN_PROBE, str(path)],
        capture_output=True,
        text=True,
        timeout=90,
        cwd=CHECKOUT,
        env={**os.environ, **env},
        check=False,
    )
    if done.returncode != 0:
        raise AssertionError(done.stderr[-3000:])
    return json.loads(done.stdout.strip().splitlines()[-1])


def probe_source(body: str) -> str:
    """A harness file whose ``start`` runs ``body`` (indented for you)."""
    return PROBE_HEADER + textwrap.indent(textwrap.dedent(body), "        ")
