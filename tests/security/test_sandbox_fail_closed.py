"""Fail closed: where a wall cannot be built, nothing runs — unless no isolation is asked for by name.

The refusal is real, not injected: the launcher runs inside a user namespace whose kernel limits
(``/proc/sys/user/max_*_namespaces``, per user namespace) are set to 0, as on a host or container
that forbids namespaces. Root's path (mount/PID/network namespaces) and the non-root path (a user
namespace first) are both refused there, and ``launch`` must raise ``SandboxSetupError`` naming the
step and the only alternative; the explicit ``none`` level still runs, and is shown NOT isolated.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import pytest

from whale.sandbox import Isolation, IsolationLevel, Outcome, run_python

REPO = Path(__file__).resolve().parents[2]
SYSTEM_PYTHON = "/usr/bin/python3"

CALLER = """
import ctypes, json, os, sys
libc = ctypes.CDLL(None, use_errno=True)
uid, gid = os.geteuid(), os.getegid()
if libc.unshare(0x10000000) != 0:  # CLONE_NEWUSER
    raise OSError(ctypes.get_errno(), "unshare(CLONE_NEWUSER) for the test")
open("/proc/self/setgroups", "w").write("deny")
open("/proc/self/uid_map", "w").write(f"{{uid}} {{uid}} 1")
open("/proc/self/gid_map", "w").write(f"{{gid}} {{gid}} 1")
for name in {limits!r}:  # this namespace and all below it may create none of these
    open(f"/proc/sys/user/{{name}}", "w").write("0")
sys.path.insert(0, {repo!r})
from whale.sandbox import Isolation, SandboxSetupError, run_python
out = {{}}
try:
    r = run_python("print('ran')")
    out["sandbox"] = {{"ran": True, "outcome": r.outcome.value, "isolation": r.isolation}}
except SandboxSetupError as exc:
    out["sandbox"] = {{"ran": False, "error": str(exc)}}
r = run_python("print(open({planted!r}).read())", isolation=Isolation.none())
out["none"] = {{"outcome": r.outcome.value, "stdout": r.stdout, "stderr": r.stderr[-2000:], "isolation": r.isolation}}
print(json.dumps(out))
"""


def _run_caller(limits: list[str], as_uid: int | None) -> dict:
    work = Path(tempfile.mkdtemp(prefix="whale-failclosed-"))
    try:
        work.chmod(0o755)
        planted = work / "host-file.txt"
        planted.write_text("a host file the none level can read")
        planted.chmod(0o644)
        script = work / "caller.py"
        script.write_text(textwrap.dedent(CALLER).format(limits=limits, repo=str(REPO), planted=str(planted)))
        if as_uid is None:
            argv = [sys.executable, str(script)]
        else:
            argv = [
                "setpriv",
                "--reuid",
                str(as_uid),
                "--regid",
                str(as_uid),
                "--clear-groups",
                SYSTEM_PYTHON,
                str(script),
            ]
        done = subprocess.run(
            argv,
            capture_output=True,
            text=True,
            timeout=60,
            cwd=str(work),
            env={"PATH": "/usr/bin:/bin", "HOME": str(work)},
        )
        assert done.returncode == 0, done.stderr[-3000:]
        return json.loads(done.stdout.strip().splitlines()[-1])
    finally:
        shutil.rmtree(work, ignore_errors=True)


ROOT = os.geteuid() == 0


@pytest.mark.skipif(not ROOT, reason="the root path is only taken by a root caller")
def test_root_caller_without_mount_namespaces_fails_closed():
    out = _run_caller(["max_mnt_namespaces"], as_uid=None)
    assert out["sandbox"]["ran"] is False, out["sandbox"]
    error = out["sandbox"]["error"]
    assert error.startswith(
        "sandbox setup failed: unshare(mount, pid, net, ipc, uts namespaces) failed: No space left on device"
    )
    assert "Isolation(level='none')" in error and "`isolation: none`" in error
    # the explicit none level still runs — and reads a host file: it is NOT isolated
    assert out["none"]["outcome"] == "ok" and "a host file the none level can read" in out["none"]["stdout"]
    assert out["none"]["isolation"]["level"] == "none"


@pytest.mark.skipif(
    not ROOT or not shutil.which("setpriv") or not Path(SYSTEM_PYTHON).exists(),
    reason="needs root (to become an unused uid), setpriv and a system python3",
)
def test_non_root_caller_without_user_namespaces_fails_closed():
    out = _run_caller(["max_user_namespaces"], as_uid=65534)
    assert out["sandbox"]["ran"] is False, out["sandbox"]
    error = out["sandbox"]["error"]
    assert error.startswith(
        "sandbox setup failed: unshare(user, mount, pid, net, ipc, uts namespaces) failed: No space left on device"
    )
    assert "Isolation(level='none')" in error
    assert out["none"]["outcome"] == "ok" and "a host file the none level can read" in out["none"]["stdout"]


def test_the_none_level_is_not_isolated(tmp_path):
    """Documents what ``none`` means: the program reads the caller's files and reaches the network."""
    planted = tmp_path / "caller-file.txt"
    planted.write_text("visible to the none level")
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    server.setblocking(False)
    try:
        port = server.getsockname()[1]
        code = (
            f"import socket\nprint(open({str(planted)!r}).read())\n"
            f"socket.create_connection(('127.0.0.1', {port}), timeout=5).close()\nprint('connected')\n"
        )
        r = run_python(code, isolation=Isolation.none())
        assert r.outcome is Outcome.OK, r.stderr
        assert "visible to the none level" in r.stdout and "connected" in r.stdout
        conn, _ = server.accept()
        conn.close()
    finally:
        server.close()
    assert r.isolation["level"] == "none" and r.isolation["pid_namespace"] is False
    assert r.isolation["capabilities"] == "the caller's" and r.isolation["audit_hooks"] is False


def test_no_isolation_only_by_name():
    assert Isolation().level is IsolationLevel.NAMESPACES
    assert Isolation(level="none").level is IsolationLevel.NONE is Isolation.none().level
    with pytest.raises(ValueError, match="Isolation.level must be one of 'namespaces', 'none'"):
        Isolation(level="off")
    with pytest.raises(TypeError):  # the old automatic network fallback knob is gone
        Isolation(network="auto")
