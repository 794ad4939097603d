"""Table-driven tests of the pure alternation state machine (every condition and the edges)."""

from __future__ import annotations

import pytest

from whale.core.adaptive import harness_stop_iteration, weight_stop_step, window_means
from whale.core.alternation import Child, ChildState, Observations, StartPhase, StopPhase, decide, evaluates_mid_phase
from whale.core.protocol import HarnessStopRule, WeightStopRule
from whale.core.schedule import resolve
from whale.core.spec import WhaleRunSpec
from whale.core.status import RunPhase, Stage, WhaleRunStatus

from .sim import RUN, World, drive, main_phases, parsed, weight_line

SIZES = {"weight": 256 * 10, "harness": 4, "test": 10}  # 10 steps per epoch at promptsPerStep 256


def make_spec(condition: str, **schedule) -> WhaleRunSpec:
    return WhaleRunSpec.model_validate(
        {
            "domain": "synthetic",
            "condition": condition,
            "model": {"name": "tiny"},
            "schedule": schedule,
            "evaluation": {"intervalSteps": 1000},  # keep the eval list short unless a test asks
        }
    )


@pytest.mark.parametrize(
    ("condition", "schedule", "expected"),
    [
        # budget divisible by E: three cycles, no harness phase after the one that spends the budget
        (
            "whale",
            {"totalSteps": 9, "weightStepsPerCycle": 3},
            ["c01-weight", "c01-harness", "c02-weight", "c02-harness", "c03-weight"],
        ),
        # not divisible: the last target is clamped to the total
        (
            "whale",
            {"totalSteps": 10, "weightStepsPerCycle": 4},
            ["c01-weight", "c01-harness", "c02-weight", "c02-harness", "c03-weight"],
        ),
        # E == total: one weight phase, nothing else
        ("whale", {"totalSteps": 5, "weightStepsPerCycle": 5}, ["c01-weight"]),
        # maxCycles caps the run; the harness phase of the last cycle still runs
        (
            "whale",
            {"totalSteps": 100, "weightStepsPerCycle": 10, "maxCycles": 2},
            ["c01-weight", "c01-harness", "c02-weight", "c02-harness"],
        ),
        ("rsft_only", {"totalSteps": 7}, ["c01-weight"]),
        ("mh_only", {"mhOnlyIterations": 5}, ["c01-harness"]),
    ],
)
def test_main_sequence(condition, schedule, expected):
    world = World(SIZES)
    status = drive(make_spec(condition, **schedule), world)
    assert status.phase is RunPhase.SUCCEEDED, status.message
    assert main_phases(world) == expected


def test_whale_targets_and_harness_inputs():
    world = World(SIZES)
    drive(make_spec("whale", totalSteps=10, weightStepsPerCycle=4), world)
    w = {p: world.requests[p].weight for p in ("c01-weight", "c02-weight", "c03-weight")}
    assert [(a.from_step, a.target_step) for a in w.values()] == [(0, 4), (4, 8), (8, 10)]
    assert w["c01-weight"].harness is None and w["c01-weight"].from_checkpoint is None
    # the accepted harness of cycle k is what cycle k+1 trains under, from the cycle-k checkpoint
    assert w["c02-weight"].harness == f"runs/{RUN}/harnesses/c01-accepted.py"
    assert w["c02-weight"].from_checkpoint == f"runs/{RUN}/checkpoints/step-000004"
    h1 = world.requests["c01-harness"].harness
    assert (h1.incoming_harness, h1.checkpoint, h1.iterations) == (None, f"runs/{RUN}/checkpoints/step-000004", 6)
    h2 = world.requests["c02-harness"].harness
    assert h2.incoming_harness == f"runs/{RUN}/harnesses/c01-accepted.py"


def test_mh_only_runs_n_proposer_iterations_after_the_incoming_evaluation():
    world = World(SIZES)
    status = drive(make_spec("mh_only", mhOnlyIterations=7), world)
    h = world.requests["c01-harness"].harness
    # the paper's count: 7 proposer iterations, plus iteration 1 = the incoming (h0) evaluation
    assert (h.checkpoint, h.incoming_harness, h.iterations, h.stop_rule) == (None, None, 8, None)
    assert world.results["c01-harness"]["iterations"] == 8
    assert [m["iteration"] for m in world.metrics["c01-harness"]] == list(range(1, 9))
    assert status.rollouts_spent == 4 * 8


