"""The run control both controllers share: the plan they carry out, the store observer, the serving
target's one writer and the one storage-connection builder."""

from __future__ import annotations

import json
import logging
import random
from typing import Any

from whale.control import storage
from whale.control.observer import StoreObserver, read_metrics
from whale.control.planner import KEEP_SERVING, RunEnd, plan, write_request
from whale.control.serving import UNSET, serve, serving
from whale.core import layout
from whale.core.alternation import (
    Child,
    ChildState,
    Fail,
    Finish,
    ServeCheckpoint,
    StartPhase,
    StopPhase,
    SuspendRun,
    Transition,
)
from whale.core.protocol import (
    EvalPhaseArgs,
    HarnessIterationMetrics,
    HarnessPhaseArgs,
    parse_request,
    phase_request,
)
from whale.core.spec import Storage
from whale.core.status import EvalPoint, Reason, RunPhase, WhaleRunStatus
from whale.store import open_store, s3

from .sim import weight_line

#: the least spec a request can be made from
MIN_SPEC = {"domain": "synthetic", "condition": "rsft_only", "model": {"name": "m"}, "schedule": {"totalSteps": 4}}


RUN = "ctl"


def spied(monkeypatch: Any, store: Any, method: str, calls: list[str], label: str = "") -> None:
    """``store.<method>`` counted: each call appends its first argument (a key or a prefix, after ``label``) to
    ``calls``, then runs as before."""
    real = getattr(store, method)

    def counted(key: str, *args: Any, **kwargs: Any) -> Any:
        calls.append(f"{label}{key}")
        return real(key, *args, **kwargs)

    monkeypatch.setattr(store, method, counted)


ITERATION_1 = HarnessIterationMetrics(iteration=1, best_score=0.5, best_candidate="i01-incoming", rollouts=4)
RUNNING = WhaleRunStatus(phase=RunPhase.RUNNING)


def harness_start(checkpoint: str | None = "ck/4") -> StartPhase:
    args = HarnessPhaseArgs(cycle=1, incoming_harness=None, checkpoint=checkpoint, step=4, iterations=3, archive="a")
    return StartPhase(phase_request(MIN_SPEC, run=RUN, phase="c01-harness", attempt=1, args=args))


def eval_start(checkpoint: str | None = "ck/2") -> StartPhase:
    args = EvalPhaseArgs(cycle=1, step=2, after="weight", checkpoint=checkpoint, harness=None)
    return StartPhase(phase_request(MIN_SPEC, run=RUN, phase="eval-c01-s000002-weight", attempt=1, args=args))


def test_owed_evaluations_start_first_and_serve_what_they_sample() -> None:
    step = plan(Transition(RUNNING, (harness_start(), eval_start())), running=())
    assert step.start == eval_start() and step.serve == "ck/2" and step.end is None


def test_one_child_at_a_time() -> None:
    decision = Transition(RUNNING, (harness_start(), eval_start()))
    assert plan(decision, running={"c01-weight"}).start is None
    # the phase that runs is asked for again (level-based): it is the plan's start, the controller sees it runs
    assert plan(decision, running={"c01-harness"}).start == harness_start()


def test_no_start_unless_running_and_the_end_is_named() -> None:
    failed = WhaleRunStatus(phase=RunPhase.FAILED)
    step = plan(Transition(failed, (Fail(Reason.PHASE_FAILED, "boom"), eval_start())), running=())
    assert (step.start, step.end, step.end_reason, step.serve) == (None, RunEnd.FAILED, "boom", KEEP_SERVING)
    assert plan(Transition(RUNNING, (Finish("done"),)), ()).end is RunEnd.FINISHED
    paused = WhaleRunStatus(phase=RunPhase.SUSPENDED)
    suspended = plan(Transition(paused, (ServeCheckpoint("ck/9"), SuspendRun("s"))), ())
    assert (suspended.end, suspended.serve) == (RunEnd.SUSPENDED, "ck/9")
    stop = StopPhase("c01-weight", "patience")
    assert plan(Transition(RUNNING, (stop,)), {"c01-weight"}).stops == (stop,)


