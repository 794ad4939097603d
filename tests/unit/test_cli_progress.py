"""The display of `whale run`, driven by recorded frames: plain lines, ETAs, the rich view, the end of a run.

Everything here is a pure function of recorded values (status, request, metrics lines, progress object,
times), so each test replays a short sequence the runner could report and checks what a person reads.
"""

from __future__ import annotations

import dataclasses
import re
from datetime import UTC, datetime, timedelta

import pytest
from rich.console import Console

from whale.console.progress import (
    ChildFrame,
    Frame,
    Pace,
    RunWork,
    duration,
    events,
    latest_reward,
    phase_counts,
    render,
    run_eta_s,
    update_paces,
    work_counts,
)
from whale.console.summary import final_summary, next_commands
from whale.core.protocol import (
    EvalPhaseArgs,
    EvalProgress,
    HarnessIterationMetrics,
    HarnessPhaseArgs,
    PhaseProgress,
    PhaseRequest,
    ProgressStage,
    WeightPhaseArgs,
    WeightStepMetrics,
    phase_request,
)
from whale.core.status import BestEval, EvalPoint, RunPhase, Stage, WhaleRunStatus

#: the least spec a request can be made from
MIN_SPEC = {"domain": "synthetic", "condition": "rsft_only", "model": {"name": "m"}, "schedule": {"totalSteps": 4}}


T0 = datetime(2025, 3, 1, 12, 0, 0, tzinfo=UTC)
STAMP = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ ")


def weight_request(from_step: int = 0, target: int = 4, attempt: int = 1) -> PhaseRequest:
    return phase_request(
        MIN_SPEC,
        run="r",
        phase="c01-weight",
        attempt=attempt,
        args=WeightPhaseArgs(
            cycle=1,
            harness=None,
            from_checkpoint=None,
            from_step=from_step,
            target_step=target,
            steps_per_epoch=10,
            total_steps=target,
        ),
    )


def harness_request() -> PhaseRequest:
    return phase_request(
        MIN_SPEC,
        run="r",
        phase="c01-harness",
        attempt=1,
        args=HarnessPhaseArgs(
            cycle=1, incoming_harness=None, checkpoint=None, step=4, iterations=3, archive="runs/r/archive/c01"
        ),
    )


def eval_request() -> PhaseRequest:
    return phase_request(
        MIN_SPEC,
        run="r",
        phase="eval-c00-s000000-start",
        attempt=1,
        args=EvalPhaseArgs(cycle=0, step=0, after="start", checkpoint=None, harness=None),
    )


def step_line(step: int, reward: float, loss: float = 0.5, seconds: float = 10.0) -> WeightStepMetrics:
    return WeightStepMetrics(
        step=step,
        epoch=step / 10,
        reward_mean=reward,
        acceptance_rate=reward / 2,
        kept=int(reward * 8),
        loss=loss,
        learning_rate=3e-4,
        rollouts=16,
        seconds_sampling=seconds * 0.8,
        seconds_training=seconds * 0.2,
    )


def status(step: int = 0, **kw) -> WhaleRunStatus:
    base = {
        "phase": RunPhase.RUNNING,
        "cycle": 1,
        "stage": Stage.WEIGHT,
        "step": step,
        "total_steps": 8,
        "active_phase": "c01-weight",
    }
    return WhaleRunStatus(**{**base, **kw})


def frame(t: float, st: WhaleRunStatus, child: ChildFrame | None) -> Frame:
    return Frame("r", T0 + timedelta(seconds=t), now_s=1000.0 + t, started_s=1000.0, status=st, child=child)


def test_durations_read_like_a_clock():
    assert [duration(s) for s in (None, 0, 45.4, 192, 7500, 3 * 86400 + 4 * 3600 + 5)] == [
        "-",
        "0s",
        "45s",
        "3m12s",
        "2h05m",
        "3d04h",
    ]