@pytest.mark.parametrize(("n", "archive"), [(40, 41), (60, 61), (1, 2)])
def test_mh_only_archive_iterations_are_the_papers_count_plus_the_incoming(n, archive):
    spec = make_spec("mh_only", mhOnlyIterations=n)
    assert resolve(spec, SIZES).harness_iterations == archive
    request = decide(spec, WhaleRunStatus(), Observations(run=RUN, split_sizes=SIZES)).of_type(StartPhase)
    assert [a.request.harness.iterations for a in request if a.phase == "c01-harness"] == [archive]


def test_whale_i_counts_the_incoming_evaluation():
    # I = 6 = the incoming evaluation + 5 proposer iterations (unchanged by the mh_only / adaptive counts)
    world = World(SIZES)
    drive(make_spec("whale", totalSteps=6, weightStepsPerCycle=3, harnessIterationsPerCycle=6), world)
    assert world.requests["c01-harness"].harness.iterations == 6
    assert len(world.metrics["c01-harness"]) == 6


def test_adaptive_max_iterations_counts_proposer_iterations():
    # the paper: min 6 (incoming included), patience 2, max 15 proposer iterations + the incoming = 16
    spec = make_spec(
        "adaptive_whale",
        totalSteps=40,
        adaptive={
            "weight": {"windowSteps": 1, "burnInSteps": 1, "patienceSteps": 1},
            "harness": {"minIterations": 6, "patience": 2, "maxIterations": 15},
        },
    )
    rule = resolve(spec, SIZES).harness_rule
    assert (rule.min_iterations, rule.patience, rule.max_iterations) == (6, 2, 16)
    world = World(SIZES, reward=lambda s: 0.5, best_score=lambda c, it: it / 100)  # never stalls
    drive(spec, world)
    assert world.requests["c01-harness"].harness.iterations == 16
    assert world.results["c01-harness"]["iterations"] == 16  # 15 proposer iterations after the incoming
    # stalled from the start: patience 2 fires, but never before minIterations = 6 (incoming included)
    flat = World(SIZES, reward=lambda s: 0.5, best_score=lambda c, it: 0.2)
    drive(spec, flat)
    assert flat.results["c01-harness"]["iterations"] == 6


def test_adaptive_bounds_must_allow_the_minimum():
    # maxIterations 5 proposer iterations = 6 archive iterations: enough for minIterations 6, not for 7
    make_spec("adaptive_whale", totalSteps=4, adaptive={"harness": {"minIterations": 6, "maxIterations": 5}})
    with pytest.raises(ValueError, match=r"maxIterations \(4 proposer iterations, 5 with the incoming evaluation\)"):
        make_spec("adaptive_whale", totalSteps=4, adaptive={"harness": {"minIterations": 6, "maxIterations": 4}})


def test_rollouts_spent_counts_every_phase():
    world = World(SIZES)
    status = drive(make_spec("whale", totalSteps=6, weightStepsPerCycle=3), world)
    # 6 weight steps x 16 rollouts (the simulated workload) + one harness phase of 6 iterations x 4
    assert status.rollouts_spent == 6 * 16 + 6 * 4


def test_e_larger_than_total_is_a_clear_error():
    spec = make_spec("whale", totalSteps=3, weightStepsPerCycle=5)
    d = decide(spec, WhaleRunStatus(), Observations(run=RUN, split_sizes=SIZES))
    assert d.status.phase is RunPhase.FAILED
    assert "weightStepsPerCycle" in d.status.message and "larger than the total" in d.status.message


def test_paper_steps_per_epoch():
    # |D_weight| of the paper's three domains -> 74 / 70 / 64 steps per epoch, E = 0.6 -> 44 / 42 / 38
    for size, spe, e in [(74 * 256, 74, 44), (70 * 256, 70, 42), (64 * 256, 64, 38)]:
        spec = make_spec("whale", totalEpochs=4, weightEpochsPerCycle=0.6)
        s = resolve(spec, {"weight": size, "harness": 256})
        assert (s.steps_per_epoch, s.cycle_steps, s.total_steps) == (spe, e, 4 * spe)


# ----- adaptive rules, hand-worked ----------------------------------------------------------------


def test_window_means():
    assert window_means([0.1, 0.2, 0.3, 0.3], 2) == pytest.approx([0.1, 0.15, 0.25, 0.3])


