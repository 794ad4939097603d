"""`whale stop`, `whale logs`, `whale list` and the live view, against real runs.

The runs are real local runners driving the simulated workloads (tests/workloads/simulated.py) as
subprocesses over a real store; the CLI tests start `whale run` itself as a subprocess, the way a person
does, and talk to it only through the store, as another terminal (or machine) would.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import yaml
from rich.console import Console
from typer.testing import CliRunner

from tests.fixtures.bounds import RUN_BOUND_S, RUN_TEST_TIMEOUT_S
from whale.cli import app
from whale.console.display import RunDisplay
from whale.console.logs import CHUNK_BYTES, LogReader, LogTarget, find_target, show
from whale.console.progress import latest_reward
from whale.core import layout
from whale.core.convert import convert_v1alpha1
from whale.core.protocol import ProgressStage
from whale.core.spec import WhaleRunSpec
from whale.core.status import RunPhase, WhaleRunStatus
from whale.runner.control import StopRequest, read_stop, request_stop
from whale.runner.local import LocalRunner, RunnerView, RunStopped
from whale.store import open_store
from whale.store.local import LocalStore

pytestmark = pytest.mark.timeout(RUN_TEST_TIMEOUT_S)

SIM = (sys.executable, "-m", "tests.workloads.simulated")
SIZES = {"weight": 2560, "harness": 4, "test": 10}
SPEC = {
    "domain": "counting",
    "condition": "rsft_only",
    "model": {"name": "tiny"},
    "schedule": {"totalSteps": 3},
    "evaluation": {"atStart": False},
    "retry": {"maxAttempts": 2},
}
REWARDS = [0.25, 0.5, 0.75]
cli = CliRunner()


@pytest.fixture(autouse=True)
def _plugin(counting_domain):
    return counting_domain


def runner(tmp_path: Path, store, sim: dict | None = None, **kw) -> LocalRunner:
    return LocalRunner(
        name="r1",
        spec=WhaleRunSpec.model_validate(SPEC),
        store=store,
        split_sizes=SIZES,
        workdir=tmp_path / "work",
        workload_command=SIM,
        env={"WHALE_SIM": json.dumps({"reward": REWARDS, **(sim or {})})},
        poll_interval_s=0.05,
        view_interval_s=0.0,
        **kw,
    )


def wait_for(predicate: Callable[[], object], timeout_s: float, what: str) -> object:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")


# ----- the runner's view: the step just sampled ---------------------------------------------------


class Seen(KeyboardInterrupt):
    """Ends the run from the view callback once the test has seen what it waits for."""


def test_the_view_shows_the_reward_of_the_step_just_sampled_before_its_metrics_line(tmp_path):
    """Step 2 of the weight phase is sampled (its progress object carries its reward) and its update runs
    (the workload blocks there): the view already says step 2's reward, while the metrics hold step 1."""
    store = open_store(str(tmp_path / "store"))
    console = Console(record=True, width=200)
    display = RunDisplay("r1", console, live=False)
    seen: list[RunnerView] = []

    def on_view(view: RunnerView) -> None:
        display(view)
        child = view.child
        if child and child.progress and child.progress.step == 2 and child.progress.stage is ProgressStage.TRAINING:
            seen.append(view)
            raise Seen()

    r = runner(tmp_path, store, sim={"hang_training": {"c01-weight": 2}}, on_view=on_view)
    with pytest.raises(Seen):
        r.run(max_seconds=RUN_BOUND_S)
    view = seen[0]
    assert [m.step for m in view.child.metrics] == [1]
    assert view.status.step == 1 and view.status.training_reward == REWARDS[0]
    reward = latest_reward(display.prev.child, view.status)
    assert (reward.step, reward.reward, reward.sampled_only) == (2, REWARDS[1], True)
    text = console.export_text()
    assert "c01-weight step 2 sampled: reward 0.500" in text
    assert text.index("c01-weight step 1 done (1/3): reward 0.250") < text.index("c01-weight step 2 sampled")


# ----- stop through the store ---------------------------------------------------------------------


def stop_when_running(store) -> Callable[[RunnerView], None]:
    def on_view(view: RunnerView) -> None:
        if view.child is not None and view.child.request.phase == "c01-weight" and read_stop(store, "r1") is None:
            assert request_stop(store, "r1", "2025-01-01T00:00:00Z") is not None

    return on_view


