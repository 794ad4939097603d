"""The sandbox is an allow-list wall: attacks from the issue-#12 report, each contained and named.

Every test runs a hostile program through the real launcher (``run_python`` / ``SandboxWorker``) as
this process's uid (root here: the per-sandbox uid path; the non-root caller has its own module) and
asserts both that the attack was refused and how (the exception or the typed outcome), and that the
host is unchanged.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import threading
import time
from pathlib import Path

import pytest

from tests.security import sandbox_attacks as attacks
from whale.domain import default_data_root
from whale.sandbox import Limits, MiB, Outcome, SandboxCallError, SandboxWorker, run_python

REPO = Path(__file__).resolve().parents[2]
SECRET = "whale-fake-secret-5e1f0c"


@pytest.fixture(scope="module")
def data_file(tmp_path_factory) -> str:
    """A gold-answer file of the data root; where this checkout has none, a planted stand-in."""
    files = sorted((default_data_root() / "math_reasoning").glob("*.jsonl"))
    if files:
        return str(files[0])
    planted = tmp_path_factory.mktemp("data") / "math_reasoning" / "aime_2024.jsonl"
    planted.parent.mkdir()
    planted.write_text('{"id": "planted", "answer": "204"}\n')
    return str(planted)


def probe(code: str, **kwargs) -> dict[str, str]:
    r = run_python(code, **kwargs)
    assert r.outcome is Outcome.OK, r.describe() + "\n" + r.stderr[-2000:]
    return attacks.parse(r.stdout)


# ----- reads --------------------------------------------------------------------------------------


def test_data_root_checkout_and_domain_packages_are_invisible(data_file):
    verdicts = probe(attacks.read_attack(data_file, str(REPO / "pyproject.toml")))
    assert attacks.succeeded(verdicts) == {}
    # the kernel's answer, below the audit hook: not forbidden but absent — the data root and the
    # checkout are not in the sandbox's root, and the init's root is out of reach
    assert verdicts["libc data"] == verdicts["libc checkout"] == "refused:FileNotFoundError:2"
    assert verdicts["cat data"].startswith("refused:FileNotFoundError")
    assert verdicts["libc /proc/1/root"] == "refused:PermissionError:13"  # init is not dumpable
    assert verdicts["str path"].startswith("refused:PermissionError")  # the audit hook: defence in depth
    assert verdicts["import whale"] == "refused:ModuleNotFoundError:"
    assert verdicts["import math_reasoning"] == "refused:ModuleNotFoundError:"


def test_only_the_allow_listed_tree_exists():
    code = (
        attacks.PRELUDE
        + """