def test_weight_rule_hand_worked():
    rule = WeightStopRule(window_steps=2, burn_in_steps=3, patience_steps=2)
    # means 0.1 .15 .25 .30 .25 .15: new bests at steps 1-4; steps 5 and 6 are not -> fires after 6
    rewards = [0.1, 0.2, 0.3, 0.3, 0.2, 0.1]
    assert weight_stop_step(rewards, rule) == 6
    assert weight_stop_step(rewards[:5], rule) is None
    # burn-in holds it back: flat rewards never improve after step 1, but nothing stops before 3
    assert weight_stop_step([0.5] * 10, WeightStopRule(window_steps=1, burn_in_steps=5, patience_steps=1)) == 5
    assert weight_stop_step([0.5] * 10, WeightStopRule(window_steps=1, burn_in_steps=0, patience_steps=3)) == 4


def test_harness_rule_hand_worked():
    rule = HarnessStopRule(min_iterations=6, patience=2, max_iterations=15)
    scores = [0.2, 0.2, 0.3, 0.3, 0.3, 0.3, 0.3]  # improvements at 1 and 3
    assert harness_stop_iteration(scores[:5], rule) is None  # patience met at 5 but min is 6
    assert harness_stop_iteration(scores, rule) == 6
    rising = [i / 100 for i in range(1, 30)]
    assert harness_stop_iteration(rising, rule) == 15  # never stalls: the max ends it


def test_adaptive_run_stops_phases_by_patience():
    spec = make_spec(
        "adaptive_whale",
        totalSteps=40,
        adaptive={
            "weight": {"windowSteps": 1, "burnInSteps": 2, "patienceSteps": 2},
            "harness": {"minIterations": 2, "patience": 1, "maxIterations": 5},
        },
    )
    # reward peaks at step 3 of each phase, then falls: every weight phase ends 2 steps after its peak
    world = World(
        SIZES,
        reward=lambda s: [0.1, 0.5, 0.9, 0.3, 0.2, 0.1, 0.1][min((s - 1) % 5, 6)],
        best_score=lambda c, it: min(it, 3) / 10,
    )
    status = drive(spec, world)
    assert status.phase is RunPhase.SUCCEEDED
    first = world.results["c01-weight"]
    assert first["stoppedBy"] == "patience" and first["finalStep"] == 5
    assert world.requests["c01-weight"].weight.target_step == 40  # the budget still caps it
    h = world.results["c01-harness"]
    assert h["iterations"] == 4  # best rises until 3, then 1 iteration of patience
    assert status.checkpoint_step == 40


def test_decide_asks_a_running_phase_to_stop_once():
    spec = make_spec(
        "adaptive_whale",
        totalSteps=40,
        adaptive={"weight": {"windowSteps": 1, "burnInSteps": 2, "patienceSteps": 2}},
    )
    status = decide(spec, WhaleRunStatus(), Observations(run=RUN, split_sizes=SIZES)).status
    metrics = [weight_line(i, r, rollouts=1) for i, r in enumerate([0.9, 0.1, 0.1], start=1)]
    obs = Observations(
        run=RUN,
        split_sizes=SIZES,
        children={"c01-weight": Child(ChildState.RUNNING)},
        metrics=parsed({"c01-weight": metrics}),
    )
    d = decide(spec, status, obs)
    stops = d.of_type(StopPhase)
    assert [s.phase for s in stops] == ["c01-weight"] and "step 3" in stops[0].reason
    assert d.status.step == 3 and d.status.training_reward == 0.1
    assert decide(spec, d.status, obs).of_type(StopPhase) == []  # asked once


# ----- failures, preemption, idempotence, resume ---------------------------------------------------


def test_failed_phase_is_retried_then_fails_the_run():
    spec = make_spec("rsft_only", totalSteps=3)
    world = World(SIZES, fail_times={"c01-weight": 2})
    status = drive(spec, world)
    assert status.phase is RunPhase.SUCCEEDED
    assert [a for p, a in world.started if p == "c01-weight"] == [1, 2, 3]
    assert status.failures == {"c01-weight": 2}

    world = World(SIZES, fail_times={"c01-weight": 3})
    status = drive(spec, world)
    assert status.phase is RunPhase.FAILED and status.reason == "PhaseFailed"
    assert "c01-weight failed 3 time(s)" in status.message and "boom" in status.message


def test_preemption_is_not_a_failure():
    world = World(SIZES, preempt_times={"c01-weight": 5})
    status = drive(make_spec("rsft_only", totalSteps=2), world)
    assert status.phase is RunPhase.SUCCEEDED
    assert status.preemptions == 5 and status.failures == {}
    assert status.attempts["c01-weight"] == 6


