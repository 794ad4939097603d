"""Signals and failures of a real `whale run` process: no orphans, no two writers, an honest status.

Each test starts `whale run` as a subprocess (the way a person does), with the simulated workload
(tests/workloads/simulated.py) wrapped in a shell that first starts a *sandbox-like* grandchild: a
process in a session of its own (``setsid``), as the harness sandboxes are, which a kill of the
workload's process group does not reach. Everything a run starts carries the test's tmp path in its
command line, so "no process of the run is left" is a scan of /proc for it.
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from whale.cli import app
from whale.core import layout
from whale.core.convert import convert_v1alpha1
from whale.core.status import RunPhase, WhaleRunStatus
from whale.store import open_store

pytestmark = pytest.mark.timeout(180)

SPEC = {
    "domain": "counting",
    "condition": "rsft_only",
    "model": {"name": "tiny"},
    "schedule": {"totalSteps": 3},
    "evaluation": {"atStart": False},
    "retry": {"maxAttempts": 2},
}
HANG_IN_WEIGHT_PHASE = {"hang": {"c01-weight": 0}}


@pytest.fixture(autouse=True)
def _plugin(counting_domain):
    return counting_domain


def manifest(tmp_path: Path, name: str = "sig") -> Path:
    path = tmp_path / f"{name}.yaml"
    path.write_text(
        yaml.safe_dump(
            convert_v1alpha1(
                {"apiVersion": "whale.dev/v1alpha1", "kind": "WhaleRun", "metadata": {"name": name}, "spec": SPEC}
            )
        )
    )
    return path


def workload_command(tmp_path: Path) -> str:
    """The simulated workload, after starting a grandchild in its own session (like a harness sandbox)."""
    py = sys.executable
    script = f'setsid {py} -c "import time; time.sleep(600)" {tmp_path}/sandbox-like & exec "$@"'
    return shlex.join(["sh", "-c", script, "sh", py, "-m", "tests.workloads.simulated"])


def processes_of(marker: str) -> dict[int, str]:
    """Live processes (not zombies) whose command line mentions ``marker``."""
    found = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
        except OSError:
            continue
        text = cmdline.replace(b"\0", b" ").decode("utf-8", "replace")
        if marker in text:
            found[int(entry)] = text
    return found


def wait_for(predicate: Callable[[], object], timeout_s: float, what: str) -> object:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")


@pytest.fixture
def no_leftovers(tmp_path: Path) -> Iterator[None]:
    """Kill whatever a failed test left running (so one failure does not leak processes into the next)."""
    yield
    for pid in processes_of(str(tmp_path)):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def start_whale_run(tmp_path: Path, store: str, sim: dict, env: dict[str, str] | None = None) -> subprocess.Popen:
    out = open(tmp_path / "whale-run.out", "ab")  # noqa: SIM115 - closed with the process, below
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "whale.cli",
            "run",
            str(manifest(tmp_path)),
            "--store",
            store,
            "--workdir",
            str(tmp_path / "work"),
        ],
        cwd=tmp_path,
        stdout=out,
        stderr=subprocess.STDOUT,
        env={
            **os.environ,
            "WHALE_SIM": json.dumps(sim),
            "WHALE_WORKLOAD_COMMAND": workload_command(tmp_path),
            **(env or {}),
        },
    )
    out.close()
    return proc


def wait_until_hanging(tmp_path: Path, proc: subprocess.Popen) -> None:
    """Until the weight phase's workload blocks mid-phase and its sandbox-like grandchild runs."""
    log = tmp_path / "work" / "logs" / "c01-weight.attempt-1.log"

    def hanging() -> bool:
        if proc.poll() is not None:
            raise AssertionError(
                f"whale run ended early ({proc.returncode}): {(tmp_path / 'whale-run.out').read_text()}"
            )
        texts = processes_of(str(tmp_path)).values()
        return (
            log.is_file()
            and "simulated hang" in log.read_text()
            and any("sandbox-like" in t for t in texts)
            and any("--phase c01-weight" in t for t in texts)
        )

    wait_for(hanging, 60, "the weight phase to hang with its sandbox-like grandchild")


def assert_nothing_left(tmp_path: Path) -> None:
    try:
        wait_for(lambda: not processes_of(str(tmp_path)), 30, "every process of the run to end")
    except AssertionError:
        left = processes_of(str(tmp_path))
        raise AssertionError(f"processes of the run outlived `whale run`: {left}") from None