def test_pace_gives_an_eta_from_the_progress_seen_since_it_was_first_seen():
    pace = Pace(first=2, first_s=100.0)  # a resumed phase: 2 steps were done before this session
    assert pace.eta_s(2, 10, 150.0) is None  # no progress yet this session: no guess
    assert pace.eta_s(4, 10, 120.0) == pytest.approx(60.0)  # 2 steps in 20 s, 6 to go
    assert pace.eta_s(10, 10, 200.0) == 0.0 and pace.eta_s(4, None, 120.0) is None


def test_a_weight_step_shows_its_reward_when_sampling_ends_not_after_its_update():
    """The reward of the step just sampled (progress object) is shown before its metrics line exists."""
    req = weight_request()
    start = ChildFrame(
        req,
        started_s=1000.0,
        progress=PhaseProgress(stage=ProgressStage.SAMPLING, step=1, done=3, total=16, unit="rollouts"),
    )
    sampled = ChildFrame(
        req,
        1000.0,
        progress=PhaseProgress(
            stage=ProgressStage.TRAINING, step=1, reward_mean=0.5, acceptance_rate=0.25, kept=4, rollouts=16
        ),
    )
    done = ChildFrame(
        req,
        1000.0,
        metrics=(step_line(1, 0.5),),
        progress=PhaseProgress(stage=ProgressStage.SAMPLING, step=2, done=0, total=16, unit="rollouts"),
    )
    second = ChildFrame(
        req,
        1000.0,
        metrics=(step_line(1, 0.5),),
        progress=PhaseProgress(
            stage=ProgressStage.TRAINING, step=2, reward_mean=0.75, acceptance_rate=0.5, kept=8, rollouts=16
        ),
    )
    frames = [
        frame(0, status(), start),
        frame(8, status(), sampled),
        frame(10, status(step=1), done),
        frame(18, status(step=1, training_reward=0.5), second),
    ]
    lines, paces, prev = [], {}, None
    for f in frames:
        paces = update_paces(paces, f)
        lines += events(prev, f, paces)
        prev = f
    assert all(STAMP.match(line) for line in lines)
    text = [line[len("2025-03-01T12:00:00Z ") :] for line in lines]
    assert text[0] == "run r: Running"
    assert text[1] == "c01-weight started (attempt 1): steps 0 -> 4, harness h0"
    assert text[2] == "c01-weight step 1 sampled: reward 0.500, kept 25% (4/16)"
    assert lines[2].startswith("2025-03-01T12:00:08Z")  # at the end of sampling, 2 s before the update finished
    assert text[3].startswith(
        "c01-weight step 1 done (1/4): reward 0.500, kept 25% (4/16), loss 0.5000, "
        "lr 3.0e-04, 10s/step; phase ETA 30s, run ETA ~1m10s"
    )
    assert text[4] == "c01-weight step 2 sampled: reward 0.750, kept 50% (8/16)"
    # the status still says step 1 (0.5): the display says step 2's reward, the one just sampled
    reward = latest_reward(second, frames[-1].status)
    assert (reward.step, reward.reward, reward.sampled_only) == (2, 0.75, True)
    view = Console(record=True, width=120)
    view.print(render(frames[-1], paces))
    shown = view.export_text()
    assert "step 2 (sampled, training): reward 0.750, kept 50% (8/16)" in shown
    assert "c01-weight (attempt 1): 1/4 steps" in shown and "training step 2" in shown
    assert "r  Running, cycle 1, elapsed 18s, ETA ~" in shown and "1/8 steps" in shown


def test_a_resumed_weight_phase_counts_its_own_steps_and_marks_a_patience_bound():
    req = weight_request(from_step=4, target=8)
    req = req.model_copy(
        update={
            "weight": req.weight.model_copy(
                update={"stop_rule": {"window_steps": 1, "burn_in_steps": 1, "patience_steps": 1}}
            )
        }
    )
    child = ChildFrame(req, 0.0, metrics=(step_line(5, 0.1), step_line(6, 0.2)))
    counts = phase_counts(child)
    assert (counts.done, counts.total, counts.unit, counts.bound) == (2, 4, "steps", True)
    first = frame(0, status(step=5), ChildFrame(req, 1000.0, metrics=(step_line(5, 0.1),)))
    second = frame(30, status(step=6), ChildFrame(req, 1000.0, metrics=(step_line(5, 0.1), step_line(6, 0.2))))
    paces = update_paces(update_paces({}, first), second)
    lines = events(first, second, paces)
    assert len(lines) == 1 and "c01-weight step 6 done (2/4)" in lines[0] and "phase ETA <= 1m00s" in lines[0]