def evictions_capped(limit: int) -> WhaleRunSpec:
    spec = make_spec("rsft_only", totalSteps=2)
    return spec.with_sections(retry=spec.execution.retry.model_copy(update={"max_evictions": limit}))


def test_an_evicted_child_is_kept_its_evictions_counted_and_one_too_many_fails_the_run():
    """Kueue re-admits the same child: decide() starts nothing while it waits, counts its evictions (level-based:
    the same count seen again is no new eviction), and fails the run past execution.retry.maxEvictions."""
    spec = evictions_capped(2)
    status = decide(spec, WhaleRunStatus(), Observations(run=RUN, split_sizes=SIZES)).status
    waiting = Child(ChildState.RUNNING, "evicted by its queue", name="Job r-c01-weight-1", evictions=1)
    for _ in range(2):  # the same eviction seen twice
        d = decide(spec, status, Observations(run=RUN, split_sizes=SIZES, children={"c01-weight": waiting}))
        assert [a for a in d.of_type(StartPhase) if a.phase == "c01-weight"] == []
        assert d.status.phase is RunPhase.RUNNING
        assert d.status.evictions == {"c01-weight": 1} and d.status.attempts["c01-weight"] == 1
        assert d.status.failures == {} and d.status.preemptions == 0
        status = d.status
    at_limit = Child(ChildState.RUNNING, "evicted by its queue", name="Job r-c01-weight-1", evictions=2)
    status = decide(spec, status, Observations(run=RUN, split_sizes=SIZES, children={"c01-weight": at_limit})).status
    assert status.phase is RunPhase.RUNNING and status.evictions == {"c01-weight": 2}
    over = Child(ChildState.RUNNING, "evicted: Preempted: to accommodate w", name="Job r-c01-weight-1", evictions=3)
    d = decide(spec, status, Observations(run=RUN, split_sizes=SIZES, children={"c01-weight": over}))
    assert d.status.phase is RunPhase.FAILED and d.status.reason == "EvictionLimitReached"
    assert (
        "spec.execution.retry.maxEvictions (2)" in d.status.message and "Job r-c01-weight-1 3 times" in d.status.message
    )
    assert "Preempted: to accommodate w" in d.status.message


def test_a_new_attempt_starts_with_no_eviction_counted():
    spec = evictions_capped(2)
    status = decide(spec, WhaleRunStatus(), Observations(run=RUN, split_sizes=SIZES)).status
    evicted = Child(ChildState.RUNNING, name="Job r-c01-weight-1", evictions=2)
    status = decide(spec, status, Observations(run=RUN, split_sizes=SIZES, children={"c01-weight": evicted})).status
    failed = Child(ChildState.FAILED, "exit code 1", name="Job r-c01-weight-1", evictions=2)
    d = decide(spec, status, Observations(run=RUN, split_sizes=SIZES, children={"c01-weight": failed}))
    assert d.status.attempts["c01-weight"] == 2 and d.status.evictions == {}
    assert [a.attempt for a in d.of_type(StartPhase) if a.phase == "c01-weight"] == [2]
    # the new attempt may be evicted maxEvictions times again
    again = Child(ChildState.RUNNING, name="Job r-c01-weight-2", evictions=2)
    d = decide(spec, d.status, Observations(run=RUN, split_sizes=SIZES, children={"c01-weight": again}))
    assert d.status.phase is RunPhase.RUNNING and d.status.evictions == {"c01-weight": 2}


def test_data_preparation_is_held_to_the_same_eviction_limit():
    spec = evictions_capped(0)
    over = Child(ChildState.RUNNING, name="Job r-prepare-1", evictions=1)
    d = decide(spec, WhaleRunStatus(), Observations(run=RUN, children={"prepare": over}))
    assert d.status.phase is RunPhase.FAILED and d.status.reason == "EvictionLimitReached"
    assert d.of_type(StartPhase) == []


def test_success_without_result_is_a_failed_attempt():
    spec = make_spec("rsft_only", totalSteps=2)
    status = decide(spec, WhaleRunStatus(), Observations(run=RUN, split_sizes=SIZES)).status
    obs = Observations(run=RUN, split_sizes=SIZES, children={"c01-weight": Child(ChildState.SUCCEEDED)})
    d = decide(spec, status, obs)
    assert d.status.failures == {"c01-weight": 1}
    assert "without writing result.json" in d.status.message
    assert [a.attempt for a in d.of_type(StartPhase) if a.phase == "c01-weight"] == [2]