@pytest.mark.parametrize("backend", ["folder", "s3"])
def test_a_stop_request_in_the_store_stops_the_runner_holding_the_lock(tmp_path, backend, request):
    store = open_store(str(tmp_path / "store")) if backend == "folder" else request.getfixturevalue("s3_store")
    env = request.getfixturevalue("s3_server").env() if backend == "s3" else {}
    r = runner(
        tmp_path,
        store,
        sim={"hang": {"c01-weight": 1}},
        on_view=stop_when_running(store),
        resume_hint="whale run r1.yaml",
    )
    r.env.update(env)
    with pytest.raises(RunStopped, match="stopped by `whale stop`"):
        r.run(max_seconds=RUN_BOUND_S)
    assert all(p.popen.poll() is not None for p in r.procs.values()), "no workload outlives a stop"
    saved = WhaleRunStatus.model_validate(store.read_json(layout.status_key("r1")))
    assert saved.phase is RunPhase.INTERRUPTED and saved.reason == "Interrupted"
    assert [(c.type, c.reason) for c in saved.conditions] == [("Interrupted", "StopRequested")]
    assert "stopped by `whale stop` (pid" in saved.message and "run `whale run r1.yaml` to resume" in saved.message
    assert read_stop(store, "r1") is None, "a handled request is removed"
    assert store.read_lease(layout.lock_key("r1")) is None or not store.read_lease(layout.lock_key("r1")).live
    # the next runner resumes and finishes
    again = runner(tmp_path, store)
    again.env.update(env)
    assert again.run(max_seconds=RUN_BOUND_S).phase is RunPhase.SUCCEEDED


def test_a_stop_request_for_an_earlier_runner_is_dropped_not_obeyed(tmp_path):
    store = open_store(str(tmp_path / "store"))
    stale = StopRequest(owner="a-runner-that-is-gone", requested_at="2025-01-01T00:00:00Z", by="pid 1 on host x")
    store.write_json(layout.stop_request_key("r1"), stale.to_wire())
    assert runner(tmp_path, store).run(max_seconds=RUN_BOUND_S).phase is RunPhase.SUCCEEDED
    assert read_stop(store, "r1") is None
    assert request_stop(store, "r1", "2025-01-01T00:00:00Z") is None, "nothing runs it now: nothing is written"
    assert read_stop(store, "r1") is None


# ----- logs: bounded reads ------------------------------------------------------------------------


class RecordingStore(LocalStore):
    """A real folder store that records the length of every ranged read (named as such: it only watches)."""

    def __init__(self, root: Path):
        super().__init__(root)
        self.reads: list[int] = []

    def read_range(self, key: str, offset: int, length: int) -> bytes:
        data = super().read_range(key, offset, length)
        self.reads.append(len(data))
        return data

    def read_bytes(self, key: str) -> bytes:
        if key.endswith(".log"):
            raise AssertionError(f"a log is read whole: {key}")
        return super().read_bytes(key)


def test_a_log_is_read_in_bounded_pieces_and_tail_keeps_only_the_last_lines(tmp_path):
    store = RecordingStore(tmp_path / "store")
    key = layout.log_key("r1", "c01-weight", 1)
    lines = [f"line {i} " + "x" * 100 for i in range(3000)]  # ~330 KB
    store.write_bytes(key, ("\n".join(lines) + "\n").encode())
    target = LogTarget("c01-weight", 1, key)
    out: list[str] = []
    show(store, "r1", target, out.append)
    assert "".join(out) == "\n".join(lines) + "\n"
    assert max(store.reads) <= CHUNK_BYTES and len(store.reads) > 4
    out.clear()
    show(store, "r1", target, out.append, tail=2)
    assert "".join(out) == "\n".join(lines[-2:]) + "\n"
    reader = LogReader(store, target, offset=store.local_path(key).stat().st_size)
    assert reader.read() == b""  # at the end: nothing, not an error


# ----- the CLI against a real `whale run` ---------------------------------------------------------


def processes_of(marker: str) -> dict[int, str]:
    found = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            text = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode("utf-8", "replace")
        except OSError:
            continue
        if marker in text:
            found[int(entry)] = text
    return found


@pytest.fixture
def no_leftovers(tmp_path: Path) -> Iterator[None]:
    yield
    for pid in processes_of(str(tmp_path)):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def manifest(tmp_path: Path) -> Path:
    path = tmp_path / "sig.yaml"
    path.write_text(
        yaml.safe_dump(
            convert_v1alpha1(
                {"apiVersion": "whale.dev/v1alpha1", "kind": "WhaleRun", "metadata": {"name": "sig"}, "spec": SPEC}
            )
        )
    )
    return path