def test_the_observer_reads_only_what_can_change_the_status(tmp_path) -> None:
    store = open_store(str(tmp_path / "store"))
    store.write_json(layout.result_key(RUN, "c01-weight"), {"finalStep": 2})
    store.write_json(layout.result_key(RUN, "eval-c01-s000002-weight"), {"meanAtK": 0.5, "k": 1, "items": 1})
    store.write_json(layout.request_key(RUN, "c01-harness"), {})  # no result yet
    store.append_jsonl(layout.metrics_key(RUN, "c01-harness"), ITERATION_1.to_wire())
    store.write_bytes(layout.checkpoint_prefix(RUN, 2) + "/model.safetensors", b"x")
    store.write_bytes(layout.checkpoint_prefix(RUN, 4) + "/model.safetensors", b"x")  # incomplete
    store.write_bytes(layout.checkpoint_complete_key(RUN, 2), b"")
    status = WhaleRunStatus(
        phase=RunPhase.RUNNING,
        completed_phases=["c01-weight"],
        active_phase="c01-harness",
        evals=[EvalPoint(phase="eval-c01-s000002-weight", cycle=1, step=2, after="weight")],
    )
    obs = StoreObserver(store, RUN).observe(status, {}, {"weight": 1}, now="t")
    assert obs.results == {"eval-c01-s000002-weight": {"meanAtK": 0.5, "k": 1, "items": 1}}
    assert obs.metrics == {"c01-harness": (ITERATION_1,)} and obs.checkpoints == frozenset({2})
    absorbed = status.model_copy(update={"evals": [status.evals[0].finished(0.5, 1)]})
    assert StoreObserver(store, RUN).results(absorbed) == {}


def test_an_observation_without_results_reuses_the_last_read_less_what_was_absorbed(tmp_path) -> None:
    """A progress poll (``results=False``) reads the running phase's metrics and the checkpoints, not the results:
    those read last time, less what the status has absorbed since."""
    store = open_store(str(tmp_path / "store"))
    eval_key = "eval-c01-s000002-weight"
    store.write_json(layout.result_key(RUN, eval_key), {"meanAtK": 0.5, "k": 1, "items": 1})
    status = WhaleRunStatus(
        phase=RunPhase.RUNNING,
        active_phase="c01-harness",
        evals=[EvalPoint(phase=eval_key, cycle=1, step=2, after="weight")],
    )
    observer = StoreObserver(store, RUN)
    assert set(observer.observe(status, {}, {}, now="t").results) == {eval_key}
    store.write_json(layout.result_key(RUN, "c01-harness"), {"bestScore": 0.5})  # comes with its child's event
    store.append_jsonl(layout.metrics_key(RUN, "c01-harness"), ITERATION_1.to_wire())
    poll = observer.observe(status, {}, {}, now="t", results=False)
    assert set(poll.results) == {eval_key}, "not read again"
    assert poll.metrics == {"c01-harness": (ITERATION_1,)}, "what a running phase writes is read"
    absorbed = status.model_copy(update={"evals": [status.evals[0].finished(0.5, 1)]})
    assert observer.observe(absorbed, {}, {}, now="t", results=False).results == {}
    assert set(observer.observe(absorbed, {}, {}, now="t").results) == {"c01-harness"}