def test_decide_is_idempotent():
    spec = make_spec("whale", totalSteps=6, weightStepsPerCycle=3)
    world = World(SIZES)
    status = WhaleRunStatus()
    for _ in range(6):
        obs = world.observe(status)
        first, second = decide(spec, status, obs), decide(spec, status, obs)
        assert first == second
        status = first.status
        world.apply(first)
        world.progress()


def test_resume_from_any_status_reaches_the_same_end():
    spec = WhaleRunSpec.model_validate(
        {
            "domain": "synthetic",
            "condition": "whale",
            "model": {"name": "tiny"},
            "schedule": {"totalSteps": 7, "weightStepsPerCycle": 3},
            "evaluation": {"intervalSteps": 2},
        }
    )
    world = World(SIZES)
    trace: list[WhaleRunStatus] = []
    final = drive(spec, world, trace=trace)
    assert final.phase is RunPhase.SUCCEEDED
    for i, mid in enumerate(trace):
        # a controller restarted with this status and the store as it is now: nothing re-runs
        replay = World(
            SIZES, results=dict(world.results), metrics=dict(world.metrics), checkpoints=set(world.checkpoints)
        )
        end = drive(spec, replay, status=mid)
        assert end.model_dump(exclude={"attempts"}) == final.model_dump(exclude={"attempts"}), f"resume from #{i}"
        assert replay.started == [], f"resume from #{i} started {replay.started}"


def test_evaluation_points_and_best():
    spec = WhaleRunSpec.model_validate(
        {
            "domain": "synthetic",
            "condition": "whale",
            "model": {"name": "tiny"},
            "schedule": {"totalSteps": 6, "weightStepsPerCycle": 3},
            "evaluation": {"intervalSteps": 2},
        }
    )
    means = {
        (0, "start"): 0.1,
        (2, "weight"): 0.2,
        (3, "weight"): 0.25,
        (3, "harness"): 0.4,
        (4, "weight"): 0.3,
        (6, "weight"): 0.35,
    }
    world = World(SIZES, eval_mean=lambda step, after: means[(step, after)])
    status = drive(spec, world)
    points = [(e.step, e.after) for e in status.evals]
    assert sorted(points) == sorted(means)
    assert all(e.mean_at_k is not None for e in status.evals)
    assert status.best.mean_at_k == 0.4 and status.best.step == 3 and status.best.cycle == 1
    assert status.best.harness == f"runs/{RUN}/harnesses/c01-accepted.py"
    assert status.best.rollouts_at == 3 * 16 + 6 * 4  # rollouts spent when that point was reached
    assert status.stage is Stage.DONE


def test_suspend_and_resume():
    spec = make_spec("rsft_only", totalSteps=3)
    status = decide(spec, WhaleRunStatus(), Observations(run=RUN, split_sizes=SIZES)).status
    suspended = spec.with_sections(**{"suspend": True})
    obs = Observations(run=RUN, split_sizes=SIZES, children={"c01-weight": Child(ChildState.RUNNING)})
    d = decide(suspended, status, obs)
    assert d.status.phase is RunPhase.SUSPENDED and d.of_type(StartPhase) == []
    # resumed: the child is gone, so the same attempt is relaunched (not counted as a failure)
    d2 = decide(spec, d.status, Observations(run=RUN, split_sizes=SIZES))
    assert d2.status.phase is RunPhase.RUNNING
    assert [(a.phase, a.attempt) for a in d2.of_type(StartPhase) if a.phase == "c01-weight"] == [("c01-weight", 1)]


# ----- mh_only evaluates every accepted harness; best and final -------------------------------------


def archive_harness(candidate: str) -> str:
    return f"runs/{RUN}/archive/c01/candidates/{candidate}/harness.py"


#: archive best after iterations 1..8: the accepted harness changes at iterations 3, 5 and 8
RISING = [0.1, 0.1, 0.3, 0.3, 0.5, 0.5, 0.5, 0.6]


