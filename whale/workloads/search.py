"""Search workload: one harness phase (Meta-Harness search under fixed weights).

Reads the PhaseRequest (kind ``harness``): ``incomingHarness`` (a store key; None = the domain's
h0), ``checkpoint`` (a store prefix; None = ``spec.experiment.model``), ``iterations`` (archive iterations, the
incoming re-evaluation included; the maximum when ``stopRule`` is set), ``stopRule`` and ``archive`` (the
store prefix of this phase's archive, ``layout.archive_prefix(run, cycle)``). Runs
:class:`whale.metaharness.loop.HarnessSearch` with the proposer of ``spec.experiment.harnessSearch.proposer``
and the inference client of ``whale.inference.factory``; appends one HarnessIterationMetrics line
per iteration to ``layout.metrics_key`` (and where it is within one to ``layout.progress_key``); checks
``layout.stop_key`` between iterations; writes the
accepted harness to ``layout.harness_key(run, "cKK-accepted")`` and then the HarnessPhaseResult (with
the candidates flagged by the reward-integrity checks, ``spec.experiment.harnessSearch.integrity``, and every
iteration whose accepted harness was new, ``acceptedByIteration``) to ``layout.result_key`` last. A killed attempt resumes from the archive (``docs/metaharness.md``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from whale.core import layout
from whale.core.protocol import (
    AcceptedHarness,
    HarnessIterationMetrics,
    HarnessPhaseResult,
    HarnessRequest,
    IntegrityFlag,
    PhaseKind,
)
from whale.domain import ENV_SERVICE_URL_ENV, Data, Domain
from whale.inference.base import InferenceClient
from whale.metaharness.archive import Archive
from whale.metaharness.evaluate import CandidateEvaluator, EvalSettings
from whale.metaharness.integrity import IntegrityAction, IntegrityPolicy
from whale.metaharness.loop import HarnessSearch, SearchConfig, SearchError, SearchResult
from whale.metaharness.proposer import AGENT_EXCHANGE_ENV, Proposer
from whale.metaharness.proposer import from_spec as proposer_from_spec
from whale.rsft.checkpoint import require_complete
from whale.store import Store
from whale.workloads.common import (
    ProgressWriter,
    enforces_provenance,
    episode_bounds,
    harness_limits,
    load_domain,
    read_request,
    read_spec,
    sampling_params,
)

log = logging.getLogger(__name__)


def main(store: Store, run: str, phase: str) -> None:
    run_search(store, run, phase)


def load_request(store: Store, run: str, phase: str) -> HarnessRequest:
    return read_request(store, run, phase, PhaseKind.HARNESS, SearchError)


def prototype_files(
    domain: Domain,
    data: Data,
    items: Sequence[dict[str, Any]],
    incoming: str,
    local_services: dict[str, str] | None = None,
) -> dict[str, str]:
    """The proposer's prototyping kit (:mod:`whale.metaharness.proposer.kit`): the harness API's source, the
    domain's tool code (``Domain.prototype_modules``), the D_harness tasks as harnesses see them
    (``Environment.reset()``, no gold) and the URLs of the run's tool services this workload reaches (their
    variables set here, as on a cluster; ``local_services``: name -> URL of those started here, see
    :func:`needs_local_env_service`)."""
    from whale.harness import api
    from whale.metaharness.proposer.kit import MAX_TASKS, prototype_kit
    from whale.tools import passage_row, service_call

    tasks = [domain.make_env(item).reset() for item in list(items)[:MAX_TASKS]]
    services = {s.name: os.environ[s.url_env] for s in domain.tool_services_for(data) if os.environ.get(s.url_env)}
    services.update(local_services or {})
    api_source = Path(api.__file__).read_text("utf-8")
    library = {
        "whale/tools/passage_row.py": Path(passage_row.__file__).read_text("utf-8"),
        "whale/tools/service_call.py": Path(service_call.__file__).read_text("utf-8"),
    }
    return prototype_kit(api_source, incoming, tasks, services, {**domain.prototype_modules(), **library})


def needs_local_env_service(domain: Domain, proposer: Any, environ: dict[str, str] | os._Environ[str]) -> bool:
    """Whether this phase starts the environment service itself (``whale.tools.env_service.serve_locally``): a
    :attr:`~whale.domain.Domain.prototype_steps` domain (chess) whose run deployed none (a local run: no
    ``$WHALE_ENV_URL``), for an agent CLI that has a network to reach it (the host's, or the egress proxy's, which
    lets it reach the services its kit lists; the built-in agents play steps through ``try_harness`` instead)."""
    return (
        domain.prototype_steps
        and proposer.backend == "cli"
        and proposer.network != "none"
        and not environ.get(ENV_SERVICE_URL_ENV)
    )


def run_search(
    store: Store,
    run: str,
    phase: str,
    *,
    domain: Domain | None = None,
    client: InferenceClient | None = None,
    proposer: Proposer | None = None,
    settings: EvalSettings | None = None,
) -> HarnessPhaseResult:
    """The workload; ``domain``, ``client``, ``proposer`` and ``settings`` may be injected (tests).
    The proposer is closed when the phase ends (its connections live in this call's event loop); an
    injected client is left open."""
    request = load_request(store, run, phase)
    done = store.read_json_or_none(layout.result_key(run, phase))
    if done is not None:
        log.info("phase %s already has a result; nothing to do", phase)
        return HarnessPhaseResult.model_validate(done)
    args = request.harness
    if args.checkpoint is not None:  # like train: never search under a half-written checkpoint
        require_complete(store, args.checkpoint)
    spec = read_spec(store, run, SearchError)
    domain = load_domain(spec, domain)
    hs = spec.experiment.harness_search
    incoming = (
        store.read_text(args.incoming_harness)
        if args.incoming_harness
        else domain.h0_path_for(spec.experiment.data).read_text("utf-8")
    )
    skill = domain.skill_text(spec.experiment.data)
    items = domain.load_split("harness", spec.experiment.data, store)[: spec.experiment.data.harness_size]
    if not items:
        raise SearchError(f"the harness split of domain {spec.domain!r} is empty")
    config = SearchConfig(
        iterations=args.iterations,
        proposals_per_iteration=hs.proposals_per_iteration,
        prompt_only=hs.prompt_only,
        stop_rule=args.stop_rule,
        proposer_timeout_s=float(hs.proposer.timeout_seconds),
        proposer_max_turns=hs.proposer.max_turns,
        proposer_max_tokens=hs.proposer.max_tokens,
        proposer_trial_rollouts=hs.proposer.run_candidate_rollouts,
        proposer_shell=hs.proposer.shell,
        integrity=IntegrityPolicy(IntegrityAction(hs.integrity.action), hs.integrity.min_token_ratio),
    )
    if settings is None:
        settings = EvalSettings(
            rollouts_per_item=hs.rollouts_per_item,
            smoke_items=hs.smoke_test_items,
            candidate_timeout_s=float(hs.candidate_timeout_seconds),
            sampling=sampling_params(request, spec),
            max_concurrency=spec.execution.inference.max_concurrency,
            limits=harness_limits(spec),
            bounds=episode_bounds(spec),
            enforce_provenance=enforces_provenance(spec),
            seed=hs.seed,
        )
    if proposer is None:
        proposer = proposer_from_spec(hs.proposer, seed=hs.seed)  # a missing key / endpoint fails here, before any work
    owns_client = client is None
    if client is None:
        from whale.inference.factory import make_client

        client = make_client(spec, store, args.checkpoint)
    metrics_key = layout.metrics_key(run, phase)
    logged = [HarnessIterationMetrics.model_validate(m) for m in store.read_jsonl(metrics_key)]

    async def go(workdir: Path, local_services: dict[str, str]) -> HarnessPhaseResult:
        try:
            search = HarnessSearch(
                archive=Archive(store, args.archive),
                evaluator=CandidateEvaluator(domain, client, items, settings),
                proposer=proposer,
                incoming_code=incoming,
                skill=skill,
                allowed_imports=domain.allowed_imports,
                config=config,
                workdir=workdir,
                logged=logged,
                emit=lambda m: store.append_jsonl(
                    metrics_key, m.model_copy(update={"device": client.device}).to_wire()
                ),
                stop_requested=lambda: store.exists(layout.stop_key(run, phase)),
                progress=ProgressWriter(store, run, phase),
                workspace=prototype_files(domain, spec.experiment.data, items, incoming, local_services),
            )
            found = await search.run()
        finally:
            await proposer.aclose()  # its connections belong to this event loop, so always closed here
            if owns_client:
                await client.aclose()
        accepted_key = layout.harness_key(run, f"c{args.cycle:02d}-accepted")
        store.write_text(accepted_key, found.accepted_code)
        if found.accepted.usage is not None:
            store.write_json(
                layout.harness_usage_key(accepted_key),
                {"candidate": found.accepted.id, "usage": found.accepted.usage.to_dict()},
            )
        return HarnessPhaseResult(
            accepted_harness=accepted_key,
            accepted_candidate=found.accepted.id,
            accepted_score=float(found.accepted.score or 0.0),
            iterations=found.iterations,
            rollouts=found.rollouts,
            stopped_by=found.stopped_by,
            integrity_flags=integrity_flags(found),
            sandbox_isolation=settings.limits.isolation,
            accepted_by_iteration=[
                AcceptedHarness(
                    iteration=a.iteration, candidate=a.candidate, harness=a.harness, score=a.score, rollouts=a.rollouts
                )
                for a in found.accepted_by_iteration
            ],
        )

    # a cli agent started by the pod's proposer-agent container reads the archive copy at the same path there
    shared = os.environ.get(AGENT_EXCHANGE_ENV) if hs.proposer.backend == "cli" else None
    with tempfile.TemporaryDirectory(prefix="whale-search-", dir=shared) as tmp, contextlib.ExitStack() as services:
        local_services: dict[str, str] = {}
        if needs_local_env_service(domain, hs.proposer, os.environ):
            from whale.tools.env_service import serve_locally

            local_services["env"] = services.enter_context(
                serve_locally(
                    domain.name, items, spec.experiment.verifier.to_wire(), Path(tmp), spec.experiment.domain_options
                )
            )
        result = asyncio.run(go(Path(tmp), local_services))
    store.write_json(layout.result_key(run, phase), result.to_wire())
    log.info(
        "harness phase %s accepted %s (score %.4f) after %d iterations, %d rollouts (%s)",
        phase,
        result.accepted_candidate,
        result.accepted_score,
        result.iterations,
        result.rollouts,
        result.stopped_by,
    )
    for flag in result.integrity_flags:
        log.warning(
            "reward integrity: candidate %s %s: %s",
            flag.candidate,
            "ACCEPTED although flagged" if flag.accepted else "flagged, not accepted",
            "; ".join(flag.reasons),
        )
    return result


def integrity_flags(found: SearchResult) -> list[IntegrityFlag]:
    """The phase's flagged candidates as the result lists them."""
    return [
        IntegrityFlag(
            candidate=c.id,
            reasons=list(c.integrity_flags),
            score=c.score,
            completion_tokens_per_episode=round(c.usage.mean_completion_tokens, 3) if c.usage else None,
            episodes_without_model=c.usage.without_model if c.usage else None,
            accepted=c.id == found.accepted.id,
        )
        for c in found.flagged
    ]
