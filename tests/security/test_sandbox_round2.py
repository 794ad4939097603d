"""Sandbox gaps of issue 27, each attack run through the real launcher (``run_python``), answered by the kernel.

The outer walls held, but inside a sandbox: ``socket(AF_VSOCK)`` worked in the no-network sandbox; a tmpfs
mounted in a nested user namespace and ``memfd_create`` each held memory outside every limit; and when the
caller had a session keyring, sandboxes shared it (an episode read a note an earlier one left). The program
now runs under a seccomp filter (``whale.sandbox._boot``) and in a fresh anonymous session keyring. Each probe
calls libc directly, below the guard's audit hook, so the errno asserted is the kernel's.
"""

from __future__ import annotations

import ctypes
import json
import platform

import pytest

from whale.sandbox import GiB, Limits, Outcome, run_python

EAFNOSUPPORT, EPERM = 97, 1

if platform.machine() != "x86_64":  # the probes use x86_64 system-call numbers
    pytest.skip("the probes are written for x86_64", allow_module_level=True)

PROBE = r"""
import ctypes, json, os, socket
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
out = {}

def errno_of(ret):
    return "ok" if ret >= 0 else ctypes.get_errno()

for name, family, kind in (("vsock", 40, 1), ("netlink", 16, 3), ("alg", 38, 5), ("packet", 17, 3),
                           ("bluetooth", 31, 1), ("unix", 1, 1)):
    fd = libc.socket(family, kind, 0)
    out[name] = errno_of(fd)
    if fd >= 0:
        os.close(fd)
fds = (ctypes.c_int * 2)()
out["socketpair vsock"] = errno_of(libc.socketpair(40, 1, 0, fds))
out["socketpair high bits"] = errno_of(libc.syscall(41, (1 << 32) | 40, 1, 0))
out["memfd_create"] = errno_of(libc.syscall(319, b"hoard", 0))
out["unshare user+mount"] = errno_of(libc.unshare(0x10000000 | 0x00020000))
out["mount tmpfs"] = errno_of(libc.mount(b"none", b"/scratch", b"tmpfs", 0, b"size=1g"))
out["clone new user ns"] = errno_of(libc.syscall(56, 0x10000000 | 17, 0, 0, 0, 0))
out["io_uring_setup"] = errno_of(libc.syscall(425, 8, ctypes.create_string_buffer(120)))
out["keyring search"] = errno_of(libc.syscall(250, 10, -3, b"user", b"whale-note", 0))
out["bpf"] = errno_of(libc.syscall(321, 0, 0, 0))
pid = os.fork()
if pid == 0:
    os._exit(7)
out["fork"] = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
print(json.dumps(out))
"""


def probe() -> dict[str, object]:
    r = run_python(PROBE)
    assert r.outcome is Outcome.OK, r.describe() + "\n" + r.stderr[-2000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_socket_families_other_than_local_and_ip_are_refused() -> None:
    out = probe()
    for name in ("vsock", "netlink", "alg", "packet", "bluetooth", "socketpair vsock", "socketpair high bits"):
        assert out[name] == EAFNOSUPPORT, (name, out[name])
    assert out["unix"] == "ok"  # what the runtime itself needs stays


def test_no_memory_outside_the_limits_no_nested_namespace_no_mount() -> None:
    out = probe()
    for name in ("memfd_create", "unshare user+mount", "mount tmpfs", "clone new user ns", "io_uring_setup", "bpf"):
        assert out[name] == EPERM, (name, out[name])
    assert out["fork"] == 7  # an ordinary fork (clone without namespace flags) still works


def test_a_note_in_the_callers_session_keyring_is_out_of_reach() -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    key = libc.syscall(248, b"user", b"whale-note", b"left by an earlier episode", 26, -3)  # add_key to @s
    if key < 0:
        pytest.skip(f"this kernel gives the test no session keyring (errno {ctypes.get_errno()})")
    assert libc.syscall(250, 10, -3, b"user", b"whale-note", 0) == key  # the caller finds its note ...
    assert probe()["keyring search"] == EPERM  # ... a sandbox does not


HOARD = r"""
import os, time
for _ in range(4):
    if os.fork() == 0:
        block = b"x" * (400 * 1024 * 1024)  # each child well under its own 1 GiB address-space limit
        time.sleep(60)
        os._exit(0)
for _ in range(4):
    os.wait()
print("held 1.6 GiB together")
"""


def test_memory_is_bounded_per_sandbox_not_only_per_process() -> None:
    """Four children x 400 MiB in a sandbox limited to 1 GiB: its init counts their memory together and ends
    the sandbox, reported as the memory limit (it held 1.6 GiB, then 2.9 GiB with larger children, before)."""
    r = run_python(HOARD, limits=Limits(memory_bytes=GiB, wall_s=30))
    assert r.outcome is Outcome.MEMORY_LIMIT, r.describe()
    assert "the sandbox's processes held" in r.stderr and "held 1.6 GiB" not in r.stdout