def test_sigkill_of_whale_run_leaves_no_process_of_the_run(tmp_path, no_leftovers):
    proc = start_whale_run(tmp_path, str(tmp_path / "store"), HANG_IN_WEIGHT_PHASE)
    wait_until_hanging(tmp_path, proc)
    os.kill(proc.pid, signal.SIGKILL)
    assert proc.wait(timeout=10) == -signal.SIGKILL
    assert_nothing_left(tmp_path)
    # the lock went with its holders: the next runner resumes the run at once
    res = CliRunner().invoke(app, ["status", "sig", "--store", str(tmp_path / "store")])
    assert res.exit_code == 0 and "not running now" in res.output, res.output


def test_sigterm_stops_the_workloads_and_saves_an_interrupted_status(tmp_path, no_leftovers):
    proc = start_whale_run(tmp_path, str(tmp_path / "store"), HANG_IN_WEIGHT_PHASE)
    wait_until_hanging(tmp_path, proc)
    os.kill(proc.pid, signal.SIGTERM)
    assert proc.wait(timeout=60) == 128 + signal.SIGTERM
    assert_nothing_left(tmp_path)
    out = (tmp_path / "whale-run.out").read_text()
    assert "stopped by SIGTERM" in out and "Traceback" not in out, out

    store = open_store(str(tmp_path / "store"))
    status = WhaleRunStatus.model_validate(store.read_json(layout.status_key("sig")))
    assert status.phase is RunPhase.INTERRUPTED and status.active_phase == "c01-weight"
    cond = next(c for c in status.conditions if c.type == "Interrupted")
    assert cond.status == "True" and cond.reason == "Signal"
    assert status.reason == "Interrupted" and "SIGTERM" in status.message and "to resume" in status.message
    assert f"whale run {manifest(tmp_path)}" in status.message
    res = CliRunner().invoke(app, ["status", "sig", "--store", str(tmp_path / "store")])
    assert res.exit_code == 0, res.output
    assert "interrupted" in res.output and "True" in res.output and "not running now" in res.output

    # resuming clears the condition, and the run finishes
    proc = start_whale_run(tmp_path, str(tmp_path / "store"), {})
    assert proc.wait(timeout=120) == 0, (tmp_path / "whale-run.out").read_text()
    status = WhaleRunStatus.model_validate(store.read_json(layout.status_key("sig")))
    assert status.phase is RunPhase.SUCCEEDED and not [c for c in status.conditions if c.type == "Interrupted"]


