"""Turning a spec's budgets into steps and iterations, and the plan a run will follow.

Epochs convert to steps with steps-per-epoch = round(|D_weight| / promptsPerStep) and a budget of
``x`` epochs = round(x * steps-per-epoch) steps. Rounding is half-up (not Python's half-to-even),
which reproduces the paper: 74/70/64 steps per epoch, E=0.6 -> 44/42/38 steps. Pure.

Nothing here grows with the number of steps: evaluation points are a ``range`` (arithmetic, never a
list of every step), a run's budget is at most ``spec.MAX_STEPS`` steps with at most
``spec.MAX_EVALUATION_POINTS`` evaluation points, and ``plan`` walks the phases once, keeping only
the first and last ``PLAN_MAX_LISTED`` // 2 entries of a long plan.
"""

from __future__ import annotations

import math
from collections import Counter, deque
from collections.abc import Iterator
from dataclasses import dataclass
from itertools import chain, islice
from typing import Any

from whale.core.batching import optimizer_updates
from whale.core.protocol import HarnessStopRule, WeightStopRule
from whale.core.spec import MAX_EVALUATION_POINTS, MAX_STEPS, Condition, WhaleRunSpec

DEFAULT_EVAL_INTERVAL_EPOCHS = 0.1
DEFAULT_ADAPTIVE_EPOCHS = 0.2
#: ``plan`` lists at most this many entries: the first and the last half of a longer plan
PLAN_MAX_LISTED = 200


class ScheduleError(ValueError):
    """A schedule that cannot run; ``field`` is the spec path to fix."""

    def __init__(self, field_path: str, message: str):
        self.field = field_path
        super().__init__(f"{field_path}: {message}")


def round_half_up(x: float) -> int:
    return math.floor(x + 0.5)


def steps_per_epoch(weight_size: int, prompts_per_step: int) -> int:
    """At least 1: a D_weight smaller than one batch still makes one step per epoch."""
    return max(1, round_half_up(weight_size / prompts_per_step))


def _steps(epochs: float | None, steps: int | None, spe: int, default_epochs: float | None) -> int | None:
    if steps is not None:
        return steps
    if epochs is None:
        epochs = default_epochs
    if epochs is None:
        return None
    return round_half_up(epochs * spe)


