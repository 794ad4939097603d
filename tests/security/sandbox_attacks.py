"""Hostile programs for the sandbox security tests, and the host-side checks that judge them.

Each attack program tries several ways to do one forbidden thing and prints one JSON line:
``{attempt name: "DONE:<what it got>" | "refused:<ExceptionType>:<errno>"}``. The tests assert every
attempt was refused (and, where it matters, how), so a wall that silently lets one path through
fails the test with the path named. Shared by the root tests and the non-root caller (which imports
this module from a process that dropped to an unused uid), so it imports nothing but the stdlib.
"""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

PRELUDE = '''
import json, os, sys
_out = {}
def attempt(name, fn):
    try:
        value = fn()
    except BaseException as exc:
        _out[name] = "refused:" + type(exc).__name__ + ":" + str(getattr(exc, "errno", "") or "")
    else:
        _out[name] = "DONE:" + repr(value)[:300]
def report():
    sys.stdout.flush()
    print("\\n" + json.dumps(_out), flush=True)
def _libc():
    import ctypes  # only when used: an attack that needs no C call must run where ctypes is refused
    return ctypes, ctypes.CDLL(None, use_errno=True)
def _c_check(ret):
    ctypes, _ = _libc()
    if ret < 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))
    return ret
def c_read(path):
    """open(2) + read(2) through libc: no audit hook sees this, only the kernel's walls stop it."""
    return os.read(_c_check(_libc()[1].open(os.fsencode(path), os.O_RDONLY)), 50)
def c_write(path):
    return os.write(_c_check(_libc()[1].open(os.fsencode(path), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o666)), b"pwned")
def c_umount(path):
    return _c_check(_libc()[1].umount2(os.fsencode(path), 2))
def c_remount_rw(path):
    return _c_check(_libc()[1].mount(None, os.fsencode(path), None, 32 | 4096, None))  # MS_REMOUNT|MS_BIND
def c_mount_tmpfs(path):
    return _c_check(_libc()[1].mount(b"tmpfs", os.fsencode(path), b"tmpfs", 0, None))
def c_socket(family):
    """A socket made through libc (the audit hook never sees its family), wrapped for Python."""
    import socket
    return socket.socket(fileno=_c_check(_libc()[1].socket(family, socket.SOCK_STREAM, 0)))
def cat(path):
    import subprocess
    done = subprocess.run(["/bin/cat", path], capture_output=True)
    if done.returncode:
        raise FileNotFoundError(done.stderr.decode(errors="replace").strip())
    return done.stdout[:50]
'''


def parse(stdout: str) -> dict[str, str]:
    """The attack's verdict line (the last line of its stdout)."""
    lines = [line for line in stdout.strip().splitlines() if line.strip()]
    if not lines:
        raise AssertionError("the attack printed nothing")
    return json.loads(lines[-1])


def info(stdout: str) -> dict:
    """The JSON line an attack printed just before its verdict."""
    lines = [line for line in stdout.strip().splitlines() if line.strip()]
    return json.loads(lines[-2])


def succeeded(verdicts: dict[str, str]) -> dict[str, str]:
    """The attempts that got through (the test failure names them)."""
    return {k: v for k, v in verdicts.items() if not v.startswith("refused:")}


def read_attack(data_file: str, checkout_file: str) -> str:
    """Read a file of the data root (and of the checkout) every way a program can name it."""
    data_dir, name = os.path.split(data_file)
    return (
        PRELUDE
        + f"""
DATA = {data_file!r}
attempt("str path", lambda: open(DATA).read(50))
attempt("bytes path", lambda: open(DATA.encode(), "rb").read(50))
attempt("os.open", lambda: os.read(os.open(DATA, os.O_RDONLY), 50))
attempt("os.open bytes", lambda: os.read(os.open(DATA.encode(), os.O_RDONLY), 50))
def via_dir_fd():
    d = os.open({data_dir!r}, os.O_RDONLY | os.O_DIRECTORY)
    return os.read(os.open({name!r}, os.O_RDONLY, dir_fd=d), 50)
attempt("os.open dir_fd", via_dir_fd)
def via_symlink():
    os.symlink(DATA, "link-to-data")
    return open("link-to-data").read(50)
attempt("symlink in scratch", via_symlink)
attempt("listdir data root", lambda: os.listdir({data_dir!r}))
attempt("/proc/self/root", lambda: open("/proc/self/root" + DATA).read(50))
attempt("/proc/1/root", lambda: open("/proc/1/root" + DATA).read(50))
attempt("/proc/ppid/root", lambda: open(f"/proc/{{os.getppid()}}/root" + DATA).read(50))
attempt("checkout file", lambda: open({checkout_file!r}).read(50))
attempt("libc data", lambda: c_read(DATA))
attempt("libc checkout", lambda: c_read({checkout_file!r}))
attempt("libc /proc/1/root", lambda: c_read("/proc/1/root" + DATA))
attempt("libc /proc/ppid/root", lambda: c_read(f"/proc/{{os.getppid()}}/root" + DATA))
attempt("cat data", lambda: cat(DATA))
attempt("import whale", lambda: __import__("whale").__file__)
attempt("import math_reasoning", lambda: __import__("math_reasoning").__file__)
report()
"""
    )