def test_a_harness_phase_says_what_it_does_within_an_iteration():
    req = harness_request()
    st = status(stage=Stage.HARNESS, active_phase="c01-harness", step=4)
    frames = [
        frame(
            0,
            st,
            ChildFrame(
                req,
                1000.0,
                progress=PhaseProgress(
                    stage=ProgressStage.SCORING, iteration=1, candidate="incoming", done=0, total=1, unit="candidates"
                ),
            ),
        ),
        frame(
            5,
            st,
            ChildFrame(
                req,
                1000.0,
                metrics=(HarnessIterationMetrics(iteration=1, best_score=0.25, best_candidate="incoming", rollouts=4),),
                progress=PhaseProgress(stage=ProgressStage.PROPOSING, iteration=2),
            ),
        ),
        frame(
            9,
            st,
            ChildFrame(
                req,
                1000.0,
                metrics=(HarnessIterationMetrics(iteration=1, best_score=0.25, best_candidate="incoming", rollouts=4),),
                progress=PhaseProgress(
                    stage=ProgressStage.SCORING, iteration=2, candidate="c01-i2-p1", done=0, total=3, unit="candidates"
                ),
            ),
        ),
    ]
    lines, prev, paces = [], None, {}
    for f in frames:
        paces = update_paces(paces, f)
        lines += [line[21:] for line in events(prev, f, paces)]
        prev = f
    assert lines[1:] == [
        "c01-harness started (attempt 1): 3 iterations from harness h0, weights at step 4",
        "c01-harness iteration 1: scoring incoming (0/1 candidates)",
        "c01-harness iteration 1/3 done: best 0.250 (incoming), 4 rollouts; phase ETA 10s",  # first what ended
        "c01-harness iteration 2: proposing",
        "c01-harness iteration 2: scoring c01-i2-p1 (0/3 candidates)",
    ]


def test_an_evaluation_shows_items_done_of_total_from_its_start():
    req = eval_request()
    st = status(stage=Stage.EVAL, active_phase=None)
    first = frame(
        0,
        st,
        ChildFrame(req, 1000.0, progress=PhaseProgress(stage=ProgressStage.EVALUATING, done=0, total=64, unit="items")),
    )
    mid = frame(
        20,
        st,
        ChildFrame(req, 1000.0, metrics=(EvalProgress(items_done=32, items_total=64),), progress=first.child.progress),
    )
    paces = update_paces(update_paces({}, first), mid)
    lines = events(None, first, paces) + events(first, mid, paces)
    assert lines[-2].endswith("eval-c00-s000000-start: 0/64 items")
    assert lines[-1].endswith("eval-c00-s000000-start: 32/64 items; phase ETA 20s")
    view = Console(record=True, width=120)
    view.print(render(mid, paces))
    assert "eval-c00-s000000-start (attempt 1): 32/64 items, 20s, ETA 20s" in view.export_text()


def test_an_evaluation_shows_episodes_as_they_finish_and_items_per_chunk():
    req = eval_request()
    st = status(stage=Stage.EVAL, active_phase=None)

    def at(seconds, episodes, items=None):
        progress = PhaseProgress(stage=ProgressStage.EVALUATING, done=episodes, total=256, unit="episodes")
        metrics = (EvalProgress(items_done=items, items_total=32),) if items is not None else ()
        return frame(seconds, st, ChildFrame(req, 1000.0, metrics=metrics, progress=progress))

    assert phase_counts(at(0, 0, items=16).child).done == 128  # a chunk's line ahead of the progress object
    first, some, chunk = at(0, 0), at(30, 40), at(60, 128, items=16)
    paces = update_paces({}, first)
    lines = [line[21:] for line in events(None, first, paces) + events(first, some, paces) + events(some, chunk, paces)]
    assert lines[-3:] == [
        "eval-c00-s000000-start: 0/256 episodes",
        "eval-c00-s000000-start: 40/256 episodes; phase ETA 2m42s",  # not 0/32 items until a chunk ends
        "eval-c00-s000000-start: 128/256 episodes (16/32 items); phase ETA 1m00s",
    ]
    view = Console(record=True, width=150)
    view.print(render(chunk, paces))
    text = view.export_text()
    assert "eval-c00-s000000-start (attempt 1): 128/256 episodes, 1m00s, ETA 1m00s" in text
    assert "evaluating (16/32 items)" in text