def test_a_second_runner_and_a_workload_by_hand_are_refused_while_the_run_runs(tmp_path, no_leftovers):
    store_dir = str(tmp_path / "store")
    proc = start_whale_run(tmp_path, store_dir, HANG_IN_WEIGHT_PHASE)
    wait_until_hanging(tmp_path, proc)

    res = CliRunner().invoke(app, ["run", str(manifest(tmp_path)), "--store", store_dir, "--timeout", "30"])
    assert res.exit_code == 1
    assert f"already being run by pid {proc.pid} on host {socket.gethostname()}" in res.output, res.output
    assert "whale run sig" in res.output and "Traceback" not in res.output

    by_hand = subprocess.run(
        [
            sys.executable,
            "-m",
            "whale.workloads",
            "train",
            "--store",
            store_dir,
            "--run",
            "sig",
            "--phase",
            "c01-weight",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        env={k: v for k, v in os.environ.items() if k != "WHALE_RUN_OWNER"},
    )
    assert by_hand.returncode == 1
    assert f"refusing to write run 'sig': it is being run by pid {proc.pid}" in by_hand.stderr, by_hand.stderr

    impostor = subprocess.run(
        [
            sys.executable,
            "-m",
            "whale.workloads",
            "train",
            "--store",
            store_dir,
            "--run",
            "sig",
            "--phase",
            "c01-weight",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "WHALE_RUN_OWNER": "not-the-owner"},
    )
    assert impostor.returncode == 1
    assert "no longer holds the run lock" in impostor.stderr and f"held by pid {proc.pid}" in impostor.stderr

    os.kill(proc.pid, signal.SIGTERM)
    assert proc.wait(timeout=60) == 128 + signal.SIGTERM
    assert_nothing_left(tmp_path)


def test_on_s3_a_second_runner_is_refused_and_a_killed_ones_lease_is_taken_over(
    tmp_path, no_leftovers, s3_server, s3_store, monkeypatch
):
    for key, value in s3_server.env().items():
        monkeypatch.setenv(key, value)
    proc = start_whale_run(tmp_path, s3_store.uri, HANG_IN_WEIGHT_PHASE)
    wait_until_hanging(tmp_path, proc)
    lock = s3_store.read_lease(layout.lock_key("sig"))
    assert lock is not None and lock.live and lock.holder.pid == proc.pid

    res = CliRunner().invoke(app, ["run", str(manifest(tmp_path)), "--store", s3_store.uri, "--timeout", "30"])
    assert res.exit_code == 1 and f"already being run by pid {proc.pid}" in res.output, res.output

    os.kill(proc.pid, signal.SIGKILL)
    assert proc.wait(timeout=10) == -signal.SIGKILL
    assert_nothing_left(tmp_path)
    # its lease object is still there, unexpired, but its process is provably gone: taken over at once
    assert s3_store.read_lease(layout.lock_key("sig")).live is False
    started = time.monotonic()
    proc = start_whale_run(tmp_path, s3_store.uri, {})
    assert proc.wait(timeout=120) == 0, (tmp_path / "whale-run.out").read_text()
    assert time.monotonic() - started < 60, "the dead runner's lease should not have to expire first"
    status = WhaleRunStatus.model_validate(s3_store.read_json(layout.status_key("sig")))
    assert status.phase is RunPhase.SUCCEEDED
    assert s3_store.read_lease(layout.lock_key("sig")) is None  # released on exit


def descendants(root: int) -> dict[int, tuple[int, int]]:
    """{pid: (start time, depth below root)} of every live descendant of ``root`` (from /proc; no zombies)."""
    parent, start = {}, {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_bytes()
        except OSError:
            continue
        fields = stat[stat.rfind(b")") + 2 :].split()
        if fields[0] in (b"Z", b"X"):
            continue
        parent[int(entry)], start[int(entry)] = int(fields[1]), int(fields[19])
    children: dict[int, list[int]] = {}
    for pid, ppid in parent.items():
        children.setdefault(ppid, []).append(pid)
    found, todo = {}, [(root, 0)]
    while todo:
        pid, depth = todo.pop()
        for child in children.get(pid, []):
            found[child] = (start[child], depth + 1)
            todo.append((child, depth + 1))
    return found


def alive(pid: int, started: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return False
    fields = stat[stat.rfind(b")") + 2 :].split()
    return fields[0] not in (b"Z", b"X") and int(fields[19]) == started


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_sigkill_during_the_real_demo_kills_its_harness_sandboxes(tmp_path, no_leftovers):
    """The README demo with the real workloads: SIGKILL `whale run` while an evaluation runs the harness in its
    sandboxes (own PID namespaces, other uids); every process below it must end."""
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": str(root)}
    subprocess.run(
        [sys.executable, "-m", "synthetic.tiny_model", str(tmp_path / ".whale/models/synthetic-tiny")],
        cwd=tmp_path,
        env=env,
        check=True,
        capture_output=True,
        timeout=300,
    )
    (tmp_path / "manifests").symlink_to(root / "manifests")
    out = open(tmp_path / "whale-run.out", "ab")  # noqa: SIM115 - closed below
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "whale.cli",
            "run",
            "manifests/examples/local/tiny-synthetic-whale.yaml",
            "--store",
            "st",
        ],
        cwd=tmp_path,
        env=env,
        stdout=out,
        stderr=subprocess.STDOUT,
    )
    out.close()
    try:

        def sandboxes_running() -> bool:
            assert proc.poll() is None, (tmp_path / "whale-run.out").read_text()[-3000:]
            # runner -> supervisor (1) -> workload (2) -> sandbox launcher (3) -> what it starts (4+)
            return max((depth for _, depth in descendants(proc.pid).values()), default=0) >= 3

        wait_for(sandboxes_running, 300, "the first evaluation's harness sandboxes")
        tree = {p: started for p, (started, _) in descendants(proc.pid).items()}  # just before the kill
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
        try:
            wait_for(lambda: not [p for p, s in tree.items() if alive(p, s)], 30, "every process below `whale run`")
        except AssertionError:
            left = {
                p: Path(f"/proc/{p}/cmdline").read_bytes().replace(b"\0", b" ") for p, s in tree.items() if alive(p, s)
            }
            raise AssertionError(f"{len(left)} of {len(tree)} processes outlived `whale run`: {left}") from None
    finally:
        if proc.poll() is None:
            proc.kill()