def test_mh_only_evaluates_every_accepted_harness():
    world = World(
        SIZES,
        best_score=lambda c, it: RISING[it - 1],
        iteration_mean=lambda it: {3: 0.30, 5: 0.42, 8: 0.40}[it],
        eval_mean=lambda s, a: 0.05,
    )
    status = drive(make_spec("mh_only", mhOnlyIterations=7), world)
    assert status.phase is RunPhase.SUCCEEDED
    points = [(e.phase, e.iteration, e.harness, e.rollouts_at) for e in status.evals]
    assert points == [
        ("eval-c00-s000000-start", None, None, 0),
        ("eval-c01-s000000-harness-i0003", 3, archive_harness("i03-c1"), 4 * 3),
        ("eval-c01-s000000-harness-i0005", 5, archive_harness("i05-c1"), 4 * 5),
        ("eval-c01-s000000-harness-i0008", 8, archive_harness("i08-c1"), 4 * 8),
    ]  # no separate end evaluation: the last change IS the accepted harness
    assert world.results["c01-harness"]["acceptedCandidate"] == "i08-c1"
    eval_requests = [world.requests[p].eval for p, _ in world.started if p.endswith("i0005")]
    assert [(a.iteration, a.harness, a.checkpoint) for a in eval_requests] == [(5, archive_harness("i05-c1"), None)]
    # best over every point vs the final point (the accepted harness at the end)
    assert (status.best.phase, status.best.mean_at_k, status.best.iteration) == (
        "eval-c01-s000000-harness-i0005",
        0.42,
        5,
    )
    assert (status.final.phase, status.final.mean_at_k, status.final.k) == ("eval-c01-s000000-harness-i0008", 0.40, 8)
    assert "best mean@8 0.4200" in status.message and "final mean@8 0.4000" in status.message


def test_mh_only_evaluates_changes_while_the_search_runs():
    """Level-based: an accepted harness logged in the metrics is owed before the phase ends, and the
    phase's result owes nothing twice."""
    spec = make_spec("mh_only", mhOnlyIterations=7)
    world = World(SIZES, best_score=lambda c, it: RISING[it - 1], stop_at_iteration={"c01-harness": 4})
    status = WhaleRunStatus()
    for _ in range(6):
        decision = decide(spec, status, world.observe(status))
        status = decision.status
        world.apply(decision)
        world.progress()
    assert world.children["c01-harness"].state is ChildState.RUNNING
    assert "c01-harness" not in world.results
    assert [e.phase for e in status.evals] == ["eval-c00-s000000-start", "eval-c01-s000000-harness-i0003"]
    assert any(p == "eval-c01-s000000-harness-i0003" for p, _ in world.started)  # evaluated already
    del world.stop_at_iteration["c01-harness"]
    final = drive(spec, world, status=status)
    assert final.phase is RunPhase.SUCCEEDED
    assert [e.iteration for e in final.evals] == [None, 3, 5, 8]
    assert [p for p, _ in world.started].count("eval-c01-s000000-harness-i0003") == 1


def test_mh_only_whose_accepted_harness_never_changes():
    flat = lambda c, it: 0.2  # noqa: E731 - the incoming harness stays the best
    world = World(SIZES, best_score=flat)
    status = drive(make_spec("mh_only", mhOnlyIterations=3), world)
    # the accepted harness is h0 at theta0: the start point already measured it
    assert [e.phase for e in status.evals] == ["eval-c00-s000000-start"]
    assert status.final.phase == status.best.phase == "eval-c00-s000000-start"
    # without the start point, the accepted harness is evaluated at the end
    spec = WhaleRunSpec.model_validate(
        {
            "domain": "synthetic",
            "condition": "mh_only",
            "model": {"name": "tiny"},
            "schedule": {"mhOnlyIterations": 3},
            "evaluation": {"atStart": False},
        }
    )
    status = drive(spec, World(SIZES, best_score=flat))
    assert [(e.phase, e.harness) for e in status.evals] == [
        ("eval-c01-s000000-harness", f"runs/{RUN}/harnesses/c01-accepted.py")
    ]


def test_mh_only_every_accepted_harness_can_be_turned_off():
    spec = WhaleRunSpec.model_validate(
        {
            "domain": "synthetic",
            "condition": "mh_only",
            "model": {"name": "tiny"},
            "schedule": {"mhOnlyIterations": 7},
            "evaluation": {"everyAcceptedHarness": False},
        }
    )
    status = drive(spec, World(SIZES, best_score=lambda c, it: RISING[it - 1]))
    assert [e.phase for e in status.evals] == ["eval-c00-s000000-start", "eval-c01-s000000-harness"]
    assert status.final.phase == "eval-c01-s000000-harness"


def test_whale_evaluates_only_the_harness_each_phase_accepts():
    # mid-phase changes of the accepted harness are mh_only's evaluation points, not whale's
    world = World(SIZES, best_score=lambda c, it: RISING[it - 1])
    status = drive(make_spec("whale", totalSteps=6, weightStepsPerCycle=3), world)
    assert all(e.iteration is None for e in status.evals)
    assert [e.phase for e in status.evals if e.after == "harness"] == ["eval-c01-s000003-harness"]