def test_after_its_first_reading_the_observer_reads_only_the_phases_in_flight(tmp_path, monkeypatch) -> None:
    """A run 30 evaluations in: its phases are listed at the observer's first reading (and again for a status that
    counts no attempt: a new or reset one); after that a reading asks for the results of the phases launched and not
    absorbed, or with a child, only, so its cost does not grow with the run's length, and it still finds what an
    in-flight phase writes."""
    store = open_store(str(tmp_path / "store"))
    listed: list[str] = []
    read: list[str] = []
    spied(monkeypatch, store, "list", listed)
    spied(monkeypatch, store, "read_json_or_none", read)
    done = [f"eval-c{c:02d}-s{2 * c:06d}-weight" for c in range(1, 31)]
    for phase in done:
        store.write_json(layout.result_key(RUN, phase), {"meanAtK": 0.5, "k": 1, "items": 1})
    status = WhaleRunStatus(
        phase=RunPhase.RUNNING,
        active_phase="c31-harness",
        evals=[EvalPoint(phase=p, cycle=c, step=2 * c, after="weight").finished(0.5, 1) for c, p in enumerate(done, 1)],
        attempts={**dict.fromkeys(done, 1), "c31-harness": 1},
    )
    observer = StoreObserver(store, RUN)
    assert observer.results(status) == {} and len(listed) == 1, "the first reading lists the run's phases"
    assert read == [], "an absorbed phase's result is never read again (and c31-harness has written nothing yet)"
    store.write_json(layout.result_key(RUN, "c31-harness"), {"bestScore": 0.5})
    read.clear()
    assert observer.results(status) == {"c31-harness": {"bestScore": 0.5}} and len(listed) == 1, "no listing"
    assert read == [layout.result_key(RUN, "c31-harness")]
    child = {"eval-c31-s000062-harness": Child(ChildState.SUCCEEDED)}  # a child the status does not count yet
    store.write_json(layout.result_key(RUN, "eval-c31-s000062-harness"), {"meanAtK": 0.7, "k": 1, "items": 1})
    assert set(observer.results(status, child)) == {"c31-harness", "eval-c31-s000062-harness"} and len(listed) == 1
    fresh = WhaleRunStatus(phase=RunPhase.RUNNING)  # a status begun again: what the store holds is taken in
    assert len(observer.results(fresh)) == 32 and len(listed) == 2


def test_checkpoints_are_listed_again_only_while_a_weight_phase_is_in_flight(tmp_path, monkeypatch) -> None:
    """Only a weight phase writes checkpoints, and a run keeps them until it succeeds: after a first listing the
    store's checkpoints are listed again only while a weight phase has a child or an unabsorbed result, so a reading
    during a harness phase or an evaluation costs nothing that grows with the run's checkpoints."""
    store = open_store(str(tmp_path / "store"))
    listed: list[str] = []
    spied(monkeypatch, store, "list", listed)
    checkpoints = layout.checkpoints_prefix(RUN) + "/"

    def complete(step: int) -> None:
        store.write_bytes(layout.checkpoint_prefix(RUN, step) + "/model.safetensors", b"x")
        store.write_bytes(layout.checkpoint_complete_key(RUN, step), b"")

    complete(2)
    status = WhaleRunStatus(phase=RunPhase.RUNNING, active_phase="c02-harness", attempts={"c02-harness": 1})
    observer = StoreObserver(store, RUN)
    harness = {"c02-harness": Child(ChildState.RUNNING)}
    assert observer.observe(status, harness, {}, now="t").checkpoints == frozenset({2})
    assert listed.count(checkpoints) == 1, "the first reading lists them"
    assert observer.observe(status, harness, {}, now="t").checkpoints == frozenset({2})
    assert listed.count(checkpoints) == 1, "a harness phase writes none: not listed again"

    weight = WhaleRunStatus(phase=RunPhase.RUNNING, active_phase="c03-weight", attempts={"c03-weight": 1})
    complete(4)
    running = {"c03-weight": Child(ChildState.RUNNING)}
    assert observer.observe(weight, running, {}, now="t").checkpoints == frozenset({2, 4}), "a weight child runs"
    complete(6)  # its last checkpoint, then its result; its child is gone by the next reading
    store.write_json(layout.result_key(RUN, "c03-weight"), {"finalStep": 6})
    assert observer.observe(weight, {}, {}, now="t").checkpoints == frozenset({2, 4, 6}), "its result is not absorbed"
    absorbed = weight.model_copy(update={"completed_phases": ["c03-weight"], "active_phase": None})
    calls = listed.count(checkpoints)
    assert observer.observe(absorbed, {}, {}, now="t").checkpoints == frozenset({2, 4, 6})
    assert listed.count(checkpoints) == calls, "nothing in flight writes checkpoints"