def start(tmp_path: Path, argv: list[str], sim: dict, out_name: str) -> subprocess.Popen:
    out = open(tmp_path / out_name, "ab")  # noqa: SIM115 - closed with the process, below
    proc = subprocess.Popen(
        [sys.executable, "-m", "whale.cli", *argv],
        cwd=tmp_path,
        stdout=out,
        stderr=subprocess.STDOUT,
        env={**os.environ, "WHALE_SIM": json.dumps(sim), "WHALE_WORKLOAD_COMMAND": " ".join(SIM)},
    )
    out.close()
    return proc


def test_list_logs_and_stop_a_real_whale_run_then_resume_it(tmp_path, no_leftovers):
    store_dir = str(tmp_path / "store")
    run = start(
        tmp_path,
        ["run", str(manifest(tmp_path)), "--store", store_dir, "--workdir", str(tmp_path / "work")],
        {"hang": {"c01-weight": 1}},
        "run.out",
    )
    work_log = tmp_path / "work" / "logs" / "c01-weight.attempt-1.log"
    wait_for(lambda: work_log.is_file() and "simulated hang" in work_log.read_text(), 60, "the weight phase to hang")
    assert run.poll() is None

    # list: the run, its phase running now (the step as the runner last saw it) and its runner
    def listed() -> dict:
        res = cli.invoke(app, ["list", "--store", store_dir, "-o", "json"])
        assert res.exit_code == 0, res.output
        (row,) = json.loads(res.output)["runs"]
        return row if row["now"] == "c01-weight step 1/3" else {}

    row = wait_for(listed, 30, "whale list to show step 1 of the weight phase")
    assert (row["name"], row["phase"], row["runner"].split(" on ")[0]) == ("sig", "Running", f"pid {run.pid}")

    # logs while the child runs: the live file on this host, and the store copy for another machine
    res = cli.invoke(app, ["logs", "sig", "--store", store_dir])
    assert res.exit_code == 0 and "simulated hang" in res.output, res.output
    store = open_store(store_dir)
    elsewhere = find_target(store, "sig", host="another-host")
    assert elsewhere.local is None and elsewhere.key == layout.log_key("sig", "c01-weight", 1)

    def from_store() -> bool:
        out: list[str] = []
        show(store, "sig", elsewhere, out.append)
        return "simulated hang" in "".join(out)

    wait_for(from_store, 30, "the runner to copy the running child's log to the store")
    follower = start(tmp_path, ["logs", "sig", "-f", "--store", store_dir], {}, "follow.out")
    wait_for(lambda: "simulated hang" in (tmp_path / "follow.out").read_text(), 30, "logs -f to print the live log")
    assert follower.poll() is None, "-f keeps following while the run runs"

    # stop: through the store; the runner stops its child, saves the status, exits 3
    res = cli.invoke(app, ["stop", "sig", "--store", store_dir, "--timeout", "60"])
    assert res.exit_code == 0, res.output
    assert f"asked the runner of sig to stop: pid {run.pid}" in res.output
    assert "stopped: run sig is Interrupted; interrupted at" in res.output and "whale stop" in res.output
    assert run.wait(timeout=30) == 3
    out = (tmp_path / "run.out").read_text()
    assert (
        "stopped by `whale stop`" in out
        and f"run `whale run {manifest(tmp_path)} --store {store_dir}` to resume" in out
        and "Traceback" not in out
    ), out
    assert follower.wait(timeout=30) == 0, "logs -f ends with the run"
    assert "==> c01-weight (attempt 1) <==" in (tmp_path / "follow.out").read_text()
    wait_for(lambda: not processes_of(str(tmp_path)), 30, "every process of the run to end")
    status = WhaleRunStatus.model_validate(store.read_json(layout.status_key("sig")))
    assert [(c.type, c.reason) for c in status.conditions] == [("Interrupted", "StopRequested")]
    res = cli.invoke(app, ["list", "--store", store_dir], env={"COLUMNS": "200"})
    assert "not running (interrupted: StopRequested)" in res.output, res.output
    res = cli.invoke(app, ["stop", "sig", "--store", store_dir])
    assert res.exit_code == 0 and "not running (no runner holds its lock): nothing to stop" in res.output

    # the same command resumes it to the end
    run = start(
        tmp_path,
        ["run", str(manifest(tmp_path)), "--store", store_dir, "--workdir", str(tmp_path / "work")],
        {},
        "run2.out",
    )
    assert run.wait(timeout=120) == 0, (tmp_path / "run2.out").read_text()
    res = cli.invoke(app, ["list", "--store", store_dir, "-o", "json"])
    (row,) = json.loads(res.output)["runs"]
    assert (row["phase"], row["runner"], row["best"]) == ("Succeeded", "-", "0.0300 @8")
    res = cli.invoke(app, ["logs", "sig", "--store", store_dir, "--phase", "c01-weight", "--tail", "1"])
    assert res.exit_code == 0 and res.output.count("\n") == 1, res.output
    res = cli.invoke(app, ["logs", "sig", "--store", store_dir, "--phase", "c09-weight"])
    assert res.exit_code == 1 and "no log of phase 'c09-weight'" in res.output
    assert (
        "phases with logs: c01-weight, eval-c01-s000001-weight, eval-c01-s000002-weight, eval-c01-s000003-weight"
        in res.output
    )