attempt("root", lambda: sorted(os.listdir("/")))
attempt("dev", lambda: sorted(os.listdir("/dev")))
attempt("etc", lambda: sorted(os.listdir("/etc")))
attempt("passwd", lambda: open("/etc/passwd").read())
attempt("home", lambda: c_read("/home"))
attempt("run", lambda: c_read("/run"))
attempt("tmp", lambda: c_read("/tmp"))
attempt("root home", lambda: sorted(os.listdir("/root")))
print(json.dumps(_out))
"""
    )
    r = run_python(code)
    assert r.outcome is Outcome.OK, r.stderr
    seen = json.loads(r.stdout.strip().splitlines()[-1])
    top = eval(seen["root"][len("DONE:") :])  # noqa: S307 - our own repr of a list of names
    assert not {"home", "run", "tmp", "work", "var", "opt", "mnt", "srv", "boot"} & set(top), top
    assert {"usr", "proc", "dev", "etc", "scratch"} <= set(top)
    assert eval(seen["dev"][len("DONE:") :]) == sorted(  # noqa: S307
        ["null", "zero", "full", "random", "urandom", "fd", "stdin", "stdout", "stderr"]
    )
    assert eval(seen["etc"][len("DONE:") :]) <= ["group", "ld.so.cache", "nsswitch.conf", "passwd"]  # noqa: S307
    assert "sandbox" in seen["passwd"] and "/root:" not in seen["passwd"]
    for name in ("home", "run", "tmp"):
        assert seen[name] == "refused:FileNotFoundError:2", name
    # of /root only the interpreter's prefix path is there (pyenv installs), never root's files
    if seen["root home"].startswith("DONE:"):
        assert set(eval(seen["root home"][len("DONE:") :])) <= {".pyenv"}  # noqa: S307


# ----- credentials ---------------------------------------------------------------------------------


def test_parent_environment_and_host_processes_are_unreadable(monkeypatch):
    monkeypatch.setenv("WHALE_FAKE_SECRET_ACCESS_KEY", SECRET)
    monkeypatch.setenv("WHALE_PLAIN_NAME", SECRET)  # a value under a harmless-looking name too
    r = run_python(attacks.credential_attack(SECRET))
    assert r.outcome is Outcome.OK, r.stderr
    assert SECRET not in r.stdout
    verdicts = attacks.parse(r.stdout)
    assert attacks.succeeded(verdicts) == {}
    seen = attacks.info(r.stdout)
    # its own PID namespace: the namespace's init (1) and the program; no host process is listed
    assert seen["pids"] == [1, seen["me"]] and seen["ppid"] == 1
    assert verdicts["ppid environ"].startswith("refused:PermissionError")
    assert verdicts["libc ppid environ"] == "refused:PermissionError:13"  # the init is not dumpable


# ----- writes and disk -----------------------------------------------------------------------------


def test_writes_outside_scratch_are_refused_and_leave_nothing(tmp_path):
    tmp_path.chmod(0o777)  # even a world-writable host directory stays out of reach
    name = f"whale-escape-{os.getpid()}"
    targets = [
        f"/tmp/{name}",
        f"/run/lock/{name}",
        f"/dev/shm/{name}",
        f"/var/tmp/{name}",
        str(REPO / name),
        str(tmp_path / name),
        f"/usr/{name}",
        f"/etc/{name}",
        f"/{name}",
    ]
    r = run_python(attacks.write_attack(targets))
    assert r.outcome is Outcome.OK, r.stderr
    verdicts = attacks.parse(r.stdout)
    assert attacks.succeeded(verdicts) == {}
    assert "inside ok" in r.stdout
    for target in targets:
        assert not Path(target).exists(), target
        assert not Path(target + ".c").exists(), target
    # below the audit hook: /run/lock, /dev/shm, /tmp do not exist inside; /usr and / are read-only
    assert verdicts[f"libc write /run/lock/{name}"] == "refused:FileNotFoundError:2"
    assert verdicts[f"libc write /tmp/{name}"] == "refused:FileNotFoundError:2"
    assert verdicts[f"libc write /usr/{name}"] == "refused:OSError:30"  # EROFS
    assert verdicts[f"libc write /{name}"] == "refused:OSError:30"


def test_scratch_is_bounded_and_lives_in_memory(tmp_path):
    stamp = f"whale-scratch-stamp-{os.getpid()}-{time.monotonic_ns()}"
    code = (
        attacks.PRELUDE
        + f'''
written = 0
def fill():
    global written
    os.mkdir({stamp!r})
    for i in range(64):
        with open(f"{stamp}/chunk{{i}}", "wb") as fh:
            fh.write(b"x" * (1 << 20))
        written += 1 << 20
    return written
attempt("fill scratch", fill)
print(json.dumps({{"written": written}}))
report()
'''
    )
    r = run_python(code, limits=Limits(scratch_bytes=4 * MiB, file_size_bytes=16 * MiB))
    assert r.outcome is Outcome.OK, r.stderr
    verdicts = attacks.parse(r.stdout)
    assert verdicts["fill scratch"] == "refused:OSError:28"  # ENOSPC, not the host's disk
    written = attacks.info(r.stdout)["written"]
    assert written <= 4 * MiB
    # the scratch never was a host directory: nothing named after the stamp exists in the temp dir
    assert not list(Path("/tmp").glob(f"*/{stamp}")) and not list(Path("/var/tmp").glob(f"*/{stamp}"))


# ----- network --------------------------------------------------------------------------------------


@pytest.fixture
def abstract_unix_server():
    name = f"\0whale-test-{os.getpid()}-{time.monotonic_ns()}"
    srv = socket.socket(socket.AF_UNIX)
    srv.bind(name)
    srv.listen()
    srv.setblocking(False)
    yield name, srv
    srv.close()


def test_no_network_to_the_host(listener, abstract_unix_server):
    port, connected = listener
    name, unix_srv = abstract_unix_server
    code = (
        attacks.PRELUDE
        + f"""
import socket
attempt("tcp loopback", lambda: socket.create_connection(("127.0.0.1", {port}), timeout=3).send(b"hi"))
attempt("libc tcp loopback", lambda: c_socket(socket.AF_INET).connect(("127.0.0.1", {port})))
def unix():
    s = socket.socket(socket.AF_UNIX)
    s.connect({name!r})
    return s.send(b"hi")
