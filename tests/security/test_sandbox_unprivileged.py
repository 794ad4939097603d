"""The same walls when the caller is not root (the user-namespace path).

The launcher runs in a process that dropped to an unused uid (``setpriv``; the system ``python3``,
since the venv's interpreter lives under root's home). The sandbox then maps that uid to root in a
first user namespace for the setup, and runs the program as an unprivileged uid of a second one.
Each attack from the root tests that behaves differently without root is repeated here: the caller's
home and environment, host processes, signals to the caller, escapees, capabilities over the mounts.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import textwrap
from pathlib import Path

import pytest

from tests.security import sandbox_attacks as attacks
from whale.domain import default_data_root

REPO = Path(__file__).resolve().parents[2]
SYSTEM_PYTHON = "/usr/bin/python3"
UNUSED_UID = 65534  # nobody: owns no process and no file the test relies on
SECRET = "whale-fake-secret-for-nobody-81c2"

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or not shutil.which("setpriv") or not Path(SYSTEM_PYTHON).exists(),
    reason="needs root (to become an unused uid), setpriv and a system python3",
)

CALLER = '''
import json, os, sys
sys.path.insert(0, {repo!r})
from tests.security import sandbox_attacks as attacks
from whale.sandbox import Limits, run_python

results = {{}}
def run(name, code, **kw):
    r = run_python(code, **kw)
    results[name] = {{"outcome": r.outcome.value, "stdout": r.stdout, "stderr": r.stderr[-2000:],
                     "isolation": r.isolation}}

run("read", attacks.read_attack({data!r}, {checkout!r}))
run("home", attacks.PRELUDE + """
attempt("caller's key", lambda: open({key!r}).read())
attempt("libc caller's key", lambda: c_read({key!r}))
attempt("libc caller's home", lambda: c_read({home!r}))
report()
""")
run("credentials", attacks.credential_attack({secret!r}))
run("writes", attacks.write_attack([{victim!r}, "/tmp/x", "/run/lock/x"]))
run("signals", attacks.SIGNAL_ATTACK)
run("escapee", attacks.escapee({mark!r}) + "print('main exits')\\n")
run("network", attacks.PRELUDE + """
import socket
attempt("libc tcp", lambda: c_socket(socket.AF_INET).connect(("127.0.0.1", 9)))
report()
""")
run("walls", attacks.PRELUDE + """
status = dict(l.split(":", 1) for l in open("/proc/self/status").read().splitlines() if ":" in l)
print(json.dumps({{k: status[k].strip() for k in ("CapEff", "CapPrm", "CapBnd", "NoNewPrivs", "Uid")}}))
attempt("umount /usr", lambda: c_umount("/usr"))
attempt("remount / rw", lambda: c_remount_rw("/"))
report()
""")
print(json.dumps(results))
'''


@pytest.fixture(scope="module")
def nobody_results() -> dict:
    work = Path(tempfile.mkdtemp(prefix="whale-nobody-"))  # pytest's tmp dirs are root-only
    try:
        work.chmod(0o755)
        files = sorted((default_data_root() / "math_reasoning").glob("*.jsonl"))
        if not files:  # this checkout has no data root: a planted stand-in the unused uid could read
            files = [work / "aime_2024.jsonl"]
            files[0].write_text('{"id": "planted", "answer": "204"}\n')
            files[0].chmod(0o644)
        home = work / "home"
        (home / ".ssh").mkdir(parents=True)
        key = home / ".ssh" / "id_rsa"
        key.write_text("-----BEGIN FAKE KEY-----\n")
        victim_dir = work / "writable"
        victim_dir.mkdir()
        for path in (home, home / ".ssh", key, victim_dir):
            os.chown(path, UNUSED_UID, UNUSED_UID)
        mark = attacks.marker()
        script = work / "caller.py"
        script.write_text(
            textwrap.dedent(CALLER).format(
                repo=str(REPO),
                data=str(files[0]),
                checkout=str(REPO / "pyproject.toml"),
                key=str(key),
                home=str(home),
                secret=SECRET,
                victim=str(victim_dir / "pwned"),
                mark=mark,
            )
        )
        env = {
            "HOME": str(home),
            "PATH": "/usr/bin:/bin",
            "WHALE_FAKE_API_KEY": SECRET,
            "PLAIN": SECRET,
            "WHALE_DATA_DIR": str(default_data_root()),
        }
        done = subprocess.run(
            [
                "setpriv",
                "--reuid",
                str(UNUSED_UID),
                "--regid",
                str(UNUSED_UID),
                "--clear-groups",
                SYSTEM_PYTHON,
                str(script),
            ],
            capture_output=True,
            text=True,
            timeout=100,
            cwd=str(work),
            env=env,
        )
        assert done.returncode == 0, done.stderr[-3000:]
        results = json.loads(done.stdout.strip().splitlines()[-1])
        results["_host"] = {"escapees": attacks.host_pids_with(mark), "victim_exists": (victim_dir / "pwned").exists()}
        return results
    finally:
        shutil.rmtree(work, ignore_errors=True)


def verdicts(results: dict, name: str) -> dict[str, str]:
    run = results[name]
    assert run["outcome"] == "ok", run["stderr"]
    return attacks.parse(run["stdout"])


def test_the_user_namespace_path_is_taken(nobody_results):
    iso = nobody_results["read"]["isolation"]
    assert iso["level"] == "namespaces" and iso["user_namespace"] is True
    assert iso["pid_namespace"] is True and iso["network"] == "netns" and iso["root"] == "pivot_root"
    assert iso["capabilities"] == "none" and iso["uid"] == 1000


def test_data_root_and_checkout_are_invisible(nobody_results):
    v = verdicts(nobody_results, "read")
    assert attacks.succeeded(v) == {}
    assert v["libc data"] == v["libc checkout"] == "refused:FileNotFoundError:2"
    assert v["import whale"] == "refused:ModuleNotFoundError:"


def test_the_callers_home_is_invisible(nobody_results):
    v = verdicts(nobody_results, "home")
    assert attacks.succeeded(v) == {}
    assert v["libc caller's key"] == v["libc caller's home"] == "refused:FileNotFoundError:2"


def test_the_callers_environment_and_processes_are_invisible(nobody_results):
    run = nobody_results["credentials"]
    assert SECRET not in run["stdout"]
    v = verdicts(nobody_results, "credentials")
    assert attacks.succeeded(v) == {}
    seen = attacks.info(run["stdout"])
    assert seen["pids"] == [1, seen["me"]] and seen["ppid"] == 1


def test_writes_outside_scratch_leave_nothing(nobody_results):
    v = verdicts(nobody_results, "writes")
    assert attacks.succeeded(v) == {}
    assert "inside ok" in nobody_results["writes"]["stdout"]
    assert nobody_results["_host"]["victim_exists"] is False


def test_signals_do_not_reach_the_caller(nobody_results):
    # the caller (same host uid as the program) survived kill(-1, SIGKILL) and kill(ppid): it went on
    # to run the later attacks and print all results
    assert "still here" in nobody_results["signals"]["stdout"]
    assert "walls" in nobody_results


def test_escapee_is_killed(nobody_results):
    assert "main exits" in nobody_results["escapee"]["stdout"]
    assert nobody_results["_host"]["escapees"] == []


def test_no_network(nobody_results):
    v = verdicts(nobody_results, "network")
    assert v["libc tcp"] == "refused:OSError:101"


def test_no_capabilities_over_its_walls(nobody_results):
    run = nobody_results["walls"]
    caps = attacks.info(run["stdout"])
    assert caps["CapEff"] == caps["CapPrm"] == caps["CapBnd"] == "0000000000000000"
    assert caps["NoNewPrivs"] == "1"
    v = verdicts(nobody_results, "walls")
    assert v == {"umount /usr": "refused:PermissionError:1", "remount / rw": "refused:PermissionError:1"}  # EPERM