def test_a_metrics_line_that_does_not_parse_is_skipped_with_one_warning(tmp_path, caplog) -> None:
    """A workload that wrote a bad line (a crash mid-write is not one: jsonl appends are whole lines) does not
    stop the controller: the line is skipped, the warning names the phase, the line and the field, once."""
    store = open_store(str(tmp_path / "store"))
    key = layout.metrics_key(RUN, "c01-harness")
    store.append_jsonl(key, ITERATION_1.to_wire())
    store.append_jsonl(key, {"iteration": 2, "bestScore": "high", "bestCandidate": "c", "rollouts": 4})
    store.append_jsonl(key, {"iteration": 3, "bestCandidate": "c", "rollouts": 4})
    store.write_bytes(key, store.read_bytes(key) + b'{"iteration": 4, "bestSc\n')  # not JSON at all
    status = WhaleRunStatus(phase=RunPhase.RUNNING, active_phase="c01-harness")
    observer = StoreObserver(store, RUN)
    with caplog.at_level(logging.WARNING, logger="whale.control.observer"):
        assert observer.metrics(status) == {"c01-harness": (ITERATION_1,)}
        assert observer.metrics(status) == {"c01-harness": (ITERATION_1,)}  # re-read every poll: warned once
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 3, warnings
    assert "phase c01-harness: ignoring line 2 of" in warnings[0] and "field bestScore" in warnings[0]
    assert "line 3" in warnings[1] and "field bestScore: Field required" in warnings[1]
    assert "line 4" in warnings[2] and "not valid JSON" in warnings[2]


def test_serving_has_one_writer_that_writes_only_a_change(tmp_path) -> None:
    store = open_store(str(tmp_path / "store"))
    assert serving(store, RUN) is UNSET
    assert serve(store, RUN, None) and serving(store, RUN) is None
    assert not serve(store, RUN, None)
    assert serve(store, RUN, "ck/2") and store.read_json(layout.serving_key(RUN)) == {"checkpoint": "ck/2"}


def test_a_request_is_written_before_launch_and_only_when_it_changed(tmp_path) -> None:
    store = open_store(str(tmp_path / "store"))
    req = eval_start().request
    write_request(store, RUN, req)
    assert parse_request(store.read_json(layout.request_key(RUN, req.phase))) == req


def test_a_writer_that_remembers_its_requests_asks_the_store_nothing(tmp_path, monkeypatch) -> None:
    """``written``: the request's one writer remembers what it wrote, so a phase start reads nothing (on S3 a read is
    a request, "no such key" at each new phase) and a start repeated while the phase waits writes nothing."""
    store = open_store(str(tmp_path / "store"))
    calls: list[str] = []
    spied(monkeypatch, store, "read_json_or_none", calls, "read ")
    spied(monkeypatch, store, "write_json", calls, "write ")
    req = eval_start().request
    key = layout.request_key(RUN, req.phase)
    written: dict[str, Any] = {}
    write_request(store, RUN, req, written)
    assert calls == [f"write {key}"] and parse_request(store.read_json(key)) == req
    write_request(store, RUN, req, written)
    assert calls == [f"write {key}"], "the same request again: nothing written, nothing read"
    write_request(store, RUN, req, {})  # a writer that remembers nothing (a restarted operator): written, not read
    assert calls == [f"write {key}"] * 2
    calls.clear()
    write_request(store, RUN, req)  # no memory at all: read to compare, the same: not written
    assert calls == [f"read {key}"]


