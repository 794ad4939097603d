"""Evaluation workload: mean@k of (checkpoint, harness) on a split.

Reads the PhaseRequest (kind ``eval``): ``checkpoint`` = a store prefix of an HF checkpoint (None =
``spec.experiment.model``), ``harness`` = a store key of a harness file (None = the domain's h0). Loads the
domain (``whale.plugins.load(spec.domain)``), the split ``spec.experiment.evaluation.split`` (test by default)
capped at ``spec.experiment.evaluation.maxItems``, and runs k = ``spec.experiment.evaluation.samplesPerItem`` episodes per
item at ``spec.experiment.evaluation.temperature`` (top_p/top_k/max tokens from ``spec.experiment.rsft.sampling``), at most
``spec.execution.inference.maxConcurrency`` at once. Every model call is seeded from ``spec.experiment.evaluation.seed``, the
item id, the sample index and the turn (``whale.harness.runner.RunnerConfig.seed``), so the same
checkpoint and harness give the same per-item rewards and mean@k in every evaluation, whatever the
concurrency and batching; ``seed: null`` samples unseeded.

Inference backend (``whale.inference.factory``): ``inference.backend`` ``transformers`` → in-process
(loading the checkpoint, else ``spec.experiment.model``: name/path and optional ``ggufFile``); ``openai``/``vllm``
→ HTTP at ``spec.execution.inference.baseUrl`` or ``$WHALE_INFERENCE_URL`` (the controller has pointed that
server at the checkpoint); ``auto`` → HTTP when ``$WHALE_INFERENCE_URL`` is set, else in-process.

Writes, per the layout: per-item results (JSON lines) to ``layout.eval_items_key`` — rewards, turns and
the model's usage (mean completion tokens, episodes with no model call, rewarded ones among them), so a
harness that answers without the model shows per item, summed up in ``EvalResult.modelUsage`` — the episode
traces next to them (``traces/*.jsonl``, one object per chunk), episodes done/total to ``layout.progress_key`` as
they finish (at most every few seconds), one ``EvalProgress`` line per chunk of items to
``layout.metrics_key``, and the ``EvalResult`` to ``layout.result_key`` last. Items already in
the per-item file (an earlier attempt) are not run again. A STOP request ends the phase after the
current chunk, with a result over the items done and a note. If every episode of the first chunk
fails (inference server down, harness broken), the workload fails instead of reporting 0.
"""

from __future__ import annotations

import asyncio
import logging
import statistics
import tempfile
import time
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from whale.core import layout
from whale.core.protocol import (
    EvalModelUsage,
    EvalProgress,
    EvalRequest,
    EvalResult,
    PhaseKind,
    PhaseProgress,
    ProgressStage,
)
from whale.core.spec import WhaleRunSpec
from whale.domain import Domain
from whale.harness.process import HarnessPool
from whale.harness.runner import EpisodeRunner, RunnerConfig
from whale.harness.trace import EndReason, Episode
from whale.harness.validate import validate_file
from whale.inference.base import InferenceClient
from whale.metaharness.integrity import IntegrityAction, IntegrityPolicy, ModelUsage, integrity_flags, model_usage
from whale.rsft.checkpoint import require_complete
from whale.store import Store
from whale.workloads.common import (
    ProgressWriter,
    enforces_provenance,
    episode_bounds,
    harness_file,
    harness_limits,
    load_domain,
    read_request,
    read_spec,
    sampling_params,
)

log = logging.getLogger(__name__)


class EvalError(RuntimeError):
    """The evaluation cannot produce a meaningful result; the message says why."""


def read_traces(store: Store, run: str, phase: str) -> list[dict[str, Any]]:
    """Every trace of an eval phase, in write order."""
    return [t for key in store.list(layout.eval_traces_prefix(run, phase)) for t in store.read_jsonl(key)]


# ----- pure aggregation -----------------------------------------------------------------------------


def item_record(item_id: str, subset: str, episodes: Sequence[Episode]) -> dict[str, Any]:
    """One line of per_item.jsonl."""
    rewards = [e.reward for e in episodes]
    usage = model_usage(episodes)
    return {
        "item_id": item_id,
        "subset": subset,
        "k": len(episodes),
        "rewards": rewards,
        "mean": statistics.fmean(rewards) if rewards else 0.0,
        "turns": [e.turns for e in episodes],
        "errors": [e.error for e in episodes if e.end == EndReason.ERROR],
        "limits": [e.error for e in episodes if e.end == EndReason.LIMIT],
        "completion_tokens": usage.completion_tokens,
        "mean_completion_tokens": round(usage.mean_completion_tokens, 3),
        "mean_turns": round(usage.mean_turns, 3),
        "episodes_without_model": usage.without_model,
        "rewarded_without_model": usage.rewarded_without_model,
        "answer_not_model": usage.answer_not_model,
        "rewarded_injected": usage.rewarded_injected,
    }