@dataclass(frozen=True)
class ResolvedSchedule:
    """Every budget of a run, in steps and iterations."""

    condition: Condition
    weight_size: int
    harness_size: int
    steps_per_epoch: int
    total_steps: int  # 0 for mh_only
    cycle_steps: int | None  # E in steps (whale only)
    #: archive iterations of a harness phase, the incoming re-evaluation included (the maximum for adaptive):
    #: I (whale), mhOnlyIterations + 1 (mh_only), adaptive maxIterations + 1 (adaptive_whale)
    harness_iterations: int
    max_cycles: int
    eval_interval_steps: int
    weight_rule: WeightStopRule | None = None
    harness_rule: HarnessStopRule | None = None
    rollouts_per_step: int = 0
    rollouts_per_harness_iteration: int = 0
    rollouts_incoming_evaluation: int = 0
    #: what one proposal spends when it is valid, new, passes its smoke test and is scored in full: one episode on
    #: each smoke item, then rolloutsPerItem on every D_harness item (an invalid or duplicate one spends nothing,
    #: one that fails the smoke test at most its smoke episodes)
    rollouts_per_proposal_smoke: int = 0
    rollouts_per_proposal_full: int = 0
    #: of rollouts_per_harness_iteration: the proposer's run_candidate budget (0 unless that option is on)
    proposer_trial_rollouts: int = 0
    every_accepted_harness: bool = False

    @property
    def proposer_iterations(self) -> int:
        """Proposer iterations of a harness phase (the archive's iterations minus the incoming evaluation)."""
        return self.harness_iterations - 1

    @property
    def evaluates_every_accepted_harness(self) -> bool:
        """mh_only with evaluation.everyAcceptedHarness: a test evaluation per change of the accepted harness."""
        return self.condition is Condition.MH_ONLY and self.every_accepted_harness

    @property
    def eval_points(self) -> range:
        """Every evaluation step of the weight budget: the multiples of the interval up to the total."""
        return range(self.eval_interval_steps, self.total_steps + 1, self.eval_interval_steps)

    def is_eval_point(self, step: int) -> bool:
        return 0 < step <= self.total_steps and step % self.eval_interval_steps == 0

    def eval_points_between(self, lo: int, hi: int) -> range:
        """Evaluation steps in (lo, hi], computed, not listed."""
        interval = self.eval_interval_steps
        first = max(interval, (lo // interval + 1) * interval)
        return range(first, min(hi, self.total_steps) + 1, interval)


def resolve(spec: WhaleRunSpec, split_sizes: dict[str, int]) -> ResolvedSchedule:
    """Resolve epochs into steps for these split sizes; raise ScheduleError naming the field."""
    weight_size = split_sizes.get("weight", 0)
    harness_size = split_sizes.get("harness", spec.experiment.data.harness_size)
    sched, rsft = spec.experiment.schedule, spec.experiment.rsft
    cond = spec.condition
    if cond.trains_weights and weight_size < 1:
        raise ScheduleError("spec.domain", f"domain {spec.domain!r} has an empty D_weight; check spec.experiment.data")
    spe = steps_per_epoch(max(weight_size, 1), rsft.prompts_per_step)

    total = 0
    if cond.trains_weights:
        total = _steps(sched.total_epochs, sched.total_steps, spe, None) or 0
        if total < 1:
            raise ScheduleError(
                "spec.experiment.schedule.totalEpochs",
                f"{sched.total_epochs} epochs x {spe} steps/epoch rounds to 0 steps; raise it or give totalSteps",
            )
        if total > MAX_STEPS:
            raise ScheduleError(
                "spec.experiment.schedule.totalEpochs",
                f"{sched.total_epochs} epochs x {spe} steps/epoch = {total} steps, more than the maximum of "
                f"{MAX_STEPS} steps; lower it",
            )

    cycle_steps = None
    if cond is Condition.WHALE:
        cycle_steps = _steps(sched.weight_epochs_per_cycle, sched.weight_steps_per_cycle, spe, None)
        field_name = (
            "spec.experiment.schedule.weightStepsPerCycle"
            if sched.weight_steps_per_cycle is not None
            else "spec.experiment.schedule.weightEpochsPerCycle"
        )
        if not cycle_steps or cycle_steps < 1:
            raise ScheduleError(field_name, f"rounds to 0 steps at {spe} steps/epoch; raise it")
        if cycle_steps > total:
            raise ScheduleError(
                field_name,
                f"E = {cycle_steps} steps is larger than the total budget of {total} steps; E must be <= the total",
            )

    weight_rule = harness_rule = None
    if cond is Condition.ADAPTIVE_WHALE:
        aw = sched.adaptive.weight
        window = _steps(aw.window_epochs, aw.window_steps, spe, DEFAULT_ADAPTIVE_EPOCHS) or 1
        burn_in = _steps(aw.burn_in_epochs, aw.burn_in_steps, spe, DEFAULT_ADAPTIVE_EPOCHS) or 0
        patience = _steps(aw.patience_epochs, aw.patience_steps, spe, DEFAULT_ADAPTIVE_EPOCHS) or 1
        weight_rule = WeightStopRule(
            window_steps=max(1, window), burn_in_steps=max(0, burn_in), patience_steps=max(1, patience)
        )
        ah = sched.adaptive.harness
        # the spec counts the maximum in proposer iterations (the paper's 15), the rule in archive iterations
        harness_rule = HarnessStopRule(
            min_iterations=ah.min_iterations, patience=ah.patience, max_iterations=ah.max_archive_iterations
        )

    # Every count below is in archive iterations (iteration 1 = the incoming re-evaluation), as the
    # workload runs them; the spec's mhOnlyIterations and adaptive maxIterations count proposer iterations.
    if cond is Condition.MH_ONLY:
        iterations = sched.mh_only_iterations + 1
    elif cond is Condition.ADAPTIVE_WHALE:
        iterations = sched.adaptive.harness.max_archive_iterations
    else:
        iterations = sched.harness_iterations_per_cycle

    ev = spec.experiment.evaluation
    interval = _steps(ev.interval_epochs, ev.interval_steps, spe, DEFAULT_EVAL_INTERVAL_EPOCHS) or 1
    interval = max(1, interval)
    if total // interval > MAX_EVALUATION_POINTS:
        raise ScheduleError(
            "spec.experiment.evaluation.intervalSteps"
            if ev.interval_steps is not None
            else "spec.experiment.evaluation.intervalEpochs",
            f"an evaluation every {interval} step(s) over {total} steps makes {total // interval} evaluation "
            f"points; at most {MAX_EVALUATION_POINTS} are allowed (each is a full mean@k pass over the test set "
            f"and an entry of the run's status): evaluate every {-(-total // MAX_EVALUATION_POINTS)} steps or more",
        )

    hs = spec.experiment.harness_search
    per_candidate = harness_size * hs.rollouts_per_item
    smoke = min(hs.smoke_test_items, harness_size)
    # the built-in agents' run_candidate (an option, off as in the paper): its budget is spent per proposer
    # iteration, so the plan counts it there (an upper bound: the proposer may spend less)
    trials = hs.proposer.run_candidate_rollouts if hs.proposer.backend in ("openai", "anthropic") else 0
    return ResolvedSchedule(
        condition=cond,
        weight_size=weight_size,
        harness_size=harness_size,
        steps_per_epoch=spe,
        total_steps=total,
        cycle_steps=cycle_steps,
        harness_iterations=iterations,
        max_cycles=sched.max_cycles,
        eval_interval_steps=interval,
        weight_rule=weight_rule,
        harness_rule=harness_rule,
        rollouts_per_step=rsft.prompts_per_step * rsft.rollouts_per_prompt,
        rollouts_per_harness_iteration=(smoke + per_candidate) * hs.proposals_per_iteration + trials,
        proposer_trial_rollouts=trials,
        rollouts_incoming_evaluation=per_candidate,
        rollouts_per_proposal_smoke=smoke,
        rollouts_per_proposal_full=per_candidate,
        every_accepted_harness=ev.every_accepted_harness,
    )


def min_adaptive_weight_steps(rule: WeightStopRule) -> int:
    """The shortest weight phase the adaptive rule allows (see ``whale.core.adaptive``)."""
    return max(rule.burn_in_steps, rule.patience_steps + 1)


def harness_phase_rollouts(sched: ResolvedSchedule, iterations: int) -> int:
    """Iteration 1 re-evaluates the incoming harness (scored in full, no smoke test); each later one smoke-tests and
    scores every proposal (an upper bound: see ``ResolvedSchedule.rollouts_per_proposal_smoke``)."""
    if iterations < 1:
        return 0
    return sched.rollouts_incoming_evaluation + (iterations - 1) * sched.rollouts_per_harness_iteration


def plan(spec: WhaleRunSpec, split_sizes: dict[str, int]) -> dict[str, Any]:
    """The schedule the run will follow, before it starts.

    For ``adaptive_whale`` the phases are bounds: every weight phase may end early (never before
    burn-in), every harness phase runs between minIterations and maxIterations + 1 archive iterations;
    the listed phases are the longest run the rules allow, and ``rollouts`` is an upper bound. A harness
    entry's ``iterations`` counts the phase's archive iterations, the incoming re-evaluation included;
    ``proposerIterations`` the rest. For ``mh_only`` with ``evaluation.everyAcceptedHarness`` the plan
    lists an evaluation for every proposer iteration (``upperBound``): one runs only where the accepted
    harness changes (``evaluationsUpperBound``).

    ``phases`` lists every weight, harness and eval entry in order; a plan longer than
    ``PLAN_MAX_LISTED`` lists its first and last half and says how many it left out
    (``phasesOmitted``). ``counts`` always counts them all."""
    sched = resolve(spec, split_sizes)
    cond = spec.condition
    adaptive = cond is Condition.ADAPTIVE_WHALE
    half = PLAN_MAX_LISTED // 2
    head: list[dict[str, Any]] = []
    tail: deque[dict[str, Any]] = deque(maxlen=half)
    counts: Counter[str] = Counter()
    rollouts = 0
    entries = _plan_entries(spec, sched)
    head.extend(islice(entries, half))
    reached = 0
    for entry in chain(head, _count_rest(entries, tail)):
        counts[entry["kind"]] += 1
        if entry["kind"] == "weight":
            rollouts += (entry["toStep"] - entry["fromStep"]) * sched.rollouts_per_step
            reached = max(reached, entry["toStep"])
        elif entry["kind"] == "harness":
            rollouts += harness_phase_rollouts(sched, entry["iterations"])
    total_entries = sum(counts.values())
    listed = head + list(tail)
    out: dict[str, Any] = {
        "condition": cond.value,
        "stepsPerEpoch": sched.steps_per_epoch,
        "totalSteps": sched.total_steps,
        "phases": listed,
        "counts": {kind: counts[kind] for kind in ("weight", "harness", "eval")},
        "rollouts": rollouts,
    }
    if total_entries > len(listed):
        out["phasesOmitted"] = total_entries - len(listed)
    if cond.trains_weights and reached < sched.total_steps:
        # the run ends at maxCycles before its budget: say so, and price what it trains
        out["totalSteps"] = reached
        out["requestedTotalSteps"] = sched.total_steps
        out["warnings"] = [
            f"schedule.maxCycles ({sched.max_cycles}) ends the run after {sched.max_cycles} cycles, at step "
            f"{reached:,} of the {sched.total_steps:,} the weight budget asks for; raise schedule.maxCycles "
            "or lower schedule.totalSteps/totalEpochs"
        ]
    if sched.cycle_steps:
        out["weightStepsPerCycle"] = sched.cycle_steps
    if cond.trains_weights:
        out["rolloutsPerStep"] = sched.rollouts_per_step  # promptsPerStep x rolloutsPerPrompt
        out["evalIntervalSteps"] = sched.eval_interval_steps
    if cond.searches_harness:
        # archive iterations, the incoming evaluation included: I, mh_only's N + 1, adaptive's maximum + 1
        out["harnessIterationsPerPhase"] = sched.harness_iterations
    if adaptive:
        out["rolloutsUpperBound"] = True
        if sched.weight_rule is not None and sched.harness_rule is not None:
            w, ah = sched.weight_rule, spec.experiment.schedule.adaptive.harness
            # the harness knobs as the spec (and the paper) count them: maxIterations in proposer iterations
            out["adaptive"] = {
                "weight": {
                    "windowSteps": w.window_steps,
                    "burnInSteps": w.burn_in_steps,
                    "patienceSteps": w.patience_steps,
                },
                "harness": {
                    "minIterations": ah.min_iterations,
                    "patience": ah.patience,
                    "maxIterations": ah.max_iterations,
                },
            }
    if cond.searches_harness and sched.proposer_iterations > 0:
        # a proposal spends its smoke test and its full score only when it is valid, new and survives the smoke
        out["rolloutsPerProposal"] = {
            "smoke": sched.rollouts_per_proposal_smoke,
            "full": sched.rollouts_per_proposal_full,
        }
        out["rolloutsUpperBound"] = True
    if sched.proposer_trial_rollouts:
        # run_candidate's budget per proposer iteration, counted in ``rollouts`` as if spent in full
        out["proposerTrialRolloutsPerIteration"] = sched.proposer_trial_rollouts
        out["rolloutsUpperBound"] = True
    if sched.evaluates_every_accepted_harness:
        # each listed evaluation happens only if the accepted harness changes at that iteration
        out["evaluationsUpperBound"] = True
    updates = optimizer_updates_per_step(spec)
    if updates is not None:
        out["optimizerUpdatesPerStep"] = updates
    return out


def _count_rest(entries: Iterator[dict[str, Any]], tail: deque[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    """Pass every remaining entry through, keeping the last ``tail.maxlen`` of them in ``tail``."""
    for entry in entries:
        tail.append(entry)
        yield entry


def _plan_entries(spec: WhaleRunSpec, sched: ResolvedSchedule) -> Iterator[dict[str, Any]]:
    """The plan's entries in order, one at a time (a weight phase's evaluations come from a range)."""
    cond = spec.condition
    ev = spec.experiment.evaluation
    adaptive = cond is Condition.ADAPTIVE_WHALE

    def evaluation(cycle: int, step: int, after: str) -> dict[str, Any]:
        return {"cycle": cycle, "kind": "eval", "step": step, "after": after}

    def weight(cycle: int, a: int, b: int) -> Iterator[dict[str, Any]]:
        entry: dict[str, Any] = {"cycle": cycle, "kind": "weight", "fromStep": a, "toStep": b}
        if adaptive and sched.weight_rule is not None:
            entry["minSteps"] = min(min_adaptive_weight_steps(sched.weight_rule), b - a)
            entry["upperBound"] = True
        yield entry
        for s in sched.eval_points_between(a, b):
            yield evaluation(cycle, s, "weight")
        if not sched.is_eval_point(b):
            yield evaluation(cycle, b, "weight")

    def harness(cycle: int, step: int) -> Iterator[dict[str, Any]]:
        # iterations: the archive's, the incoming re-evaluation included; proposerIterations: the rest
        entry: dict[str, Any] = {
            "cycle": cycle,
            "kind": "harness",
            "iterations": sched.harness_iterations,
            "proposerIterations": sched.proposer_iterations,
        }
        if adaptive and sched.harness_rule is not None:
            entry["minIterations"] = sched.harness_rule.min_iterations
            entry["upperBound"] = True
        yield entry
        if sched.evaluates_every_accepted_harness:
            # one evaluation per iteration whose accepted harness changes: at most one per proposer
            # iteration (the incoming harness is the start point); the last one is the phase's accepted harness
            for it in range(2, sched.harness_iterations + 1):
                yield {**evaluation(cycle, step, "harness"), "iteration": it, "upperBound": True}
        elif ev.after_harness_phase:
            yield evaluation(cycle, step, "harness")

    if ev.at_start:
        yield evaluation(0, 0, "start")
    if cond is Condition.MH_ONLY:
        yield from harness(1, 0)
        return
    if cond is Condition.RSFT_ONLY:
        yield from weight(1, 0, sched.total_steps)
        return
    # whale: E per cycle. adaptive: the longest run the rules allow ends every weight phase
    # as early as possible (after max(burn-in, patience + 1) steps, since a new best needs a
    # step) and runs every harness phase to maxIterations; that bounds the rollouts.
    step_per_cycle = sched.cycle_steps or sched.total_steps
    if adaptive and sched.weight_rule is not None:
        step_per_cycle = min_adaptive_weight_steps(sched.weight_rule)
    step, cycle = 0, 0
    while cycle < sched.max_cycles:
        cycle += 1
        target = min(step + step_per_cycle, sched.total_steps)
        if adaptive and cycle == sched.max_cycles:
            target = sched.total_steps
        yield from weight(cycle, step, target)
        step = target
        if step >= sched.total_steps:
            break
        yield from harness(cycle, step)


#: kept fractions of a step's rollouts ``whale plan`` shows the optimiser updates for
PLAN_KEPT_FRACTIONS = (0.25, 0.5, 1.0)


def optimizer_updates_per_step(spec: WhaleRunSpec) -> dict[str, Any] | None:
    """How many optimiser (AdamW) updates one RSFT step makes, for ``whale plan``; None for mh_only.

    It depends on how many trajectories the step keeps (reward > scoreThreshold), so the plan gives the
    formula, the upper bound (every rollout kept) and the figure at a few kept fractions, exact when each kept
    trajectory trains as one sequence (``rsft.sequences: trajectory``, the default) and a lower bound with
    ``turn`` (a multi-turn trace may then be several sequences). Data-parallel
    ranks = train.numNodes x train.gpusPerNode (the torchrun launch of the cluster; `whale run` trains
    in one process, where both scopes give the global figure)."""
    if not spec.condition.trains_weights:
        return None
    r, train = spec.experiment.rsft, spec.execution.train
    ranks = train.num_nodes * max(train.gpus_per_node, 1)
    rollouts = r.prompts_per_step * r.rollouts_per_prompt

    def at(kept: int) -> int:
        return optimizer_updates(
            kept, ranks=ranks, mini_batch_size=r.mini_batch_size, sft_epochs=r.sft_epochs, scope=r.mini_batch_scope
        )

    if r.mini_batch_scope == "perRank":
        formula = f"{r.sft_epochs} x ceil(ceil(kept / {ranks}) / {r.mini_batch_size})"
        per_update = ranks * r.mini_batch_size
    else:
        formula = f"{r.sft_epochs} x ceil(kept / {r.mini_batch_size})"
        per_update = r.mini_batch_size
    return {
        "miniBatchScope": r.mini_batch_scope,
        # the count is of kept trajectories: exact with one sequence per trajectory, a lower bound with one per turn
        "sequences": r.sequences,
        "exact": r.sequences == "trajectory",
        "dataParallelRanks": ranks,
        "sequencesPerUpdate": per_update,
        "formula": formula,
        "upperBound": at(rollouts),
        "byKept": [{"kept": round(f * rollouts), "updates": at(round(f * rollouts))} for f in PLAN_KEPT_FRACTIONS],
    }