attempt("abstract unix", unix)
attempt("dns", lambda: socket.getaddrinfo("example.com", 80))
report()
"""
    )
    verdicts = probe(code)
    assert attacks.succeeded(verdicts) == {}
    assert verdicts["tcp loopback"].startswith("refused:PermissionError")  # the audit hook (defence in depth)
    assert verdicts["libc tcp loopback"] == "refused:OSError:101"  # the wall: ENETUNREACH, no interface is up
    assert verdicts["abstract unix"] == "refused:ConnectionRefusedError:111"  # another namespace
    assert not connected()
    with pytest.raises(BlockingIOError):
        unix_srv.accept()


# ----- processes --------------------------------------------------------------------------------------


def test_fork_bomb_is_stopped_and_leaves_nothing():
    mark = attacks.marker()
    code = attacks.escapee(mark) + "while True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n"
    r = run_python(code, limits=Limits(wall_s=3, processes=32))
    assert r.outcome is Outcome.TIMEOUT, r.describe()
    assert attacks.host_pids_with(mark) == []


@pytest.mark.parametrize("ignore_term", [False, True], ids=["setsid-double-fork", "ignores-SIGTERM"])
def test_escapee_that_outlives_the_program_is_killed(ignore_term):
    mark = attacks.marker()
    code = attacks.escapee(mark, ignore_term=ignore_term) + "import time\ntime.sleep(0.2)\nprint('main exits')\n"
    r = run_python(code)
    assert r.outcome is Outcome.OK and "main exits" in r.stdout, r.describe()
    assert attacks.host_pids_with(mark) == []


def test_escapee_of_a_timed_out_program_is_killed():
    mark = attacks.marker()
    code = attacks.escapee(mark, ignore_term=True) + "while True:\n    pass\n"
    r = run_python(code, limits=Limits(wall_s=1.5))
    assert r.outcome is Outcome.TIMEOUT
    assert attacks.host_pids_with(mark) == []


def test_escapee_of_a_worker_dies_with_the_worker():
    mark = attacks.marker()
    entry = (
        "import os\n\ndef spawn():\n"
        + "".join("    " + line + "\n" for line in attacks.escapee(mark).splitlines())
        + "    return 'spawned'\n"
    )
    worker = SandboxWorker(entry_code=entry, limits=Limits(wall_s=5, cpu_s=None))
    with worker:
        assert worker.call("spawn") == "spawned"
        deadline = time.monotonic() + 10
        while not attacks.host_pids_with(mark):  # the escapee runs while the worker lives
            assert time.monotonic() < deadline, "the escapee never started"
            time.sleep(0.02)
    assert attacks.host_pids_with(mark) == []


def test_memory_bomb_and_busy_loop_are_named():
    mem = run_python("x = bytearray(3 << 30)\n", limits=Limits(memory_bytes=512 * MiB))
    assert mem.outcome is Outcome.MEMORY_LIMIT and mem.error_type == "MemoryError"
    busy = run_python("while True:\n    pass\n", limits=Limits(wall_s=1))
    assert busy.outcome is Outcome.TIMEOUT


def test_signals_cannot_reach_the_host():
    canary = subprocess.Popen(["sleep", "60"])  # a host process of the same uid as the caller
    try:
        r = run_python(attacks.SIGNAL_ATTACK)
        assert r.outcome is Outcome.OK and "still here" in r.stdout, r.describe()
        assert canary.poll() is None
    finally:
        canary.kill()
        canary.wait(timeout=10)


# ----- output --------------------------------------------------------------------------------------


def test_huge_output_is_cut():
    r = run_python(
        "import sys\nwhile True:\n    sys.stdout.write('x' * 65536)\n", limits=Limits(stdout_bytes=256 * 1024)
    )
    assert r.outcome is Outcome.OUTPUT_LIMIT and r.stdout_truncated
    assert len(r.stdout) == 256 * 1024


def test_non_utf8_output_is_replaced_not_raised():
    r = run_python(
        "import sys\nsys.stdout.buffer.write(b'ok \\xff\\xfe \\xc3')\nsys.stderr.buffer.write(b'\\x80 bad')\n"
        "sys.exit(3)\n"
    )
    assert r.outcome is Outcome.ERROR and r.returncode == 3
    assert r.stdout.startswith("ok ") and "\ufffd" in r.stdout and "\ufffd" in r.stderr


def test_non_utf8_stderr_of_a_dying_worker_is_replaced():
    entry = "import os, sys\n\ndef die():\n    sys.stderr.buffer.write(b'\\xff\\xfe dying')\n    sys.stderr.flush()\n    os._exit(7)\n"
    with SandboxWorker(entry_code=entry, limits=Limits(wall_s=5, cpu_s=None)) as worker:
        with pytest.raises(SandboxCallError) as err:
            worker.call("die")
    assert err.value.outcome is Outcome.ERROR
    assert "\ufffd" in err.value.stderr_tail and "dying" in err.value.stderr_tail


def test_program_holds_no_capabilities_and_cannot_move_its_walls():
    code = (
        attacks.PRELUDE
        + """
