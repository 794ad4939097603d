"""Test double of the train / search / eval workloads.

It reads the PhaseRequest and writes exactly what the real workloads write — metrics lines,
checkpoints with their COMPLETE marker, the accepted harness, results — with no model, so the
local runner can be tested on every path in seconds. Behaviour is scripted through the
``WHALE_SIM`` environment variable (JSON):

* ``fail``: {phase: n} — the first n attempts exit 3 with a one-line reason;
* ``hang``: {phase: step_or_iteration} — block there until killed (a crash mid-phase);
* ``hang_training``: {phase: step} — block after sampling that (1-based) step: its progress object
  (stage ``training``, with its reward) is written, its metrics line is not;
* ``reward``: a list of training rewards indexed by global step (cycled), default rising;
* ``splits``: the split sizes data preparation writes (absent: it exits 0 writing nothing).

Run as ``python -m tests.workloads.simulated <train|search|eval|prepare> --store URI --run R --phase P``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading

from whale.core import layout
from whale.core.adaptive import harness_should_stop, weight_should_stop
from whale.core.protocol import (
    AcceptedHarness,
    EvalProgress,
    EvalResult,
    HarnessIterationMetrics,
    HarnessPhaseResult,
    PhaseProgress,
    PhaseRequest,
    ProgressStage,
    WeightPhaseResult,
    WeightStepMetrics,
    parse_request,
)
from whale.store import open_store

ROLLOUTS_PER_STEP = 16
ROLLOUTS_PER_ITERATION = 4


def behaviour() -> dict:
    return json.loads(os.environ.get("WHALE_SIM", "{}"))


def hang_forever() -> None:
    print("simulated hang", flush=True)
    threading.Event().wait()  # until the test kills us


def train(store, req: PhaseRequest, sim: dict) -> None:
    a, run, phase = req.weight, req.run, req.phase
    rewards = sim.get("reward") or [min(1.0, 0.1 * s) for s in range(1, 200)]
    lines = store.read_jsonl(layout.metrics_key(run, phase))
    step = lines[-1]["step"] if lines else a.from_step
    done_rewards = [m["rewardMean"] for m in lines]
    stopped_by = "target"
    while step < a.target_step:
        # the phase's own rule first, as the real one checks it right after each step's line (whale.rsft.phase): the
        # controller's stop request, made from that same line, must not race it
        if a.stop_rule and weight_should_stop(done_rewards, a.stop_rule):
            stopped_by = "patience"
            break
        if store.exists(layout.stop_key(run, phase)):
            stopped_by = "stop-request"
            break
        if sim.get("hang", {}).get(phase) == step:
            hang_forever()
        step += 1
        r = rewards[(step - 1) % len(rewards)]
        store.write_json(
            layout.progress_key(run, phase),
            PhaseProgress(
                stage=ProgressStage.TRAINING,
                step=step,
                reward_mean=r,
                acceptance_rate=r,
                kept=1,
                rollouts=ROLLOUTS_PER_STEP,
            ).to_wire(),
        )
        if sim.get("hang_training", {}).get(phase) == step:
            hang_forever()
        done_rewards.append(r)
        store.append_jsonl(
            layout.metrics_key(run, phase),
            WeightStepMetrics(
                step=step,
                epoch=step / a.steps_per_epoch,
                reward_mean=r,
                acceptance_rate=r,
                kept=1,
                loss=1.0 / step,
                learning_rate=1e-7,
                rollouts=ROLLOUTS_PER_STEP,
            ).to_wire(),
        )
        if step in a.save_steps:
            save_checkpoint(store, run, step)
    save_checkpoint(store, run, step)
    store.write_json(
        layout.result_key(run, phase),
        WeightPhaseResult(
            final_step=step,
            checkpoint=layout.checkpoint_prefix(run, step),
            rollouts=ROLLOUTS_PER_STEP * (step - a.from_step),
            stopped_by=stopped_by,
        ).to_wire(),
    )


def save_checkpoint(store, run: str, step: int) -> None:
    prefix = layout.checkpoint_prefix(run, step)
    store.write_json(f"{prefix}/config.json", {"simulated": True, "step": step})
    store.write_bytes(layout.checkpoint_complete_key(run, step), b"")


def search(store, req: PhaseRequest, sim: dict) -> None:
    a, run, phase = req.harness, req.run, req.phase
    lines = store.read_jsonl(layout.metrics_key(run, phase))
    best = [m["bestScore"] for m in lines]
    it = len(lines)
    stopped_by = "iterations"
    while it < a.iterations:
        if store.exists(layout.stop_key(run, phase)):
            stopped_by = "stop-request"
            break
        if a.stop_rule and harness_should_stop(best, a.stop_rule):
            stopped_by = "patience"
            break
        if sim.get("hang", {}).get(phase) == it:
            hang_forever()
        it += 1
        best.append(min(it, 3) / 10)
        # like the real search: a candidate per iteration in the archive; the accepted (best-so-far) one
        # changes only when the best score rises
        candidate = "i01-incoming" if it == 1 else f"i{it:02d}-c1"
        store.write_text(_candidate_file(a, candidate), f"# simulated candidate {candidate}\n")
        accepted_now = candidate if it == 1 or best[-1] > best[-2] else lines[-1]["bestCandidate"]
        line = HarnessIterationMetrics(
            iteration=it,
            best_score=best[-1],
            best_candidate=accepted_now,
            best_harness=_candidate_file(a, accepted_now),
            rollouts=ROLLOUTS_PER_ITERATION,
        ).to_wire()
        store.append_jsonl(layout.metrics_key(run, phase), line)
        lines.append(line)
    history = [
        AcceptedHarness(
            iteration=m["iteration"],
            candidate=m["bestCandidate"],
            harness=m["bestHarness"],
            score=m["bestScore"],
            rollouts=ROLLOUTS_PER_ITERATION * m["iteration"],
        )
        for n, m in enumerate(lines)
        if n == 0 or m["bestCandidate"] != lines[n - 1]["bestCandidate"]
    ]
    accepted = layout.harness_key(run, f"c{a.cycle:02d}-accepted")
    store.write_text(accepted, f"# simulated harness accepted in cycle {a.cycle}\n")
    store.write_json(
        layout.result_key(run, phase),
        HarnessPhaseResult(
            accepted_harness=accepted,
            accepted_candidate=lines[-1]["bestCandidate"],
            accepted_score=best[-1],
            iterations=it,
            rollouts=ROLLOUTS_PER_ITERATION * it,
            stopped_by=stopped_by,
            accepted_by_iteration=history,
        ).to_wire(),
    )


def _candidate_file(args, candidate: str) -> str:
    return f"{args.archive}/candidates/{candidate}/harness.py"


def evaluate(store, req: PhaseRequest, sim: dict) -> None:
    a = req.eval
    store.write_json(
        layout.progress_key(req.run, req.phase),
        PhaseProgress(stage=ProgressStage.EVALUATING, done=0, total=10, unit="items").to_wire(),
    )
    store.append_jsonl(layout.metrics_key(req.run, req.phase), EvalProgress(items_done=10, items_total=10).to_wire())
    mean = round(0.01 * a.step + (0.05 if a.after == "harness" else 0.0), 6)
    store.write_json(
        layout.result_key(req.run, req.phase),
        EvalResult(mean_at_k=mean, k=8, items=10, checkpoint=a.checkpoint, harness=a.harness).to_wire(),
    )


def prepare(store, req: PhaseRequest, sim: dict) -> None:
    """Like the prepare workload: the split sizes, written last (here: the scripted ones)."""
    if "splits" in sim:
        store.write_json(layout.split_sizes_key(req.run), sim["splits"])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("kind", choices=["train", "search", "eval", "prepare"])
    parser.add_argument("--store", required=True)
    parser.add_argument("--run", required=True)
    parser.add_argument("--phase", required=True)
    args = parser.parse_args()
    store = open_store(args.store)
    req = parse_request(store.read_json(layout.request_key(args.run, args.phase)))
    sim = behaviour()
    if req.attempt <= sim.get("fail", {}).get(req.phase, 0):
        print(f"simulated failure of {req.phase} attempt {req.attempt}", file=sys.stderr)
        raise SystemExit(3)
    {"train": train, "search": search, "eval": evaluate, "prepare": prepare}[args.kind](store, req, sim)


if __name__ == "__main__":
    main()