def usage_summary(records: Sequence[dict[str, Any]]) -> EvalModelUsage:
    """The model usage of a whole evaluation from its per-item records (an earlier attempt's included)."""
    usage = as_model_usage(records)
    return EvalModelUsage(
        episodes=usage.episodes,
        episodes_without_model=usage.without_model,
        rewarded_without_model=usage.rewarded_without_model,
        items_answered_without_model=sum(1 for r in records if int(r.get("rewarded_without_model", 0)) > 0),
        mean_completion_tokens=round(usage.mean_completion_tokens, 3),
        mean_turns=round(usage.mean_turns, 3),
        answer_not_model=usage.answer_not_model,
        rewarded_injected=usage.rewarded_injected,
    )


def as_model_usage(records: Sequence[dict[str, Any]]) -> ModelUsage:
    """The evaluation's usage in the integrity rules' terms (``whale.metaharness.integrity``)."""
    return ModelUsage(
        episodes=sum(int(r.get("k", len(r.get("rewards", [])))) for r in records),
        rewarded=sum(sum(1 for x in r.get("rewards", []) if x > 0) for r in records),
        without_model=sum(int(r.get("episodes_without_model", 0)) for r in records),
        rewarded_without_model=sum(int(r.get("rewarded_without_model", 0)) for r in records),
        completion_tokens=sum(int(r.get("completion_tokens", 0)) for r in records),
        turns=sum(sum(r.get("turns", [])) for r in records),
        answer_not_model=sum(int(r.get("answer_not_model", 0)) for r in records),
        rewarded_injected=sum(int(r.get("rewarded_injected", 0)) for r in records),
    )


def evaluation_split_differs(spec: WhaleRunSpec) -> bool:
    """Whether the evaluation's split is not D_harness (where the split rule has something to compare)."""
    return spec.experiment.evaluation.split != "harness"


def reference_usage(store: Store, harness: str | None) -> ModelUsage | None:
    """The evaluated harness's model usage on D_harness, as its harness phase measured it: an archive
    candidate's ``meta.json`` beside its ``harness.py``, or the ``.usage.json`` the search writes beside an
    accepted harness. None for h0 and for a harness with no such record (no split rule then)."""
    if harness is None:
        return None
    for key in (harness.removesuffix("harness.py") + "meta.json", layout.harness_usage_key(harness)):
        if key != harness and store.exists(key):
            usage = store.read_json(key).get("usage")
            if isinstance(usage, dict):
                return ModelUsage.from_dict(usage)
    return None


def summarise(records: Sequence[dict[str, Any]], k: int) -> tuple[float, dict[str, float]]:
    """(mean@k over items, per-subset mean@k). An item's score is the mean of its k rewards."""
    if not records:
        return 0.0, {}
    by_subset: dict[str, list[float]] = defaultdict(list)
    for record in records:
        by_subset[record["subset"]].append(record["mean"])
    overall = statistics.fmean(r["mean"] for r in records)
    return overall, {name: statistics.fmean(values) for name, values in sorted(by_subset.items())}


# ----- the workload ---------------------------------------------------------------------------------


def main(store: Store, run: str, phase: str) -> None:
    run_eval(store, run, phase)


def run_eval(
    store: Store,
    run: str,
    phase: str,
    *,
    domain: Domain | None = None,
    client: InferenceClient | None = None,
    chunk_items: int | None = None,
) -> EvalResult:
    """The workload; ``domain`` and ``client`` may be injected (tests, in-process callers)."""
    request = read_request(store, run, phase, PhaseKind.EVAL, EvalError)
    if request.eval.checkpoint is not None:  # like train: never evaluate a half-written checkpoint
        require_complete(store, request.eval.checkpoint)
    spec = read_spec(store, run, EvalError)
    domain = load_domain(spec, domain)
    evaluation = spec.experiment.evaluation
    items = domain.load_split(evaluation.split, spec.experiment.data, store)
    if evaluation.max_items is not None:
        items = items[: evaluation.max_items]
    if not items:
        raise EvalError(f"split {evaluation.split!r} of domain {spec.domain!r} has no items")

    with tempfile.TemporaryDirectory(prefix="whale-eval-") as tmp:
        harness_path = harness_file(store, request.eval.harness, domain, spec.experiment.data, Path(tmp))
        validate_file(harness_path, domain.allowed_imports)
        owns_client = client is None
        if client is None:
            from whale.inference.factory import make_client

            client = make_client(spec, store, request.eval.checkpoint)
        pending = _evaluate(store, run, phase, request, spec, domain, items, harness_path, client, chunk_items)
        return asyncio.run(_evaluate_and_close(client, owns_client, pending))


async def _evaluate_and_close(client: InferenceClient, owns_client: bool, evaluation: Any) -> EvalResult:
    """One event loop for the evaluation and the client's shutdown (HTTP pools are loop-bound)."""
    try:
        return await evaluation
    finally:
        if owns_client:
            await client.aclose()