@pytest.mark.parametrize(
    ("condition", "schedule", "final"),
    [
        ("rsft_only", {"totalSteps": 7}, "eval-c01-s000007-weight"),
        ("whale", {"totalSteps": 10, "weightStepsPerCycle": 4}, "eval-c03-s000010-weight"),
        ("whale", {"totalSteps": 100, "weightStepsPerCycle": 10, "maxCycles": 2}, "eval-c02-s000020-harness"),
    ],
)
def test_final_is_the_last_point_of_the_schedule(condition, schedule, final):
    # eval means fall with the step, so the best point is the start and the final one is the last
    world = World(SIZES, eval_mean=lambda step, after: 0.5 - step / 1000 - (0.0001 if after == "harness" else 0))
    status = drive(make_spec(condition, **schedule), world)
    assert status.best.phase == "eval-c00-s000000-start"
    assert status.final.phase == final
    assert status.final.mean_at_k == world.results[final]["meanAtK"] and status.final.k == 8


def test_mh_only_resume_from_any_status_reaches_the_same_end():
    spec = make_spec("mh_only", mhOnlyIterations=7)
    world = World(SIZES, best_score=lambda c, it: RISING[it - 1], stop_at_iteration={"c01-harness": 4})
    status = WhaleRunStatus()
    trace: list[WhaleRunStatus] = []
    for _ in range(4):  # the search halts mid-way for a few calls, evaluations run meanwhile
        decision = decide(spec, status, world.observe(status))
        status = decision.status
        trace.append(status)
        world.apply(decision)
        world.progress()
    del world.stop_at_iteration["c01-harness"]
    final = drive(spec, world, status=status, trace=trace)
    for i, mid in enumerate(trace):
        replay = World(
            SIZES, results=dict(world.results), metrics=dict(world.metrics), checkpoints=set(world.checkpoints)
        )
        end = drive(spec, replay, status=mid)
        assert end.model_dump(exclude={"attempts"}) == final.model_dump(exclude={"attempts"}), f"resume from #{i}"
        assert replay.started == [], f"resume from #{i} started {replay.started}"


@pytest.mark.parametrize(
    "harness",
    [
        "runs/other-run/archive/c01/candidates/i03-c1/harness.py",  # another run's file
        f"runs/{RUN}/archive/c01/candidates/../../../../other/harness.py",  # climbs out of the archive
        f"runs/{RUN}/harnesses/c01-accepted.py",
        None,
    ],
)
def test_only_a_file_of_the_phases_archive_is_evaluated_as_an_accepted_harness(harness):
    """The harness an mh_only evaluation runs comes from the search's metrics and result; a key outside the
    phase's own archive is never evaluated (the phase's accepted harness is, at the end, instead)."""
    spec = make_spec("mh_only", mhOnlyIterations=2)
    status = decide(spec, WhaleRunStatus(), Observations(run=RUN, split_sizes=SIZES)).status
    lines = [
        {
            "iteration": 1,
            "bestScore": 0.1,
            "bestCandidate": "i01-incoming",
            "rollouts": 4,
            "bestHarness": f"runs/{RUN}/archive/c01/candidates/i01-incoming/harness.py",
        },
        {"iteration": 2, "bestScore": 0.3, "bestCandidate": "i02-c1", "rollouts": 4, "bestHarness": harness},
    ]
    running = Observations(
        run=RUN,
        split_sizes=SIZES,
        children={"c01-harness": Child(ChildState.RUNNING)},
        metrics=parsed({"c01-harness": lines}),
    )
    status = decide(spec, status, running).status
    assert [e.phase for e in status.evals] == ["eval-c00-s000000-start"]
    result = {
        "acceptedHarness": f"runs/{RUN}/harnesses/c01-accepted.py",
        "acceptedCandidate": "i02-c1",
        "acceptedScore": 0.3,
        "iterations": 2,
        "rollouts": 8,
        "acceptedByIteration": [
            {
                "iteration": 1,
                "candidate": "i01-incoming",
                "score": 0.1,
                "rollouts": 4,
                "harness": f"runs/{RUN}/archive/c01/candidates/i01-incoming/harness.py",
            },
            {"iteration": 2, "candidate": "i02-c1", "score": 0.3, "rollouts": 8, "harness": harness or ""},
        ],
    }
    done = Observations(run=RUN, split_sizes=SIZES, results={"c01-harness": result})
    status = decide(spec, status, done).status
    assert [(e.phase, e.harness) for e in status.evals] == [
        ("eval-c00-s000000-start", None),
        ("eval-c01-s000000-harness", f"runs/{RUN}/harnesses/c01-accepted.py"),
    ]