def test_one_storage_connection_for_processes_and_children() -> None:
    s = Storage(uri="s3://b/p", endpoint="minio:9000", secure=True, region="eu")
    assert storage.connection(s) == {"endpoint": "minio:9000", "secure": True, "region": "eu"}
    assert storage.connection(s, "/tmp/folder") == {} and storage.connection(Storage(uri="file:///x")) == {}
    assert storage.connection_env(s) == {s3.ENV_ENDPOINT: "minio:9000", s3.ENV_SECURE: "true", s3.ENV_REGION: "eu"}
    assert storage.connection_env(Storage()) == {s3.ENV_SECURE: "false"}


def test_a_phase_whose_child_runs_is_read_once_then_when_its_child_has_ended(tmp_path, monkeypatch) -> None:
    """``ended``: the phases whose child a controller sees ended (a reconcile woken by a watch event): only their results
    are read, and those of phases never read yet; a phase whose child runs is not read again (on S3 each would be a
    request answered "no such key" for the hours a phase runs), its last reading stands. With ``progress=False`` a
    running weight phase's checkpoints are not listed again (the next progress poll does)."""
    store = open_store(str(tmp_path / "store"))
    reads: list[str] = []
    listed: list[str] = []
    bytes_read: list[str] = []
    spied(monkeypatch, store, "read_json_or_none", reads)
    spied(monkeypatch, store, "list", listed)
    spied(monkeypatch, store, "read_bytes", bytes_read)

    def metrics_read() -> list[str]:
        return [k for k in bytes_read if k.endswith("/metrics.jsonl")]

    weight, evaluation = "c01-weight", "eval-c00-s000000-start"
    store.write_json(layout.result_key(RUN, evaluation), {"meanAtK": 0.5, "k": 1, "items": 1})
    status = WhaleRunStatus(
        phase=RunPhase.RUNNING,
        active_phase=weight,
        attempts={weight: 1, evaluation: 1},
        evals=[EvalPoint(phase=evaluation, cycle=0, step=0, after="start")],
    )
    both = {weight: Child(ChildState.RUNNING), evaluation: Child(ChildState.RUNNING)}
    observer = StoreObserver(store, RUN)
    first = observer.observe(status, both, {}, now="t", ended=(), progress=False)
    assert set(first.results) == {evaluation}, "read once: what is there is taken in"
    assert reads == [layout.result_key(RUN, evaluation)], "the first reading lists the run's phases: none of c01 yet"
    assert metrics_read() == [layout.metrics_key(RUN, weight), layout.metrics_key(RUN, evaluation)], (
        "each running phase's"
    )
    reads.clear()
    bytes_read.clear()
    listings = len(listed)
    store.write_json(layout.result_key(RUN, weight), {"finalStep": 2})  # written before its child ends
    store.append_jsonl(layout.metrics_key(RUN, weight), {"step": 1})
    bytes_read.clear()  # (the append read the file)
    again = observer.observe(status, both, {}, now="t", ended=(), progress=False)
    assert reads == [] and len(listed) == listings, "neither result read again, the checkpoints not listed"
    assert metrics_read() == [], "nor the metrics lines"
    assert set(again.results) == {evaluation} and again.metrics == first.metrics, "the last readings stand"
    ended = {weight: Child(ChildState.SUCCEEDED), evaluation: Child(ChildState.RUNNING)}
    done = observer.observe(status, ended, {}, now="t", ended={weight}, progress=False)
    assert reads == [layout.result_key(RUN, weight)], "the ended child's result, and only it"
    assert metrics_read() == [layout.metrics_key(RUN, weight)], "the ended phase's lines, not the running evaluation's"
    assert set(done.results) == {weight, evaluation}
    assert len(listed) == listings + 1, "a weight phase that has ended: its checkpoints listed"
    reads.clear()
    full = observer.observe(status, ended, {}, now="t")
    assert sorted(reads) == sorted([layout.result_key(RUN, weight), layout.result_key(RUN, evaluation)])
    assert set(full.results) == {weight, evaluation}