def test_the_run_eta_counts_the_evaluations_left_after_the_last_step():
    """Every weight step is done, two of four evaluations remain: the run ETA is theirs, not ~0s."""
    work = RunWork.from_plan({"rollouts": 480, "evaluation": {"count": 4, "rolloutsEach": 128}})
    req = eval_request()

    def at(seconds, evals_done, episodes):
        evals = [
            EvalPoint(phase=f"eval-{i}", cycle=1, step=8, after="weight", mean_at_k=0.5 if i < evals_done else None)
            for i in range(4)
        ]
        st = status(step=8, stage=Stage.EVAL, active_phase=None, rollouts_spent=480, evals=evals)
        progress = PhaseProgress(stage=ProgressStage.EVALUATING, done=episodes, total=128, unit="episodes")
        return dataclasses.replace(frame(seconds, st, ChildFrame(req, 1000.0, progress=progress)), work=work)

    first, later = at(0, 2, 0), at(100, 2, 64)
    assert (work_counts(first).done, work_counts(first).total) == (480 + 256, 992)
    paces = update_paces({}, first)
    assert run_eta_s(later, paces) == (pytest.approx(300.0), False)  # 64 of the 256 evaluation rollouts left took 100 s
    assert events(first, later, paces)[-1].endswith("64/128 episodes; phase ETA 1m40s, run ETA ~5m00s")
    # without the plan, only the (finished) steps count: the old ~0s
    bare = [dataclasses.replace(f, work=None) for f in (first, later)]
    steps_paces = update_paces({}, bare[0])
    assert "run ETA" not in events(bare[0], bare[1], steps_paces)[-1]  # no step moved: no pace to tell


def test_a_resumed_phase_does_not_print_its_earlier_steps_as_just_done():
    """A `whale run` resumed after Ctrl-C (or a second attempt) first sees a weight phase whose steps 1-2 are done:
    it says so once, and prints only the steps that finish now."""
    req = weight_request(attempt=2)
    earlier = (step_line(1, 0.2), step_line(2, 0.3))
    first = frame(0, status(step=2), ChildFrame(req, 1000.0, metrics=earlier))
    later = frame(30, status(step=3), ChildFrame(req, 1000.0, metrics=(*earlier, step_line(3, 0.4))))
    lines = [line[21:] for line in events(None, first) + events(first, later)]
    assert lines[-2] == "c01-weight started (attempt 2): steps 0 -> 4, harness h0; resumes after step 2"
    assert [line for line in lines if " done (" in line] == [lines[-1]]
    assert lines[-1].startswith("c01-weight step 3 done (3/4): reward 0.400")


def test_a_new_weight_phase_does_not_show_the_last_phase_s_step_as_its_own():
    fresh = ChildFrame(weight_request(from_step=4, target=8), 1000.0)
    view = Console(record=True, width=150)
    view.print(render(frame(5, status(step=4, training_reward=0.2), fresh)))
    assert "step 4 (done, before this phase): reward 0.200" in view.export_text()