async def _evaluate(
    store: Store,
    run: str,
    phase: str,
    request: EvalRequest,
    spec: WhaleRunSpec,
    domain: Domain,
    items: list[dict[str, Any]],
    harness_path: Path,
    client: InferenceClient,
    chunk_items: int | None,
) -> EvalResult:

    k = spec.experiment.evaluation.samples_per_item
    items_key, metrics_key = layout.eval_items_key(run, phase), layout.metrics_key(run, phase)
    records = store.read_jsonl(items_key)  # an earlier attempt's items are kept
    done = {r["item_id"] for r in records}
    todo = [item for item in items if str(item.get("id")) not in done]
    # chunks of ~4x the concurrency in episodes: few stragglers idle the slots, STOP is still seen often
    chunk = chunk_items or max(1, 4 * spec.execution.inference.max_concurrency // k)
    notes: list[str] = list(domain.notes())
    errors = sum(len(r.get("errors", [])) for r in records)
    limited = sum(len(r.get("limits", [])) for r in records)
    # an item's k first turns share one n=k request (one prefill) when their prompts are equal
    # seeded per (evaluation seed, item, sample, turn): the same checkpoint and harness give the same mean@k
    config = RunnerConfig(
        max_concurrency=spec.execution.inference.max_concurrency,
        harness_label=request.eval.harness or "h0",
        share_first_turn=True,
        seed=spec.experiment.evaluation.seed,
        bounds=episode_bounds(spec),
        deadline=time.monotonic() + spec.experiment.evaluation.timeout_seconds,
        enforce_provenance=enforces_provenance(spec),
    )
    isolation = spec.execution.sandbox.isolation
    if isolation == "none":
        notes.append(
            "spec.execution.sandbox.isolation was none: harness processes and code tools ran WITHOUT isolation"
        )
    # episodes done/total as each finishes, for a display (the items' metrics lines come after each chunk)
    progress = ProgressWriter(store, run, phase)
    progress(
        PhaseProgress(stage=ProgressStage.EVALUATING, done=len(records) * k, total=len(items) * k, unit="episodes")
    )
    async with HarnessPool(harness_path, domain.allowed_imports, harness_limits(spec)) as harness:
        runner = EpisodeRunner(domain, harness, client, sampling_params(request, spec), config)
        for start in range(0, len(todo), chunk):
            if store.exists(layout.stop_key(run, phase)):
                notes.append(f"stopped by request after {len(records)} of {len(items)} items")
                break
            batch = todo[start : start + chunk]
            episodes = await runner.run(batch, k=k, on_episode=progress.advance)
            failed = [e for e in episodes if e.end == EndReason.ERROR]
            if failed and len(failed) == len(episodes) and not records:
                raise EvalError(f"every episode of the first {len(batch)} items failed; first error: {failed[0].error}")
            errors += len(failed)
            limited += sum(1 for e in episodes if e.end == EndReason.LIMIT)
            new = [
                item_record(str(item.get("id")), domain.subset(item), episodes[i * k : (i + 1) * k])
                for i, item in enumerate(batch)
            ]
            trace_key = f"{layout.eval_traces_prefix(run, phase)}attempt-{request.attempt}-{start // chunk:05d}.jsonl"
            store.write_bytes(trace_key, "".join(e.to_json() + "\n" for e in episodes).encode("utf-8"))
            store.append_jsonl(items_key, new)
            records.extend(new)
            store.append_jsonl(metrics_key, EvalProgress(items_done=len(records), items_total=len(items)).to_wire())
            log.info("eval %s: %d/%d items", phase, len(records), len(items))
    if errors:
        notes.append(f"{errors} episodes ended in an error (scored 0); see {layout.eval_traces_prefix(run, phase)}")
    if limited:
        notes.append(
            f"{limited} episodes reached a bound (spec.execution.sandbox.episode, spec.experiment.evaluation.timeoutSeconds) and were "
            f"ended (scored 0); see limits in {items_key}"
        )
    mean, per_subset = summarise(records, k)
    usage = usage_summary(records)
    policy = IntegrityPolicy(
        IntegrityAction(spec.experiment.harness_search.integrity.action),
        spec.experiment.harness_search.integrity.min_token_ratio,
    )
    reference = reference_usage(store, request.eval.harness) if evaluation_split_differs(spec) else None
    flags = integrity_flags(
        as_model_usage(records), mean, baseline=None, baseline_score=None, policy=policy, reference=reference
    )
    for flag in flags:
        log.warning("eval %s: reward integrity: %s", phase, flag)
    if usage.items_answered_without_model:
        notes.append(
            f"reward integrity: {usage.items_answered_without_model} of {len(records)} items were answered "
            f"without calling the model ({usage.rewarded_without_model} rewarded episodes made no model "
            f"call); see rewarded_without_model in {items_key}"
        )
        log.warning("eval %s: %s", phase, notes[-1])
    result = EvalResult(
        mean_at_k=mean,
        k=k,
        items=len(records),
        per_subset=per_subset,
        checkpoint=request.eval.checkpoint,
        harness=request.eval.harness,
        notes=notes,
        model_usage=usage,
        sandbox_isolation=isolation,
        integrity_flags=list(flags),
    )
    store.write_json(layout.result_key(run, phase), result.to_wire())
    return result
