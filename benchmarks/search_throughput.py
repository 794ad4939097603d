"""Harness-search throughput on this machine: candidate evaluations per hour with the tiny model, and
the rollouts the validation + smoke gate saves on broken candidates.

Runs the real search workload (``whale.workloads.search.run_search``) on the synthetic domain with
the synthetic tiny model (2-layer Qwen3, in-process transformers backend) as the fixed policy and a
replay proposer (no model: the proposer's own cost is not what is measured). The replayed
candidates per iteration: one working harness plus broken ones — a syntax error, a forbidden
import, a hook that loops forever, a hook that crashes at run time, and a revert to an earlier
candidate. Everything is read back from the archive the run wrote.

    .venv/bin/python benchmarks/search_throughput.py [--items 64] [--rollouts-per-item 1]
        [--smoke-items 4] [--concurrency 16] [--max-tokens 16] [--model DIR] [--json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from whale.core import layout
from whale.core.protocol import HarnessPhaseArgs, phase_request
from whale.inference.base import SamplingParams
from whale.metaharness.archive import Archive
from whale.metaharness.evaluate import EvalSettings
from whale.metaharness.records import Status
from whale.store import open_store
from whale.workloads.search import run_search

RUN, PHASE = "bench", layout.harness_phase_key(1)

WORKING = '''"""Answer with the digit only, inside the tag, and keep the reply short."""
from whale.harness.api import BaseHarness, env_action


class Harness(BaseHarness):
    SYSTEM_PROMPT = "Answer inside <answer></answer>. Repeat the digit you are given."
    USER_TEMPLATE = "{question}"
    MAX_TURNS = 1
    MAX_FORMAT_RETRIES = 0

    def parse_action(self, text, state):
        return env_action(text)
'''
BROKEN = {
    "syntax_error": "from whale.harness.api import BaseHarness\n\nclass Harness(BaseHarness:\n    pass\n",
    "forbidden_import": WORKING.replace("from whale.harness.api", "import socket\nfrom whale.harness.api"),
    "infinite_loop": WORKING.replace("        return env_action(text)", "        while True:\n            pass"),
    "runtime_crash": WORKING.replace("        return env_action(text)", "        return env_action(text[10 ** 9])"),
}


def replay_script(path: Path) -> Path:
    script = {
        "iterations": {
            "2": [
                {"name": "working", "code": WORKING, "rationale": "say the task twice"},
                {"name": "syntax_error", "code": BROKEN["syntax_error"]},
                {"name": "infinite_loop", "code": BROKEN["infinite_loop"]},
            ],
            "3": [
                {"name": "runtime_crash", "code": BROKEN["runtime_crash"]},
                {"name": "forbidden_import", "code": BROKEN["forbidden_import"]},
                {"name": "revert", "code": WORKING},
            ],
        }
    }
    path.write_text(json.dumps(script))
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--items", type=int, default=64, help="|D_harness| (the paper uses 256)")
    parser.add_argument("--rollouts-per-item", type=int, default=1)
    parser.add_argument("--smoke-items", type=int, default=4)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--model", type=Path, help="a built synthetic tiny model (default: build one, ~seconds)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()

    from whale.inference.transformers_backend import TransformersClient

    with tempfile.TemporaryDirectory(prefix="whale-bench-search-") as tmp:
        tmp_path = Path(tmp)
        model_dir = args.model
        t0 = time.perf_counter()
        if model_dir is None:
            from synthetic.tiny_model import build

            model_dir = build(tmp_path / "model")
        build_s = time.perf_counter() - t0
        client = TransformersClient.from_pretrained(
            str(model_dir), model_name="synthetic-tiny", max_batch_size=args.concurrency
        )
        store = open_store(str(tmp_path / "store"))
        spec = {
            "domain": "synthetic",
            "condition": "mh_only",
            "model": {"name": str(model_dir)},
            "data": {"harnessSize": args.items},
            "harnessSearch": {
                "proposalsPerIteration": 3,
                "rolloutsPerItem": args.rollouts_per_item,
                "smokeTestItems": args.smoke_items,
                "proposer": {"backend": "replay", "script": str(replay_script(tmp_path / "script.json"))},
            },
        }
        request = phase_request(
            spec,
            run=RUN,
            phase=PHASE,
            attempt=1,
            args=HarnessPhaseArgs(
                cycle=1,
                incoming_harness=None,
                checkpoint=None,
                step=0,
                iterations=3,
                archive=layout.archive_prefix(RUN, 1),
            ),
        )
        store.write_json(layout.spec_key(RUN), spec)
        store.write_json(layout.request_key(RUN, PHASE), request.to_wire())
        settings = EvalSettings(
            rollouts_per_item=args.rollouts_per_item,
            smoke_items=args.smoke_items,
            smoke_hook_timeout_s=2.0,
            candidate_timeout_s=3600,
            sampling=SamplingParams(temperature=1.0, max_tokens=args.max_tokens),
            max_concurrency=args.concurrency,
        )
        t0 = time.perf_counter()
        result = run_search(store, RUN, PHASE, client=client, settings=settings)
        wall_s = time.perf_counter() - t0
        cands = Archive(store, layout.archive_prefix(RUN, 1)).candidates()

    full_rollouts = args.items * args.rollouts_per_item
    scored = [c for c in cands if c.status is Status.SCORED]
    gated = [c for c in cands if c.status in (Status.INVALID, Status.SMOKE_FAILED)]
    eval_s = statistics.fmean(c.seconds for c in scored)
    spent_on_broken = sum(c.rollouts for c in gated)
    without_gate = len(gated) * (full_rollouts + args.smoke_items)
    report = {
        "items": args.items,
        "rollouts_per_item": args.rollouts_per_item,
        "concurrency": args.concurrency,
        "max_tokens": args.max_tokens,
        "model_build_s": round(build_s, 1),
        "phase_wall_s": round(wall_s, 1),
        "full_evaluations": len(scored),
        "seconds_per_full_evaluation": round(eval_s, 2),
        "candidate_evaluations_per_hour": round(3600 / eval_s, 1),
        "rollouts_per_second": round(statistics.fmean(c.rollouts / c.seconds for c in scored if c.seconds), 2),
        "broken_candidates": {
            c.name or c.id: {"status": c.status.value, "rollouts": c.rollouts, "seconds": round(c.seconds, 2)}
            for c in gated
        },
        "duplicates": [c.id for c in cands if c.status is Status.DUPLICATE],
        "rollouts_on_broken_with_gate": spent_on_broken,
        "rollouts_on_broken_without_gate": without_gate,
        "rollouts_saved": without_gate - spent_on_broken,
        "accepted": result.accepted_candidate,
        "accepted_score": result.accepted_score,
        "total_rollouts": result.rollouts,
    }
    if args.json:
        print(json.dumps(report, indent=2))
        return
    print(
        f"search throughput: {args.items} D_harness items x {args.rollouts_per_item} rollout(s), "
        f"concurrency {args.concurrency}, max {args.max_tokens} tokens, synthetic tiny model (CPU)"
    )
    print(
        f"  full evaluations: {len(scored)}, {eval_s:.2f} s each -> {3600 / eval_s:.0f} candidate evaluations/hour"
        f" ({report['rollouts_per_second']} rollouts/s)"
    )
    for name, row in report["broken_candidates"].items():
        print(f"  {name:18s} {row['status']:13s} rollouts {row['rollouts']:3d}  {row['seconds']:6.2f} s")
    print(
        f"  rollouts on broken candidates: {spent_on_broken} with the gate vs {without_gate} without "
        f"-> {without_gate - spent_on_broken} saved"
    )
    print(
        f"  accepted {result.accepted_candidate} (score {result.accepted_score:.3f}); phase {wall_s:.1f} s, "
        f"{result.rollouts} rollouts"
    )


if __name__ == "__main__":
    main()