def test_status_logs_and_stop_of_an_unknown_run_name_the_store_and_its_runs(tmp_path):
    store_dir = tmp_path / "store"
    r = runner(tmp_path, open_store(str(store_dir)))
    r.run(max_seconds=RUN_BOUND_S)
    for command in (["status", "ghost"], ["logs", "ghost"], ["stop", "ghost"]):
        res = cli.invoke(app, [*command, "--store", str(store_dir)])
        assert res.exit_code == 1, res.output
        assert f"no run named 'ghost' in the store file://{store_dir}; runs there: r1" in res.output
    res = cli.invoke(app, ["list", "--store", str(tmp_path / "nowhere")])
    assert res.exit_code == 1 and f"no store at {tmp_path / 'nowhere'}" in res.output
    assert not (tmp_path / "nowhere").exists(), "looking must not create a store"
    empty = tmp_path / "empty"
    empty.mkdir()
    res = cli.invoke(app, ["list", "--store", str(empty)])
    assert res.exit_code == 0 and "no runs in" in res.output


@pytest.mark.parametrize("backend", ["folder", "s3"])
def test_ranged_reads_of_both_backends(tmp_path, backend, request):
    """What `whale logs` relies on: a piece from an offset, fewer bytes at the end, nothing past it."""
    from whale.store import ObjectNotFound, StoreError

    store = open_store(str(tmp_path / "store")) if backend == "folder" else request.getfixturevalue("s3_store")
    store.write_bytes("runs/x/log", b"0123456789")
    assert store.read_range("runs/x/log", 2, 3) == b"234"
    assert store.read_range("runs/x/log", 8, 100) == b"89"
    assert store.read_range("runs/x/log", 10, 5) == b"" and store.read_range("runs/x/log", 50, 5) == b""
    assert store.read_range("runs/x/log", 0, 0) == b""
    with pytest.raises(ObjectNotFound):
        store.read_range("runs/x/missing", 0, 5)
    with pytest.raises(StoreError, match="must be >= 0"):
        store.read_range("runs/x/log", -1, 5)


def test_a_broken_display_does_not_stop_the_run(tmp_path, caplog):
    def broken(view: RunnerView) -> None:
        raise ValueError("a display bug")

    r = runner(tmp_path, open_store(str(tmp_path / "store")), on_view=broken)
    assert r.run(max_seconds=RUN_BOUND_S).phase is RunPhase.SUCCEEDED
    assert r.on_view is None and "the progress display failed; the run goes on without it" in caplog.text


def test_a_detached_run_runs_in_the_background_until_stopped(tmp_path, no_leftovers):
    store_dir, work = str(tmp_path / "store"), tmp_path / "work"
    argv = ["run", str(manifest(tmp_path)), "--store", store_dir, "--workdir", str(work), "--detach"]
    detaching = start(tmp_path, argv, {"hang": {"c01-weight": 1}}, "detach.out")
    assert detaching.wait(timeout=90) == 0, (tmp_path / "detach.out").read_text()
    out = (tmp_path / "detach.out").read_text()
    pid = int(re.search(r"runs in the background \(pid (\d+)\); its output: (\S+)", out).group(1))
    assert f"logs sig --store {store_dir} -f" in out and f"stop sig --store {store_dir}" in out
    lock = open_store(store_dir).read_lease(layout.lock_key("sig"))
    assert lock is not None and lock.live and lock.holder.pid == pid  # the background runner holds the run
    work_log = work / "logs" / "c01-weight.attempt-1.log"
    wait_for(lambda: work_log.is_file() and "simulated hang" in work_log.read_text(), 60, "the weight phase to hang")

    res = cli.invoke(app, ["stop", "sig", "--store", store_dir])
    assert res.exit_code == 0 and "stopped: run sig is Interrupted" in res.output, res.output
    wait_for(
        lambda: not Path(f"/proc/{pid}").exists() or "zombie" in Path(f"/proc/{pid}/status").read_text(),
        30,
        "the background runner to end",
    )
    assert "stopped by `whale stop`" in (work / "runner.log").read_text()
