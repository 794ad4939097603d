"""Launching and killing one sandboxed process tree (shared by :func:`run_python` and the worker).

The parent prepares a scratch directory owned by a fresh uid, starts ``_boot.py`` in a new session
with an empty environment, and reads the boot's status JSON (what isolation it really got). Killing
is thorough: the process group, and — because a hostile program can ``setsid()`` out of its group —
every process still running under the sandbox's unique uid.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import logging
import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from whale.sandbox.policy import Isolation, Limits, build_env

log = logging.getLogger(__name__)

_HERE = Path(__file__).resolve().parent
BOOT_PATH = str(_HERE / "_boot.py")
GUARD_PATH = str(_HERE / "_guard.py")
SETUP_FAILED_EXIT = 121
BOOT_STATUS_TIMEOUT_S = 20.0
KILL_DEADLINE_S = 5.0

#: Sandbox uids start here (far above regular accounts); each live sandbox gets its own uid so
#: sandboxes cannot touch each other's scratch, RLIMIT_NPROC counts one sandbox only, and the
#: kill-by-uid sweep at the end can only hit that sandbox. A process owns the block of
#: ``UID_SLOTS`` uids at ``UID_BASE + (pid % 100000) * UID_SLOTS``.
UID_BASE = 200_000
UID_SLOTS = 1024
_uid_counter = itertools.count()
_live_uids: set[int] = set()
_uid_lock = threading.Lock()
_warned: set[str] = set()


class SandboxSetupError(RuntimeError):
    """The sandbox itself could not be started (not the program's fault)."""


def _allocate_uid() -> int:
    """A uid no live sandbox of this process holds and no running process uses."""
    block = UID_BASE + (os.getpid() % 100_000) * UID_SLOTS
    with _uid_lock:
        start = next(_uid_counter)
        for i in range(UID_SLOTS):
            uid = block + (start + i) % UID_SLOTS
            if uid not in _live_uids and not _pids_of_uid(uid):
                _live_uids.add(uid)
                return uid
    raise SandboxSetupError(f"all {UID_SLOTS} sandbox uids of this process are in use")


def _release_uid(uid: int | None) -> None:
    with _uid_lock:
        _live_uids.discard(uid)  # type: ignore[arg-type]


def _warn_once(key: str, message: str) -> None:
    if key not in _warned:
        _warned.add(key)
        log.warning(message)


@dataclasses.dataclass
class Launched:
    """A started sandbox process and what it needs for cleanup."""

    proc: subprocess.Popen[bytes]
    scratch: Path
    uid: int | None
    status: dict[str, Any]
    own_scratch: bool
    started: float

    @property
    def isolation(self) -> dict[str, Any]:
        return dict(self.status)

    def kill_tree(self) -> None:
        """SIGKILL the group and every process of the sandbox uid, until none is left (bounded)."""
        deadline = time.monotonic() + KILL_DEADLINE_S
        while True:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            left = _pids_of_uid(self.uid) if self.uid is not None and self.status.get("uid_dropped") else []
            for pid in left:
                try:
                    os.kill(pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
            self.proc.poll()  # reap the main process so it does not linger as a zombie
            if not left or time.monotonic() > deadline:
                break
            time.sleep(0.005)
        try:
            self.proc.wait(timeout=KILL_DEADLINE_S)
        except subprocess.TimeoutExpired:
            log.error("sandbox pid %s did not die after SIGKILL", self.proc.pid)

    def cleanup(self) -> None:
        self.kill_tree()
        for stream in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
            if stream is not None:
                stream.close()
        if self.own_scratch:
            shutil.rmtree(self.scratch, ignore_errors=True)
        _release_uid(self.uid)


def _pids_of_uid(uid: int) -> list[int]:
    """Live (non-zombie) processes whose real uid is ``uid`` (from /proc)."""
    out = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/status", "rb") as f:
                zombie = False
                for line in f:
                    if line.startswith(b"State:"):
                        zombie = line.split()[1] in (b"Z", b"X")
                    elif line.startswith(b"Uid:"):
                        if int(line.split()[1]) == uid and not zombie:
                            out.append(int(entry.name))
                        break
        except (FileNotFoundError, ProcessLookupError, PermissionError, ValueError):
            continue
    return out


def prepare_scratch(
    scratch: str | os.PathLike[str] | None, files: Mapping[str, str | bytes] | None, uid: int | None
) -> tuple[Path, bool]:
    """Create (or adopt) the scratch directory, place ``files`` in it, hand it to ``uid``."""
    own = scratch is None
    path = Path(tempfile.mkdtemp(prefix="whale-sbx-")) if scratch is None else Path(scratch)
    path.mkdir(parents=True, exist_ok=True)
    path = path.resolve()
    for name, content in (files or {}).items():
        dest = (path / name).resolve()
        if dest != path and path not in dest.parents:
            raise ValueError(f"sandbox file name {name!r} escapes the scratch directory")
        dest.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, str):
            dest.write_text(content, encoding="utf-8")
        else:
            dest.write_bytes(content)
    if uid is not None:
        for root, dirs, names in os.walk(path):
            for n in [*dirs, *names]:
                os.lchown(os.path.join(root, n), uid, uid)
        os.chown(path, uid, uid)
    path.chmod(0o700)
    return path, own


def launch(
    *,
    mode: str,
    target: str,
    args: list[str],
    limits: Limits,
    isolation: Isolation,
    scratch: str | os.PathLike[str] | None,
    files: Mapping[str, str | bytes] | None,
    env: Mapping[str, str] | None,
    stdin: int | None,
    sys_path: list[str] | None = None,
) -> Launched:
    """Start the sandboxed process; returns once the boot reported its isolation."""
    root = os.geteuid() == 0
    uid = _allocate_uid() if isolation.drop_privileges and root else None
    if isolation.drop_privileges and not root:
        _warn_once("uid", "sandbox: not root, so the program runs as this uid; writes outside scratch are "
                   "refused only by an audit hook (best effort)")
    try:
        scratch_path, own = prepare_scratch(scratch, files, uid)
    except BaseException:
        _release_uid(uid)
        raise
    target_abs = str((scratch_path / target).resolve()) if not os.path.isabs(target) else target
    expose = {
        os.path.realpath(sys.base_prefix), os.path.realpath(sys.prefix), str(_HERE),
        os.path.dirname(os.path.realpath(sys.executable)), os.path.dirname(os.path.realpath(target_abs)),
        *(os.path.realpath(p) for p in isolation.read_paths), *(os.path.realpath(p) for p in (sys_path or [])),
    }
    status_r, status_w = os.pipe()
    cfg = {
        "uid": uid,
        "scratch": str(scratch_path),
        "network": isolation.network,
        "mount": bool(isolation.mount_namespace and root),
        "hide": list(isolation.hide_paths),
        "expose": sorted(expose),
        "rlimits": limits.rlimits(),
        "python": sys.executable,
        "guard_path": GUARD_PATH,
        "guard": {"mode": mode, "target": target_abs, "args": args, "sys_path": sys_path or []},
        "env": build_env(str(scratch_path), os.environ, isolation.pass_env, env),
        "status_fd": status_w,
    }
    try:
        proc = subprocess.Popen(
            [sys.executable, "-I", "-S", BOOT_PATH, json.dumps(cfg)],
            stdin=stdin if stdin is not None else subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
            pass_fds=(status_w,),
            env={"LANG": "C.UTF-8"},
            cwd=str(scratch_path),
        )
    except OSError as exc:
        os.close(status_r)
        os.close(status_w)
        if own:
            shutil.rmtree(scratch_path, ignore_errors=True)
        _release_uid(uid)
        raise SandboxSetupError(f"cannot start the sandbox launcher: {exc}") from exc
    os.close(status_w)
    started = time.monotonic()
    try:
        raw = _read_all(status_r, BOOT_STATUS_TIMEOUT_S)
    finally:
        os.close(status_r)
    launched = Launched(proc, scratch_path, uid, {}, own, started)
    try:
        status = json.loads(raw) if raw else {"error": "the sandbox launcher died before reporting"}
    except ValueError:
        status = {"error": f"unreadable launcher status {raw[:200]!r}"}
    launched.status = status
    if status.get("network") == "audit-hook" and isolation.network == "auto":
        _warn_once("net", "sandbox: no network namespace available "
                   f"({status.get('network_warning', 'unknown reason')}); falling back to a socket-blocking "
                   "audit hook, which is not a security boundary")
    if "error" in status:
        stderr = b""
        try:
            proc.wait(timeout=KILL_DEADLINE_S)
            stderr = proc.stderr.read() if proc.stderr else b""
        except subprocess.TimeoutExpired:
            pass
        launched.cleanup()
        raise SandboxSetupError(f"sandbox setup failed: {status['error']} {stderr.decode(errors='replace')[-500:]}")
    return launched


def _read_all(fd: int, timeout_s: float) -> bytes:
    """Read ``fd`` to EOF within a deadline."""
    deadline = time.monotonic() + timeout_s
    chunks = []
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            raise SandboxSetupError(f"the sandbox launcher reported nothing within {timeout_s} s")
        ready, _, _ = select.select([fd], [], [], left)
        if not ready:
            continue
        chunk = os.read(fd, 65536)
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)