def test_run_level_events_phases_done_evaluations_failures_and_the_end_last():
    before = status(
        step=4, completed_phases=[], evals=[EvalPoint(phase="eval-c01-s000004-weight", cycle=1, step=4, after="weight")]
    )
    best = BestEval(mean_at_k=0.3125, k=8, phase="eval-c01-s000004-weight", cycle=1, step=4)
    after = status(
        step=4,
        phase=RunPhase.SUCCEEDED,
        stage=Stage.DONE,
        completed_phases=["c01-weight"],
        checkpoint_step=4,
        message="schedule complete",
        best=best,
        evals=[EvalPoint(phase="eval-c01-s000004-weight", cycle=1, step=4, after="weight", mean_at_k=0.3125)],
    )
    lines = [line[21:] for line in events(frame(0, before, None), frame(1, after, None))]
    assert lines == [
        "c01-weight done: step 4",
        "eval-c01-s000004-weight done: mean@8 0.3125 (new best)",
        "run r: Succeeded (schedule complete)",
    ]
    # the child's last lines come before its phase's end
    req = eval_request()
    child = ChildFrame(req, 1000.0, progress=PhaseProgress(stage=ProgressStage.EVALUATING, done=0, total=10))
    ended = ChildFrame(req, 1000.0, metrics=(EvalProgress(items_done=10, items_total=10),), progress=child.progress)
    done = status(
        evals=[EvalPoint(phase=req.phase, cycle=0, step=0, after="start", mean_at_k=0.5)],
        best=BestEval(mean_at_k=0.5, k=8, phase=req.phase, cycle=0, step=0),
    )
    waiting = status(evals=[EvalPoint(phase=req.phase, cycle=0, step=0, after="start")])
    lines = [line[21:] for line in events(frame(0, waiting, child), frame(1, done, ended))]
    assert lines == [f"{req.phase}: 10/10 items", f"{req.phase} done: mean@8 0.5000 (new best)"]
    failing = status(failures={"c01-weight": 1}, message="phase c01-weight attempt 1 failed (exit code 3); retrying")
    lines = events(frame(0, status(), None), frame(1, failing, None))
    assert lines[0].endswith("c01-weight attempt 1 failed: phase c01-weight attempt 1 failed (exit code 3); retrying")


def summary_text(st: WhaleRunStatus, **kw) -> str:
    view = Console(record=True, width=150)
    args = {"uri_for": {}, "store_arg": "st", "run_command": "whale run r.yaml --store st", "elapsed": "3m02s", **kw}
    view.print(final_summary("r", st, **args))
    return view.export_text()


def test_the_end_of_a_run_shows_the_evaluations_the_best_point_the_harness_and_what_next():
    best = BestEval(
        mean_at_k=0.5,
        k=4,
        phase="eval-c01-s000004-harness",
        cycle=1,
        step=4,
        harness="runs/r/harnesses/c01-accepted.py",
        rollouts_at=1234,
    )
    st = status(
        step=8,
        phase=RunPhase.SUCCEEDED,
        stage=Stage.DONE,
        message="schedule complete",
        best=best,
        current_harness="runs/r/harnesses/c01-accepted.py",
        current_checkpoint="runs/r/checkpoints/step-000008",
        checkpoint_step=8,
        rollouts_spent=2048,
        evals=[
            EvalPoint(phase="eval-c00-s000000-start", cycle=0, step=0, after="start", mean_at_k=0.25),
            EvalPoint(
                phase="eval-c01-s000004-harness",
                cycle=1,
                step=4,
                after="harness",
                rollouts_at=1234,
                harness="runs/r/harnesses/c01-accepted.py",
                mean_at_k=0.5,
            ),
        ],
    )
    text = summary_text(
        st,
        uri_for={
            "runs/r/harnesses/c01-accepted.py": "s3://b/runs/r/harnesses/c01-accepted.py",
            "runs/r/checkpoints/step-000008": "s3://b/runs/r/checkpoints/step-000008",
        },
    )
    assert "run r Succeeded after 3m02s: schedule complete" in text
    assert re.search(r"eval-c01-s000004-harness\s.*\s4\s.*c01-accepted\s.*1,234\s.*0\.5000 \*", text), text
    assert re.search(r"eval-c00-s000000-start\s.*\s0\s.*h0\s.*0\.2500", text)
    assert (
        "best: mean@4 0.5000 at eval-c01-s000004-harness (step 4, harness c01-accepted, 1,234 training rollouts)"
        in text
    )
    assert "accepted harness: s3://b/runs/r/harnesses/c01-accepted.py" in text
    assert "checkpoint: s3://b/runs/r/checkpoints/step-000008" in text
    assert "whale status r --store st" in text and "whale report st/runs/r" in text