def test_a_poll_lists_a_weight_phase_s_checkpoints_only_when_asked(tmp_path, monkeypatch) -> None:
    """``checkpoints=False`` (a poll of a weight phase none of whose checkpoints is evaluated before it ends): its
    metrics lines are read as every poll reads them, its checkpoints are not listed; once its child has ended they are."""
    store = open_store(str(tmp_path / "store"))
    listed: list[str] = []
    spied(monkeypatch, store, "list", listed)
    checkpoints = layout.checkpoints_prefix(RUN) + "/"
    weight = "c01-weight"
    status = WhaleRunStatus(phase=RunPhase.RUNNING, active_phase=weight, attempts={weight: 1})
    running = {weight: Child(ChildState.RUNNING)}
    observer = StoreObserver(store, RUN)
    observer.observe(status, running, {}, now="t")  # the first reading lists them
    first = listed.count(checkpoints)
    store.write_bytes(layout.checkpoint_prefix(RUN, 2) + "/model.safetensors", b"x")
    store.write_bytes(layout.checkpoint_complete_key(RUN, 2), b"")
    store.append_jsonl(layout.metrics_key(RUN, weight), {"step": 1})
    poll = observer.observe(status, running, {}, now="t", ended=(), checkpoints=False)
    assert listed.count(checkpoints) == first and poll.checkpoints == frozenset(), "not listed while it runs"
    assert weight in poll.metrics, "its lines are read"
    assert observer.observe(status, running, {}, now="t", ended=()).checkpoints == frozenset({2}), "asked: listed"
    ended = {weight: Child(ChildState.SUCCEEDED)}
    store.write_bytes(layout.checkpoint_prefix(RUN, 4) + "/model.safetensors", b"x")
    store.write_bytes(layout.checkpoint_complete_key(RUN, 4), b"")
    done = observer.observe(status, ended, {}, now="t", ended={weight}, checkpoints=False)
    assert done.checkpoints == frozenset({2, 4}), "its child has ended: listed"


def test_a_growing_metrics_file_is_parsed_a_line_at_a_time(tmp_path, monkeypatch) -> None:
    """A weight phase's file grows by a line a step and is read at every progress poll: the lines read before are
    not parsed again, and what the observer returns is what a whole reading returns."""
    from whale.control import observer as observer_module

    store = open_store(str(tmp_path / "store"))
    phase = "c01-weight"
    key = layout.metrics_key(RUN, phase)
    parsed: list[Any] = []
    real = observer_module.parse_metrics_line

    def counted(kind: Any, raw: Any) -> Any:
        parsed.append(raw)
        return real(kind, raw)

    monkeypatch.setattr(observer_module, "parse_metrics_line", counted)
    for step in (1, 2, 3):
        store.append_jsonl(key, weight_line(step, 0.5))
    observer = StoreObserver(store, RUN)
    assert len(observer.read_metrics(phase)) == 3 and len(parsed) == 3
    assert observer.read_metrics(phase) == read_metrics(store, RUN, phase)
    parsed.clear()
    store.append_jsonl(key, weight_line(4, 0.5))
    lines = observer.read_metrics(phase)
    assert [m.step for m in lines] == [1, 2, 3, 4]
    assert len(parsed) == 1, "only the new line is parsed"
    parsed.clear()
    assert observer.read_metrics(phase) == lines and parsed == []  # nothing new: nothing parsed


