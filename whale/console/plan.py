"""What `whale plan` adds to ``whale.core.schedule.plan``: each listed phase's rollouts and the evaluations'
count and cost. Pure.

Training rollouts (weight steps and harness search) are the budget the paper's figures count; an
evaluation's rollouts (test items x samplesPerItem, per point) are reported apart, as its cost.
"""

from __future__ import annotations

from typing import Any

from whale.core.schedule import harness_phase_rollouts, resolve
from whale.core.spec import WhaleRunSpec


def eval_items(spec: WhaleRunSpec, split_sizes: dict[str, int]) -> int:
    """Items one evaluation scores: its split (``spec.experiment.evaluation.split``), capped by ``maxItems``."""
    n = int(split_sizes.get(spec.experiment.evaluation.split, 0))
    return min(n, spec.experiment.evaluation.max_items) if spec.experiment.evaluation.max_items is not None else n


def with_costs(plan: dict[str, Any], spec: WhaleRunSpec, split_sizes: dict[str, int]) -> dict[str, Any]:
    """``plan`` with ``rollouts`` on every listed phase (an upper bound where the phase is one) and an
    ``evaluation`` entry: ``count``, ``items``, ``samplesPerItem``, ``rolloutsEach``, ``rollouts``."""
    sched = resolve(spec, split_sizes)
    items = eval_items(spec, split_sizes)
    k = spec.experiment.evaluation.samples_per_item
    phases = []
    for entry in plan["phases"]:
        if entry["kind"] == "weight":
            rollouts = (entry["toStep"] - entry["fromStep"]) * sched.rollouts_per_step
        elif entry["kind"] == "harness":
            rollouts = harness_phase_rollouts(sched, entry["iterations"])
        else:
            rollouts = items * k
        phases.append({**entry, "rollouts": rollouts})
    count = plan["counts"]["eval"]
    return {
        **plan,
        "phases": phases,
        "evaluation": {
            "count": count,
            "items": items,
            "samplesPerItem": k,
            "rolloutsEach": items * k,
            "rollouts": count * items * k,
        },
    }
