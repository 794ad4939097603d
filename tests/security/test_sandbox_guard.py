"""The guard's audit hooks, alone: defence in depth behind the walls, tested without the walls.

Inside the sandbox the kernel answers first, so these checks run the hooks in a plain subprocess
where nothing else stops the program: each way of naming a path outside the allow-list — str, bytes,
``os.open`` flags, ``dir_fd``, an inherited descriptor, ``open(fd)`` — must be refused by the hook,
and the host file must be unchanged. (ctypes and other binaries are not seen by audit hooks at all;
that is why the hooks are never the only wall.)
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

GUARD_DIR = Path(__file__).resolve().parents[2] / "whale" / "sandbox"

PROGRAM = """
import json, os, shutil, socket, sys
sys.path.insert(0, {guard_dir!r})
import _guard
SCRATCH, OUTSIDE, SECRET, FD, OUT_DIR_FD = {scratch!r}, {outside!r}, {secret!r}, {fd}, {dir_fd}
os.chdir(SCRATCH)
prefix = os.path.realpath(sys.base_prefix)
_guard.install_hooks(SCRATCH, [prefix, "/usr"])
out = {{}}
def attempt(name, fn):
    try:
        fn()
        out[name] = "DONE"
    except PermissionError as exc:
        out[name] = "hook" if str(exc).startswith("sandbox:") else "kernel"
    except OSError as exc:
        out[name] = f"kernel {{exc.errno}}"
attempt("write str", lambda: open(OUTSIDE + "/a", "w").write("x"))
attempt("write bytes", lambda: open((OUTSIDE + "/b").encode(), "wb").write(b"x"))
attempt("os.open O_WRONLY|O_CREAT", lambda: os.open(OUTSIDE + "/c", os.O_WRONLY | os.O_CREAT))
attempt("os.open bytes O_RDWR", lambda: os.open(SECRET.encode(), os.O_RDWR))
attempt("os.open O_APPEND", lambda: os.open(SECRET, os.O_WRONLY | os.O_APPEND))
scratch_fd = os.open(SCRATCH, os.O_RDONLY | os.O_DIRECTORY)  # a dir_fd the hook allows to open
attempt("os.open dir_fd escape", lambda: os.open("../outside/d", os.O_WRONLY | os.O_CREAT, dir_fd=scratch_fd))
attempt("os.open relative to an inherited outside dir_fd", lambda: os.open("i", os.O_WRONLY | os.O_CREAT, dir_fd=OUT_DIR_FD))
attempt("os.open absolute ignoring dir_fd", lambda: os.open(OUTSIDE + "/e", os.O_WRONLY | os.O_CREAT, dir_fd=scratch_fd))
attempt("open(inherited fd, 'w')", lambda: open(FD, "w", closefd=False).write("x"))
attempt("mkdir dir_fd", lambda: os.mkdir("../outside/f", dir_fd=scratch_fd))
attempt("symlink dir_fd", lambda: os.symlink("/etc/passwd", "../outside/g", dir_fd=scratch_fd))
open(SCRATCH + "/mine", "w").write("x")
attempt("rename into outside", lambda: os.rename(SCRATCH + "/mine", OUTSIDE + "/h"))
attempt("remove outside", lambda: os.remove(SECRET))
attempt("rmtree outside", lambda: shutil.rmtree(OUTSIDE))
attempt("chmod outside", lambda: os.chmod(SECRET, 0o777))
attempt("read str", lambda: open(SECRET).read())
attempt("read bytes", lambda: open(SECRET.encode(), "rb").read())
attempt("read os.open", lambda: os.open(SECRET, os.O_RDONLY))
attempt("read via symlink in scratch", lambda: (os.symlink(SECRET, SCRATCH + "/link"), open(SCRATCH + "/link").read()))
attempt("read open(inherited fd)", lambda: open(FD, "r", closefd=False).read())
attempt("listdir outside", lambda: os.listdir(OUTSIDE))
attempt("socket AF_INET", lambda: socket.socket(socket.AF_INET))
allowed = {{}}
def ok(name, fn):
    fn()
    allowed[name] = True
ok("write scratch", lambda: open(SCRATCH + "/fine", "w").write("x"))
ok("os.open dir_fd inside", lambda: os.close(os.open("fine2", os.O_WRONLY | os.O_CREAT, dir_fd=scratch_fd)))
ok("read prefix", lambda: open(os.__file__).read(10))
ok("listdir scratch", lambda: os.listdir(SCRATCH))
ok("devnull", lambda: open("/dev/null", "w").write("x"))
print(json.dumps({{"refused": out, "allowed": allowed}}))
"""


def test_hooks_refuse_every_way_of_naming_a_path(tmp_path):
    scratch, outside = tmp_path / "scratch", tmp_path / "outside"
    scratch.mkdir()
    outside.mkdir()
    secret = outside / "secret.txt"
    secret.write_text("host secret")
    fd = os.open(secret, os.O_RDWR)  # handed to the program, as inherited descriptors would be
    dir_fd = os.open(outside, os.O_RDONLY | os.O_DIRECTORY)
    try:
        program = textwrap.dedent(PROGRAM).format(
            guard_dir=str(GUARD_DIR),
            scratch=str(scratch),
            outside=str(outside),
            secret=str(secret),
            fd=fd,
            dir_fd=dir_fd,
        )
        done = subprocess.run(
            [sys.executable, "-I", "-c", program], capture_output=True, text=True, timeout=60, pass_fds=(fd, dir_fd)
        )
    finally:
        os.close(fd)
        os.close(dir_fd)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert {k: v for k, v in result["refused"].items() if v != "hook"} == {}
    assert len(result["allowed"]) == 5
    assert secret.read_text() == "host secret"
    assert sorted(p.name for p in outside.iterdir()) == ["secret.txt"]
