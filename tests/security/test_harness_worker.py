"""The harness worker's own walls, each alone, in a plain subprocess without the process sandbox: the
import confinement (what ``python -I -S`` gives) and the audit hook (defence in depth). The sandbox is
the wall (``test_harness_attacks.py``); these show that each inner layer holds by itself too."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.security.harness_probes import CHECKOUT, FAKE_SECRET, attack_attempts, gold_file, probe_harness, report
from whale.harness.launch import stage_worker_package, stdlib_dirs

#: the worker as the sandbox's entry file runs it, minus the sandbox: argv = package dir, harness, allow list
_HOOK_ONLY = r"""
import json, sys
package, harness, allowed, stdlib = sys.argv[1], sys.argv[2], json.loads(sys.argv[3]), json.loads(sys.argv[4])
sys.path.insert(0, package)
from whale.harness.worker import serve_entry
functions = serve_entry({"harness": harness, "allowed": allowed, "package_dir": package, "stdlib_dirs": stdlib})
print(json.dumps(functions["start"](task={}, state={})))
"""

#: confinement alone, no audit hook: argv = package dir, scratch
_CONFINE_ONLY = r"""
import importlib, json, sys
package, scratch, stdlib = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
sys.path.insert(0, package)
from whale.harness.worker import confine_imports
confine_imports(package, stdlib, scratch)
out = {}
for name in ("json", "re", "whale.harness.api", "whale.rsft", "whale.domain", "math_reasoning", "synthetic",
             "pydantic", "torch", "numpy"):
    try:
        module = importlib.import_module(name)
        out[name] = "OK " + str(getattr(module, "__file__", ""))
    except ImportError as exc:
        out[name] = "ImportError " + type(exc).__name__
print(json.dumps({"imports": out, "sys_path": sys.path}))
"""


def run(script: str, *args: str, env_extra: dict[str, str] | None = None) -> dict:
    import os

    done = subprocess.run(
        [sys.executable, "-I", "-c", script, *args],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=CHECKOUT,
        env={**os.environ, **(env_extra or {})},
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.fixture()
def package(tmp_path: Path) -> Path:
    return stage_worker_package(tmp_path / "pkg")


def test_the_staged_package_holds_four_read_only_files(package: Path) -> None:
    files = sorted(str(p.relative_to(package)) for p in package.rglob("*") if p.is_file())
    assert files == [
        "whale/__init__.py",
        "whale/harness/__init__.py",
        "whale/harness/api.py",
        "whale/harness/worker.py",
    ]
    assert (
        (package / "whale" / "__init__.py").read_text()
        == ""
        == (package / "whale" / "harness" / "__init__.py").read_text()
    )
    assert all(p.stat().st_mode & 0o222 == 0 for p in package.rglob("*"))


def test_confinement_alone_leaves_only_the_stdlib_and_the_package(package: Path, tmp_path: Path) -> None:
    # this interpreter's site-packages hold the checkout (an editable install) and the engines
    got = run(_CONFINE_ONLY, str(package), str(tmp_path), json.dumps(stdlib_dirs()))
    imports = got["imports"]
    assert imports["json"].startswith("OK ") and imports["re"].startswith("OK ")
    assert imports["whale.harness.api"] == f"OK {package / 'whale' / 'harness' / 'api.py'}"
    for name in ("whale.rsft", "whale.domain", "math_reasoning", "synthetic", "pydantic", "torch", "numpy"):
        assert imports[name].startswith("ImportError"), (name, imports[name])
    assert got["sys_path"][0] == str(package) and all("site-packages" not in p for p in got["sys_path"])


def test_the_audit_hook_alone_blocks_every_way_in(package: Path, tmp_path: Path) -> None:
    gold, row = gold_file()
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "verifier.py").write_text("original\n")
    attempts = attack_attempts(gold, outside, 9)  # no listener: the hook refuses the socket itself
    attempts.pop("its own environ")  # the environment is the sandbox's business (allow-listed there)
    attempts["its /proc environ"] = "read_fd(os.open('/proc/self/environ', os.O_RDONLY))"
    attempts["a relative path"] = "read_fd(os.open('probe.py', os.O_RDONLY))"
    attempts["open() of the gold file"] = f"open({str(gold)!r}).read()"
    attempts["writing with open()"] = f"open({str(outside / 'verifier.py')!r}, 'a').write('x')"
    # what the harness may still read: its own file and the standard library's sources
    probe = probe_harness(tmp_path, attempts)
    allowed_reads = {
        "its own file": f"len(read_fd(os.open({str(probe)!r}, os.O_RDONLY)))",
        "a stdlib source": "len(read_fd(os.open(random.__file__, os.O_RDONLY)))",
    }
    probe = probe_harness(tmp_path, {**attempts, **allowed_reads})

    answer = run(
        _HOOK_ONLY,
        str(package),
        str(probe),
        json.dumps(["random", "socket"]),
        json.dumps(stdlib_dirs()),
        env_extra={"WHALE_PROBE_API_KEY": FAKE_SECRET},
    )

    results = report(answer["decision"]["messages"][0]["content"])
    assert {k: v for k, v in results.items() if k in attempts and not v.startswith("BLOCKED")} == {}
    assert all(results[k].startswith("OK: ") for k in allowed_reads), results
    assert row["problem"][:30] not in json.dumps(answer) and FAKE_SECRET not in json.dumps(answer)
    assert (outside / "verifier.py").read_text() == "original\n" and not (outside / "created.txt").exists()


def test_a_failing_hook_is_an_error_value_with_the_harness_line(package: Path, tmp_path: Path) -> None:
    path = tmp_path / "bad.py"
    path.write_text(
        "from whale.harness.api import BaseHarness\n\nclass Harness(BaseHarness):\n"
        "    def start(self, task, state):\n        return 1 / 0\n"
    )
    answer = run(_HOOK_ONLY, str(package), str(path), "[]", json.dumps(stdlib_dirs()))
    assert answer == {"error": "ZeroDivisionError: division by zero (harness line 5)"}