def credential_attack(secret: str) -> str:
    """Find ``secret`` in the parent's environment: os.environ, /proc/<ppid>/environ, every
    /proc/*/environ and /proc/*/cmdline. Also lists the pids it can see."""
    return (
        PRELUDE
        + f"""
SECRET = {secret!r}
def grep(path):
    data = open(path, "rb").read()
    if SECRET.encode() in data:
        return "FOUND " + path
    raise PermissionError("not found in " + path)
attempt("os.environ", lambda: [k for k, v in os.environ.items() if SECRET in v] or (_ for _ in ()).throw(KeyError("absent")))
attempt("ppid environ", lambda: grep(f"/proc/{{os.getppid()}}/environ"))
attempt("libc ppid environ", lambda: c_read(f"/proc/{{os.getppid()}}/environ"))
pids = sorted(int(p) for p in os.listdir("/proc") if p.isdigit())
for pid in pids:
    if pid != os.getpid():
        attempt(f"pid {{pid}} environ", lambda pid=pid: grep(f"/proc/{{pid}}/environ"))
        attempt(f"pid {{pid}} cmdline", lambda pid=pid: grep(f"/proc/{{pid}}/cmdline"))
print(json.dumps({{"pids": pids, "me": os.getpid(), "ppid": os.getppid()}}))
report()
"""
    )


def write_attack(targets: list[str]) -> str:
    """Write (create) each target path; then write inside the scratch directory, which must work."""
    return (
        PRELUDE
        + f"""
for path in {targets!r}:
    def write(path=path):
        with open(path, "w") as fh:
            fh.write("pwned")
        return path
    attempt("write " + path, write)
    attempt("libc write " + path, lambda path=path: c_write(path + ".c"))
with open("inside.txt", "w") as fh:
    fh.write("fine")
print("inside ok")
report()
"""
    )


def host_pids_with(marker: str) -> list[int]:
    """Host processes whose command line contains ``marker`` (zombies excluded)."""
    found = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = Path(f"/proc/{entry.name}/cmdline").read_bytes()
            state = Path(f"/proc/{entry.name}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if marker.encode() in cmdline and state not in ("Z", "X"):
            found.append(int(entry.name))
    return found


def escapee(marker: str, *, ignore_term: bool = False, double_fork: bool = True) -> str:
    """Python lines that leave a `sleep <marker>` process behind, outside the program's session."""
    ignore = "    signal.signal(signal.SIGTERM, signal.SIG_IGN)\n" if ignore_term else ""
    inner = (
        f"    if os.fork() == 0:\n        os.execv('/bin/sleep', ['sleep', {marker!r}])\n    os._exit(0)\n"
        if double_fork
        else f"    os.execv('/bin/sleep', ['sleep', {marker!r}])\n"
    )
    return "import os, signal\nif os.fork() == 0:\n    os.setsid()\n" + ignore + inner


def marker() -> str:
    """A `sleep` argument no other process on this machine uses (seconds, so sleep accepts it)."""
    return f"{3000 + os.getpid() % 1000}.{int.from_bytes(os.urandom(4), 'big')}"


SIGNAL_ATTACK = (
    PRELUDE
    + f"""
import signal
attempt("kill ppid SIGTERM", lambda: os.kill(os.getppid(), {int(signal.SIGTERM)}))
attempt("kill ppid SIGKILL", lambda: os.kill(os.getppid(), {int(signal.SIGKILL)}))
attempt("kill -1 SIGKILL", lambda: os.kill(-1, {int(signal.SIGKILL)}))
print("still here")
report()
"""
)