status = dict(line.split(":", 1) for line in open("/proc/self/status").read().splitlines() if ":" in line)
print(json.dumps({k: status[k].strip() for k in ("CapEff", "CapPrm", "CapBnd", "NoNewPrivs", "Uid")}))
attempt("umount /usr", lambda: c_umount("/usr"))
attempt("remount / rw", lambda: c_remount_rw("/"))
attempt("mount tmpfs", lambda: c_mount_tmpfs("/scratch"))
report()
"""
    )
    r = run_python(code)
    assert r.outcome is Outcome.OK, r.stderr
    caps = attacks.info(r.stdout)
    assert caps["CapEff"] == caps["CapPrm"] == "0000000000000000"
    assert caps["NoNewPrivs"] == "1"
    verdicts = attacks.parse(r.stdout)
    assert attacks.succeeded(verdicts) == {}
    assert all(v == "refused:PermissionError:1" for v in verdicts.values()), verdicts


def test_files_come_back_only_when_asked_and_bounded():
    code = (
        "open('out.txt', 'w').write('42')\nopen('big.bin', 'wb').write(b'x' * 300_000)\n"
        "os_link = __import__('os').symlink('/etc/passwd', 'link.txt')\n"
    )
    r = run_python(
        code,
        files={"in/data.txt": "7"},
        collect=["out.txt", "in/data.txt", "big.bin", "link.txt", "nope"],
        limits=Limits(collect_bytes=100_000),
    )
    assert r.outcome is Outcome.OK, r.stderr
    assert r.files == {"out.txt": b"42", "in/data.txt": b"7"}
    assert set(r.files_not_collected) == {"big.bin", "link.txt", "nope"}
    assert "collect_bytes" in r.files_not_collected["big.bin"]
    assert "not a regular file" in r.files_not_collected["link.txt"]


def test_parallel_sandboxes_do_not_see_each_other():
    """Two sandboxes at once: neither lists the other's processes nor reaches its scratch."""
    results: list = []

    def one(tag: str) -> None:
        code = f"import os, time\nopen('{tag}', 'w').write('x')\ntime.sleep(1)\nprint(sorted(os.listdir('/scratch')), len([p for p in os.listdir('/proc') if p.isdigit()]))\n"
        results.append(run_python(code))

    threads = [threading.Thread(target=one, args=(tag,)) for tag in ("left", "right")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert len(results) == 2
    for r in results:
        assert r.outcome is Outcome.OK, r.stderr
        names, pids = eval(r.stdout.strip().rsplit(" ", 1)[0]), int(r.stdout.strip().rsplit(" ", 1)[1])  # noqa: S307
        assert len(names) == 2 and pids == 2  # main.py + its own file; init + itself


def test_killing_the_launcher_kills_the_sandbox(tmp_path):
    """The caller crashing (SIGKILL) must not leave the sandbox running."""
    mark = attacks.marker()  # in a file, not on the caller's command line (the scan would find that)
    caller = (
        "import sys\n"
        f"sys.path.insert(0, {str(REPO)!r})\n"
        "from whale.sandbox import run_python, Limits\n"
        f"run_python({attacks.escapee(mark, double_fork=False) + 'import time; time.sleep(60)'!r}, limits=Limits(wall_s=60))\n"
    )
    script = tmp_path / "caller.py"
    script.write_text(caller)
    proc = subprocess.Popen([os.sys.executable, str(script)])
    try:
        deadline = time.monotonic() + 30
        while not attacks.host_pids_with(mark):
            assert proc.poll() is None and time.monotonic() < deadline, "the sandbox never started"
            time.sleep(0.02)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
        deadline = time.monotonic() + 10
        while attacks.host_pids_with(mark):  # the launcher's death reaches the sandbox asynchronously
            assert time.monotonic() < deadline, "the sandbox outlived its launcher"
            time.sleep(0.02)
    finally:
        proc.kill()
        proc.wait(timeout=10)