def test_next_commands_after_a_failure_and_an_interruption():
    failed = status(phase=RunPhase.FAILED, failures={"c01-harness": 3, "eval-c00-s000000-start": 1})
    assert next_commands("r", failed, "s3://b/x", "whale run r.yaml") == [
        "whale logs r --store s3://b/x --phase c01-harness",
        "whale run r.yaml --retry",
        "whale status r --store s3://b/x",
    ]
    running = status()
    assert next_commands("r", running, "my store", "whale run r.yaml")[:2] == [
        "whale run r.yaml",
        "whale status r --store 'my store'",
    ]
    # whale as the person invoked it (README: .venv/bin/whale)
    assert next_commands("r", failed, "st", ".venv/bin/whale run r.yaml", ".venv/bin/whale") == [
        ".venv/bin/whale logs r --store st --phase c01-harness",
        ".venv/bin/whale run r.yaml --retry",
        ".venv/bin/whale status r --store st",
    ]
    text = summary_text(
        status(phase=RunPhase.FAILED, message="phase c01-weight failed 3 time(s)", failures={"c01-weight": 3})
    )
    assert "run r Failed after 3m02s: phase c01-weight failed 3 time(s)" in text
    assert "accepted harness: h0 (the domain's base harness)" in text and "evaluations" not in text


def test_the_terminal_display_draws_live_and_prints_the_events_above_it():
    """RunDisplay on a terminal: a rich Live region with the bars, the events printed above it, gone at the end."""
    from io import StringIO

    from whale.console.display import RunDisplay
    from whale.runner.local import ChildView, RunnerView

    out = StringIO()
    console = Console(file=out, force_terminal=True, width=120, color_system=None)
    clock = iter(float(t) for t in range(100, 200))
    display = RunDisplay("r", console, clock=lambda: next(clock), wall=lambda: T0)
    assert display.live_mode
    req = weight_request()
    sampling = PhaseProgress(stage=ProgressStage.SAMPLING, step=1, done=8, total=16, unit="rollouts")
    with display:
        display(RunnerView(status(), ChildView(req, 100.0, (), sampling)))
        display(RunnerView(status(step=1), ChildView(req, 100.0, (step_line(1, 0.5),), sampling)))
    text = out.getvalue()
    assert "2025-03-01T12:00:00Z c01-weight started (attempt 1): steps 0 -> 4, harness h0" in text
    assert "c01-weight step 1 done (1/4): reward 0.500" in text
    assert "sampling step 1 (8/16 rollouts)" in text and "━" in text  # the live region with its bars
    assert display._live is None


def test_rsft_steps_that_kept_nothing_are_a_warning_in_both_views():
    """A step that keeps no trajectory trains nothing: the plain log warns once when the count grows, and the
    live view keeps the warning on screen."""
    run = WhaleRunStatus(phase=RunPhase.RUNNING, cycle=1, stage=Stage.WEIGHT, active_phase="c01-weight")
    empty = run.model_copy(update={"empty_steps": 2, "last_empty_step": 3})
    assert not [line for line in events(frame(0, run, None), frame(1, run, None)) if "warning" in line]
    lines = events(frame(0, run, None), frame(1, empty, None))
    assert [line[21:] for line in lines if "warning" in line] == [
        "warning: 2 RSFT step(s) kept no trajectory (last: step 3); SFT was skipped there, the weights did not move"
    ]
    assert not [line for line in events(frame(1, empty, None), frame(2, empty, None)) if "warning" in line]
    console = Console(width=160, record=True)
    console.print(render(frame(2, empty, None)))
    assert "warning: 2 RSFT step(s) kept no trajectory (last: step 3)" in console.export_text()