def test_requests_carry_resolved_values_and_round_trip():
    """A request carries what the workload needs resolved (the run's total steps, the sampling of its
    rollouts, an evaluation's at evaluation.temperature), not the spec, and survives its wire form."""
    from whale.core.protocol import EvalRequest, WeightRequest, parse_request

    spec = WhaleRunSpec.model_validate(
        {
            "domain": "synthetic",
            "condition": "whale",
            "model": {"name": "tiny"},
            "schedule": {"totalSteps": 10, "weightStepsPerCycle": 4},
            "evaluation": {"intervalSteps": 1000, "temperature": 0.25},
            "rsft": {"sampling": {"topK": 3}},
        }
    )
    world = World(SIZES)
    drive(spec, world)
    weight = world.requests["c02-weight"]
    assert isinstance(weight, WeightRequest) and weight.weight.total_steps == 10
    assert weight.sampling == spec.experiment.rsft.sampling and "spec" not in weight.to_wire()
    evals = [r for r in world.requests.values() if isinstance(r, EvalRequest)]
    assert evals and all(r.sampling.temperature == 0.25 and r.sampling.top_k == 3 for r in evals)
    for request in world.requests.values():
        assert parse_request(request.to_wire()) == request


def test_a_weight_phase_is_watched_for_checkpoints_only_where_one_is_evaluated_before_it_ends():
    """``evaluates_mid_phase``: a controller's progress poll lists a running weight phase's checkpoints only where
    ``decide`` evaluates one before the phase ends (an evaluation point inside its range); its last checkpoint is read
    once its child has ended. Unknown (no split sizes yet) counts as yes."""

    def spec(condition: str, interval: int, **schedule: int) -> WhaleRunSpec:
        return WhaleRunSpec.model_validate(
            {
                "domain": "synthetic",
                "condition": condition,
                "model": {"name": "tiny"},
                "schedule": {"totalSteps": 12, **schedule},
                "evaluation": {"intervalSteps": interval},
            }
        )

    fresh = WhaleRunStatus()
    # whale, a cycle of 4 steps evaluated at its end: nothing inside the phase
    assert not evaluates_mid_phase(spec("whale", 4, weightStepsPerCycle=4), fresh, SIZES)
    # evaluated every 2 steps: step 2 lies inside the first cycle (0 -> 4)
    assert evaluates_mid_phase(spec("whale", 2, weightStepsPerCycle=4), fresh, SIZES)
    # rsft_only trains the whole budget in one phase, evaluated along the way
    assert evaluates_mid_phase(spec("rsft_only", 4), fresh, SIZES)
    # evaluated every 6 steps: none inside the first cycle (0 -> 4), step 6 inside the second (4 -> 8)
    second = WhaleRunStatus.model_validate({"checkpointStep": 4, "completedPhases": ["c01-weight", "c01-harness"]})
    assert second.checkpoint_step == 4
    assert not evaluates_mid_phase(spec("whale", 6, weightStepsPerCycle=4), fresh, SIZES)
    assert evaluates_mid_phase(spec("whale", 6, weightStepsPerCycle=4), second, SIZES)
    assert evaluates_mid_phase(spec("whale", 4, weightStepsPerCycle=4), fresh, {})


def test_a_call_that_changes_nothing_gives_back_the_status_it_was_given():
    """Level-based: the same world twice is the same status; and then the very object given, so a controller sees
    there is nothing to write without serialising the two (both grow with the run). A change is a new status."""
    spec = make_spec("whale", totalSteps=6, weightStepsPerCycle=3)
    world = World(SIZES, stop_at_step={"c01-weight": 1})
    status = WhaleRunStatus()
    for _ in range(4):  # started, its evaluation run, the first weight phase halted at step 1 (still running)
        decision = decide(spec, status, world.observe(status))
        status = decision.status
        world.apply(decision)
        world.progress()
    assert status.active_phase == "c01-weight" and world.children["c01-weight"].state is ChildState.RUNNING
    same = decide(spec, status, world.observe(status))
    assert same.status is status
    world.metrics["c01-weight"].append(weight_line(2, 0.5))  # a new step's line: progress, so a new status
    moved = decide(spec, status, world.observe(status)).status
    assert moved is not status and (moved.step, moved.progress_mark) != (status.step, status.progress_mark)
