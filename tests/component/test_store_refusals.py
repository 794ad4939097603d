"""A folder store the filesystem refuses to write: a real read-only mount and a real full filesystem.

File modes do not stop root, so each case runs in a subprocess under ``unshare --mount`` (a private mount
namespace: nothing it mounts is seen outside) that mounts a read-only bind of the store, or a tiny tmpfs
it fills up, then drives the store (or `whale run`) and reports what it saw as JSON.
"""

from __future__ import annotations

import json
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from whale.core.convert import convert_v1alpha1

pytestmark = pytest.mark.timeout(180)


def _private_mounts_work() -> bool:
    if not shutil.which("unshare") or not shutil.which("mount"):
        return False
    done = subprocess.run(["unshare", "--mount", "--propagation", "private", "true"], capture_output=True, timeout=30)
    return done.returncode == 0


needs_mount_namespace = pytest.mark.skipif(
    not _private_mounts_work(), reason="needs `unshare --mount` (root or a user namespace)"
)

DRIVER = r"""
import json, os, subprocess, sys
from pathlib import Path
from whale.store.local import LocalStore

root, mode = Path(sys.argv[1]), sys.argv[2]
report = {}

def mount(*args):
    subprocess.run(["mount", *args], check=True, capture_output=True)

def attempt(name, fn):
    try:
        fn()
        report[name] = {"ok": True}
    except Exception as exc:
        report[name] = {"ok": False, "type": type(exc).__name__, "message": str(exc),
                        "uri": getattr(exc, "uri", None)}

def fill(path):
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        while True:
            os.write(fd, b"\0" * 65536)
    except OSError:
        pass
    finally:
        os.close(fd)

if mode == "read-only":
    mount("--bind", str(root), str(root))
    mount("-o", "remount,ro,bind", str(root))
    store = LocalStore(root)
    attempt("check", store.check)
    attempt("write", lambda: store.write_bytes("runs/r/status.json", b"new"))
    attempt("delete", lambda: store.delete("runs/r/status.json"))
    attempt("lock", lambda: store.acquire_lease("runs/r/control/lock.json", __import__("whale.store.lease", fromlist=["x"]).this_process("t"), 60))
    report["kept"] = store.read_text("runs/r/status.json")
elif mode == "full":
    mount("-t", "tmpfs", "-o", "size=256k", "tmpfs", str(root))
    store = LocalStore(root / "store")
    store.write_text("runs/r/status.json", "old")
    fill(root / "filler")
    attempt("check", store.check)
    attempt("write", lambda: store.write_bytes("runs/r/status.json", b"x" * 100_000))
    report["kept"] = store.read_text("runs/r/status.json")
    report["left"] = sorted(p.name for p in (root / "store" / "runs" / "r").iterdir())
elif mode == "whale-run":
    manifest, sim = sys.argv[3], sys.argv[4]
    mount("-t", "tmpfs", "-o", "size=2m", "tmpfs", str(root))
    base = [sys.executable, "-m", "whale.cli", "run", manifest, "--store", str(root / "store"),
            "--workdir", str(root.parent / "work")]
    filler = f"head -c 4000000 /dev/zero > {root}/filler; exec \"$@\""
    env = {**os.environ, "WHALE_WORKLOAD_COMMAND": f"sh -c '{filler}' sh {sim}"}
    first = subprocess.run(base, capture_output=True, text=True, timeout=120, env=env)
    report["first"] = {"code": first.returncode, "output": first.stdout + first.stderr}
    os.unlink(root / "filler")  # someone frees space; the same command resumes
    env["WHALE_WORKLOAD_COMMAND"] = sim
    second = subprocess.run(base, capture_output=True, text=True, timeout=120, env=env)
    report["second"] = {"code": second.returncode, "output": second.stdout + second.stderr}
print(json.dumps(report))
"""


def in_private_mounts(root: Path, mode: str, *args: str) -> dict:
    done = subprocess.run(
        ["unshare", "--mount", "--propagation", "private", sys.executable, "-c", DRIVER, str(root), mode, *args],
        capture_output=True,
        text=True,
        timeout=150,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


@needs_mount_namespace
def test_a_read_only_store_names_the_file_the_cause_and_the_fix(tmp_path: Path) -> None:
    from whale.store.local import LocalStore

    root = tmp_path / "store"
    LocalStore(root).write_text("runs/r/status.json", "old")
    seen = in_private_mounts(root, "read-only")
    for op in ("check", "write", "delete", "lock"):
        assert seen[op]["ok"] is False and seen[op]["type"] == "StoreReadOnly", seen[op]
        assert "Read-only file system (errno EROFS)" in seen[op]["message"]
        assert "Fix: the store folder is on a read-only mount: remount it read-write" in seen[op]["message"]
    assert seen["write"]["uri"] == f"file://{root}/runs/r/status.json"
    assert seen["lock"]["uri"] == f"file://{root}/runs/r/control/lock.json"
    assert seen["kept"] == "old"


@needs_mount_namespace
def test_a_full_store_names_the_file_and_keeps_the_old_object(tmp_path: Path) -> None:
    root = tmp_path / "mnt"
    root.mkdir()
    seen = in_private_mounts(root, "full")
    assert seen["check"] == {"ok": True}  # writable, only full
    write = seen["write"]
    assert write["ok"] is False and write["type"] == "StoreFull", write
    assert write["uri"] == f"file://{root}/store/runs/r/status.json"
    assert "No space left on device (errno ENOSPC)" in write["message"] and "Fix: free space" in write["message"]
    assert seen["kept"] == "old" and seen["left"] == ["status.json"]  # atomic: no half file, no temp file


@needs_mount_namespace
def test_whale_run_on_a_store_that_fills_up_reports_it_and_resumes_once_freed(tmp_path: Path, counting_domain) -> None:
    root = tmp_path / "mnt"
    root.mkdir()
    manifest = tmp_path / "full.yaml"
    manifest.write_text(
        yaml.safe_dump(
            convert_v1alpha1(
                {
                    "apiVersion": "whale.dev/v1alpha1",
                    "kind": "WhaleRun",
                    "metadata": {"name": "full"},
                    "spec": {
                        "domain": "counting",
                        "condition": "rsft_only",
                        "model": {"name": "tiny"},
                        "schedule": {"totalSteps": 2},
                        "evaluation": {"atStart": False},
                    },
                }
            )
        )
    )
    sim = shlex.join([sys.executable, "-m", "tests.workloads.simulated"])
    seen = in_private_mounts(root, "whale-run", str(manifest), sim)
    first = seen["first"]
    assert first["code"] == 1, first["output"]
    assert "Traceback" not in first["output"]
    assert f"cannot write file://{root}/store/" in first["output"]
    assert "No space left on device" in first["output"] and "Fix: free space" in first["output"]
    second = seen["second"]
    assert second["code"] == 0 and "run full Succeeded" in second["output"], second["output"]