def test_a_rewritten_or_cut_metrics_file_is_read_as_whole_as_it_is_now(tmp_path) -> None:
    """Whatever happens to the file between two readings (lines appended, the file written afresh by a new attempt,
    cut short, a last line without its newline, lines that do not parse), the observer returns what a reading of the
    whole file returns."""
    store = open_store(str(tmp_path / "store"))
    phase = "c01-weight"
    key = layout.metrics_key(RUN, phase)
    observer = StoreObserver(store, RUN)
    rng = random.Random(7)
    data = b""
    for _ in range(300):
        op = rng.choice(["append", "append", "append", "bad", "partial", "afresh", "cut", "same"])
        if op == "append":
            data += json_line(weight_line(rng.randint(1, 50), 0.5))
        elif op == "bad":
            data += b'{"step": "x"}\n' if rng.random() < 0.5 else b"not json\n"
        elif op == "partial":
            data += json_line(weight_line(rng.randint(1, 50), 0.5))[:-1]  # no newline yet: the next append completes it
            data += b"" if rng.random() < 0.5 else b"\n"
        elif op == "afresh":
            data = json_line(weight_line(rng.randint(1, 50), 0.5))
        elif op == "cut":
            data = data[: rng.randint(0, len(data))]
            data = data[: data.rfind(b"\n") + 1]
        store.write_bytes(key, data)
        assert observer.read_metrics(phase) == read_metrics(store, RUN, phase), op


def test_a_bad_line_appended_later_is_named_by_its_line_number(tmp_path, caplog) -> None:
    store = open_store(str(tmp_path / "store"))
    key = layout.metrics_key(RUN, "c01-weight")
    for step in (1, 2):
        store.append_jsonl(key, weight_line(step, 0.5))
    observer = StoreObserver(store, RUN)
    assert len(observer.read_metrics("c01-weight")) == 2
    store.write_bytes(key, store.read_bytes(key) + b"\n" + b'{"step": 3, "rewardMean": "x"}\n')
    with caplog.at_level(logging.WARNING, logger="whale.control.observer"):
        assert len(observer.read_metrics("c01-weight")) == 2
        assert len(observer.read_metrics("c01-weight")) == 2
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 1 and "ignoring line 4 of" in warnings[0], warnings  # line 3 is the blank one


def json_line(raw: dict[str, Any]) -> bytes:
    return (json.dumps(raw) + "\n").encode()


def test_a_main_phase_without_a_child_keeps_its_last_reading_until_a_full_one(tmp_path, monkeypatch) -> None:
    """After a weight phase the evaluation of its checkpoint runs first and the next main phase waits, with no child:
    only a child writes a phase's lines, so a progress poll (``ended`` given, ``progress`` True) reads them once, not at
    every poll (on S3 a request answered "no such key" every 15 s for as long as the evaluation runs). A full reading
    (``ended`` None: the resync, a restart) reads them again; so does a poll once the phase's child runs."""
    store = open_store(str(tmp_path / "store"))
    bytes_read: list[str] = []
    spied(monkeypatch, store, "read_bytes", bytes_read)
    harness, evaluation = "c01-harness", "eval-c01-s000002-weight"
    status = WhaleRunStatus(phase=RunPhase.RUNNING, active_phase=harness, attempts={harness: 1, evaluation: 1})
    observer = StoreObserver(store, RUN)

    def poll(children: dict[str, Child], ended: frozenset[str] | None = frozenset()) -> list[str]:
        bytes_read.clear()
        observer.observe(status, children, {}, now="t", ended=ended, progress=True)
        return sorted(k for k in bytes_read if k.endswith("/metrics.jsonl"))

    waiting = {evaluation: Child(ChildState.RUNNING)}
    both = [layout.metrics_key(RUN, harness), layout.metrics_key(RUN, evaluation)]
    assert poll(waiting) == sorted(both), "the first reading reads both"
    assert poll(waiting) == [layout.metrics_key(RUN, evaluation)], "a poll: the running evaluation's lines only"
    assert poll(waiting, ended=None) == sorted(both), "a full reading reads everything"
    running = {harness: Child(ChildState.RUNNING)}
    store.append_jsonl(layout.metrics_key(RUN, harness), ITERATION_1.to_wire())
    bytes_read.clear()
    seen = observer.observe(status, running, {}, now="t", ended=frozenset(), progress=True)
    assert [k for k in bytes_read if k.endswith("/metrics.jsonl")] == [layout.metrics_key(RUN, harness)]
    assert seen.metrics[harness] == (ITERATION_1,), "its child runs: its lines are read at each poll again"
