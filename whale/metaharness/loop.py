"""The Meta-Harness search loop of one harness phase.

Iteration 1 re-evaluates the incoming harness (scored in full, no smoke gate: it is the harness
the phase must be able to fall back to). Every later iteration asks the proposer for
``proposals_per_iteration`` candidates — giving it, besides the archive copy, the sandboxed tools of
:mod:`whale.metaharness.proposer.tools`: ``run_candidate`` (through this phase's evaluator, on D_harness
items only; its rollouts are added to the iteration's) and ``run_shell`` — and puts each through:
duplicate check (same code as an earlier candidate = a revert, shares its score, costs nothing) →
validation (size, syntax, the runtime's validator, promptOnly) → smoke test → full score → reward-integrity check
(:mod:`whale.metaharness.integrity`: model usage against the incoming harness's; a flagged candidate
is recorded as such and, under the default policy, never accepted). After each iteration one
:class:`~whale.core.protocol.HarnessIterationMetrics` line is emitted, naming the accepted (best-so-far)
candidate and its harness file (mh_only evaluates each new one on the test split); the stop rule
(:func:`whale.core.adaptive.harness_should_stop`) and a stop request are checked between iterations.
Iterations here are archive iterations: the incoming re-evaluation is iteration 1, so
``SearchConfig.iterations`` is the proposer iterations + 1.

Resume: everything lives in the archive. Candidates with a final status are never run again;
iterations already in the metrics file are not repeated; an iteration whose proposer already ran
evaluates its stored candidates instead of asking again.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import shutil
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from pathlib import Path

from whale.core.adaptive import harness_should_stop
from whale.core.protocol import CandidateScore, HarnessIterationMetrics, HarnessStopRule, PhaseProgress, ProgressStage
from whale.metaharness.archive import Archive
from whale.metaharness.evaluate import CandidateEvaluator, RunOutcome
from whale.metaharness.integrity import IntegrityPolicy, integrity_flags, model_usage
from whale.metaharness.proposer.base import (
    CANDIDATES_DIR,
    ProposalRequest,
    Proposer,
    ProposerError,
    ProposerReport,
    ProposerUnavailable,
)
from whale.metaharness.proposer.tools import (
    TRYOUT_CALLS,
    CandidateTrials,
    HarnessTryouts,
    ProposerTools,
    SandboxShell,
)
from whale.metaharness.records import INCOMING_ID, Candidate, Status, candidate_id, code_hash, pick_best
from whale.metaharness.validate import candidate_problems

log = logging.getLogger(__name__)


class SearchError(RuntimeError):
    """The phase cannot go on (e.g. the incoming harness itself does not run)."""


@dataclasses.dataclass(frozen=True)
class SearchConfig:
    """Knobs of one harness phase (from the PhaseRequest and spec.experiment.harnessSearch)."""

    #: iterations including the incoming re-evaluation (the maximum when ``stop_rule`` is set)
    iterations: int
    proposals_per_iteration: int = 3
    #: FST baseline: only the two prompt constants may change
    prompt_only: bool = False
    stop_rule: HarnessStopRule | None = None
    proposer_timeout_s: float = 2400.0
    proposer_max_turns: int = 40
    proposer_max_tokens: int = 200_000
    #: D_harness rollouts the proposer's run_candidate tool may spend per iteration (0: no such tool)
    proposer_trial_rollouts: int = 0
    #: offer the proposer the sandboxed run_shell tool
    proposer_shell: bool = True
    #: try_harness calls the built-in proposers may make per iteration (scripted replies, real tools, no grade,
    #: no rollout: the prototyping the reference's skills require; 0: no such tool)
    proposer_tryout_calls: int = TRYOUT_CALLS
    #: spec.experiment.harnessSearch.integrity: flag candidates that score without the model; refuse them by default
    integrity: IntegrityPolicy = IntegrityPolicy()

    def __post_init__(self) -> None:
        if self.iterations < 1:
            raise ValueError(f"iterations must be >= 1 (the incoming re-evaluation counts), got {self.iterations}")


@dataclasses.dataclass(frozen=True)
class Acceptance:
    """An iteration after which the accepted (best-so-far) candidate was a new one."""

    iteration: int
    candidate: str
    #: store key of the candidate's harness file in the archive
    harness: str
    score: float
    #: rollouts the phase had spent by the end of this iteration
    rollouts: int


@dataclasses.dataclass(frozen=True)
class SearchResult:
    accepted: Candidate
    accepted_code: str
    iterations: int
    rollouts: int
    #: iterations | patience | stop-request
    stopped_by: str
    best_scores: list[float]
    #: every candidate of the phase with integrity flags (the accepted one among them only under ``flag``)
    flagged: list[Candidate] = dataclasses.field(default_factory=list)
    #: each iteration whose accepted candidate was new, in order; the last one is ``accepted``
    accepted_by_iteration: list[Acceptance] = dataclasses.field(default_factory=list)


class HarnessSearch:
    """One phase's search over ``archive``; I/O through the archive, the evaluator and the proposer."""

    def __init__(
        self,
        *,
        archive: Archive,
        evaluator: CandidateEvaluator,
        proposer: Proposer,
        incoming_code: str,
        skill: str,
        allowed_imports: Collection[str],
        config: SearchConfig,
        workdir: Path,
        logged: Sequence[HarnessIterationMetrics] = (),
        emit: Callable[[HarnessIterationMetrics], None] | None = None,
        stop_requested: Callable[[], bool] | None = None,
        progress: Callable[[PhaseProgress], None] | None = None,
        workspace: Mapping[str, str] | None = None,
    ):
        """``workspace``: files for the proposer's workspace (the prototyping kit, ``ProposalRequest.workspace``)."""
        self.archive = archive
        self.workspace = dict(workspace or {})
        self.evaluator = evaluator
        self.proposer = proposer
        self.incoming_code = incoming_code
        self.skill = skill
        self.allowed_imports = tuple(sorted(allowed_imports))
        self.config = config
        self.workdir = Path(workdir)
        self.logged = {m.iteration: m for m in logged}
        self.emit = emit or (lambda m: None)
        self.stop_requested = stop_requested or (lambda: False)
        #: hears where the phase is (proposing, scoring candidate i of n): for people watching
        self.progress = progress or (lambda p: None)

    # ----- the loop ----------------------------------------------------------------------------------

    async def run(self) -> SearchResult:
        self.archive.init()
        self.workdir.mkdir(parents=True, exist_ok=True)
        best_scores: list[float] = []
        rollouts = 0
        stopped_by = "iterations"
        rule = self.config.stop_rule
        done = 0
        history: list[Acceptance] = []
        for it in range(1, self.config.iterations + 1):
            if it > 1 and self.stop_requested():
                stopped_by = "stop-request"
                break
            metrics = self.logged.get(it)
            if metrics is None:
                started = time.monotonic()
                if it == 1:
                    await self._incoming()
                else:
                    await self._iteration(it)
                metrics = self._metrics(it, time.monotonic() - started)
                self.emit(metrics)
                record = self.archive.iteration(it) or {"iteration": it}
                self.archive.put_iteration(it, {**record, "complete": True})
            done = it
            rollouts += metrics.rollouts
            best_scores.append(metrics.best_score)
            if metrics.best_candidate and (not history or history[-1].candidate != metrics.best_candidate):
                history.append(
                    Acceptance(
                        it, metrics.best_candidate, self._label(metrics.best_candidate), metrics.best_score, rollouts
                    )
                )
            if rule is not None and harness_should_stop(best_scores, rule):
                stopped_by = "iterations" if it >= rule.max_iterations else "patience"
                break
        candidates = self.archive.candidates()
        # only finished iterations count: a later iteration's candidates (proposed before a stop request
        # ended the phase on resume) were never part of an iteration's metrics
        best = pick_best((c for c in candidates if c.iteration <= done), self._refuse_flagged)
        if best is None:
            raise SearchError("no candidate of this phase was scored, not even the incoming harness")
        flagged = [c for c in candidates if c.flagged and c.status is not Status.DUPLICATE]
        return SearchResult(best, self.archive.code(best.id), done, rollouts, stopped_by, best_scores, flagged, history)

    @property
    def _refuse_flagged(self) -> bool:
        return self.config.integrity.refuses_flagged

    def _write_summary(self) -> None:
        self.archive.write_summary(refuse_flagged=self._refuse_flagged)

    def _metrics(self, it: int, seconds: float) -> HarnessIterationMetrics:
        """``seconds``: this attempt's wall time of the iteration (a resumed iteration counts only its last attempt)."""
        candidates = self.archive.candidates()
        best = pick_best((c for c in candidates if c.iteration <= it), self._refuse_flagged)
        mine = [c for c in candidates if c.iteration == it]
        return HarnessIterationMetrics(
            iteration=it,
            best_score=float(best.score) if best and best.score is not None else 0.0,
            best_candidate=best.id if best else "",
            best_harness=self._label(best.id) if best else None,
            candidates=[
                CandidateScore(
                    id=c.id,
                    score=c.score,
                    mean_turns=c.mean_turns,
                    error=c.error,
                    integrity_flags=list(c.integrity_flags),
                )
                for c in mine
            ],
            # the proposer's run_candidate rollouts are this iteration's too (never the test split's)
            rollouts=sum(c.rollouts for c in mine) + int((self.archive.iteration(it) or {}).get("trial_rollouts", 0)),
            seconds=round(seconds, 3),
        )

    # ----- iteration 1: the incoming harness -------------------------------------------------------

    async def _incoming(self) -> None:
        existing = {c.id: c for c in self.archive.candidates()}
        cand = existing.get(INCOMING_ID)
        if cand is None:
            cand = Candidate(
                id=INCOMING_ID,
                iteration=1,
                sha=code_hash(self.incoming_code),
                name="incoming",
                rationale="The harness this phase started from (re-evaluated under the current weights).",
            )
            self.archive.add(cand, self.incoming_code)
        if cand.status is Status.SCORED:
            return  # a FAILED incoming (infrastructure down last attempt) is evaluated again
        path = self._local_file(cand.id, self.incoming_code)
        self.progress(
            PhaseProgress(
                stage=ProgressStage.SCORING, iteration=1, candidate=cand.id, done=0, total=1, unit="candidates"
            )
        )
        t0 = time.monotonic()
        full = await self.evaluator.score(path, self._label(cand.id))
        seconds = time.monotonic() - t0
        self.archive.write_traces(cand.id, (e.to_dict() for e in full.episodes))
        self.archive.write_scores(cand.id, full.per_item())
        if full.error is not None:
            self.archive.write_error(cand.id, full.error)
            self.archive.put(
                cand.with_(status=Status.FAILED, error=full.error, rollouts=full.rollouts, seconds=seconds)
            )
            self._write_summary()
            raise SearchError(f"the incoming harness does not run: {full.error}")
        failed = [e for e in full.episodes if e.error]
        if full.episodes and len(failed) == len(full.episodes):
            # not a score of 0: the model server or the harness is down; fail (and be retried) instead
            self.archive.put(
                cand.with_(status=Status.FAILED, error=failed[0].error, rollouts=full.rollouts, seconds=seconds)
            )
            self._write_summary()
            raise SearchError(
                f"every episode of the incoming harness failed, e.g. {failed[0].error}; "
                "check the inference server and the harness"
            )
        scored = self._checked(
            cand.with_(
                status=Status.SCORED,
                score=full.score,
                mean_turns=full.mean_turns,
                rollouts=full.rollouts,
                seconds=seconds,
            ),
            full,
            incoming=None,
        )
        self.archive.put(scored)
        self._write_summary()

    # ----- later iterations ------------------------------------------------------------------------

    async def _iteration(self, it: int) -> None:
        record = self.archive.iteration(it)
        if record is None or not record.get("proposed"):
            self.progress(PhaseProgress(stage=ProgressStage.PROPOSING, iteration=it))
            await self._propose(it)
        mine = [c for c in self.archive.candidates() if c.iteration == it]
        for index, cand in enumerate(mine):
            if not cand.status.final:
                self.progress(
                    PhaseProgress(
                        stage=ProgressStage.SCORING,
                        iteration=it,
                        candidate=cand.id,
                        done=index,
                        total=len(mine),
                        unit="candidates",
                    )
                )
                await self._evaluate(cand)
                self._write_summary()

    async def _propose(self, it: int) -> None:
        archive_dir = self.archive.materialise(self.workdir / "archive")  # kept across iterations
        scratch = self.workdir / f"iter{it:02d}" / "scratch"
        shutil.rmtree(scratch, ignore_errors=True)
        scratch.mkdir(parents=True)
        tools = self._tools(archive_dir, scratch)
        request = ProposalRequest(
            iteration=it,
            count=self.config.proposals_per_iteration,
            archive_dir=archive_dir,
            scratch_dir=scratch,
            skill=self.skill,
            incoming_code=self.incoming_code,
            incoming_id=INCOMING_ID,
            prompt_only=self.config.prompt_only,
            allowed_imports=self.allowed_imports,
            timeout_s=self.config.proposer_timeout_s,
            max_turns=self.config.proposer_max_turns,
            max_tokens=self.config.proposer_max_tokens,
            tools=tools,
            isolation=self.evaluator.settings.limits.isolation,
            workspace=self.workspace,
        )
        try:
            # the backend enforces its own budget; this outer bound only catches a backend that hangs
            report = await asyncio.wait_for(self.proposer.propose(request), self.config.proposer_timeout_s + 60)
        except TimeoutError:
            report = ProposerReport(stopped_by="timeout", notes=["the proposer did not return within its timeout"])
        except ProposerUnavailable as exc:  # fail closed: no iteration goes on without its proposer
            raise SearchError(f"iteration {it}: {exc}") from None
        except ProposerError as exc:
            report = ProposerReport(stopped_by="error", notes=[str(exc)])
        except Exception as exc:  # a proposer bug must not end the phase; recorded in the archive
            log.exception("proposer failed in iteration %d", it)
            report = ProposerReport(stopped_by="error", notes=[f"proposer crashed: {type(exc).__name__}: {exc}"])
        ids = []
        for index, proposal in enumerate(report.proposals, start=1):
            cid = candidate_id(it, index)
            ids.append(cid)
            self.archive.add(
                Candidate(
                    id=cid,
                    iteration=it,
                    sha=code_hash(proposal.code),
                    name=proposal.name,
                    rationale=proposal.rationale.strip() or None,
                ),
                proposal.code,
            )
        self.archive.write_transcript(it, report.transcript)
        trials = tools.trials
        # counted from the tool itself, whatever the backend reported (or if it crashed)
        report.trial_rollouts = trials.rollouts if trials is not None else 0
        self.archive.put_iteration(
            it,
            {
                "iteration": it,
                "backend": self.proposer.backend,
                "proposed": True,
                "complete": False,
                "candidates": ids,
                **report.to_record(),
                "trials": trials.log if trials is not None else [],
                "tryouts": tools.tryouts.log if tools.tryouts is not None else [],
            },
        )
        for note in report.notes:
            log.info("iteration %d proposer: %s", it, note)

    def _tools(self, archive_dir: Path, scratch: Path) -> ProposerTools:
        """The sandboxed tools of one proposer call: run_candidate and try_harness over this phase's evaluator
        (its D_harness items, the static gate of :meth:`_judge`), run_shell over the archive copy."""

        def check(code: str) -> list[str]:  # the static gate every candidate passes, for the agent's own tries too
            return candidate_problems(
                code,
                incoming=self.incoming_code,
                allowed_imports=self.allowed_imports,
                prompt_only=self.config.prompt_only,
            )

        trials = None
        if self.config.proposer_trial_rollouts > 0:
            trials = CandidateTrials(
                self.evaluator,
                check=check,
                budget=self.config.proposer_trial_rollouts,
                call_timeout_s=self.evaluator.settings.candidate_timeout_s,
                workdir=self.workdir,
            )
        tryouts = None
        if self.config.proposer_tryout_calls > 0:
            tryouts = HarnessTryouts(
                self.evaluator,
                check=check,
                calls=self.config.proposer_tryout_calls,
                workdir=self.workdir,
            )
        shell = None
        if self.config.proposer_shell:
            limits = self.evaluator.settings.limits
            # on a cluster the commands run on the run's harness host (the search pod starts no sandbox itself)
            shell = SandboxShell(archive_dir, scratch / CANDIDATES_DIR, isolation=limits.isolation, host=limits.host)
        return ProposerTools(trials=trials, shell=shell, tryouts=tryouts)

    async def _evaluate(self, cand: Candidate) -> None:
        t0 = time.monotonic()
        final = await self._judge(cand)
        self.archive.put(final.with_(seconds=round(time.monotonic() - t0, 3)))

    async def _judge(self, cand: Candidate) -> Candidate:
        """Duplicate check → validation → smoke → full score; returns the final record."""
        code = self.archive.code(cand.id)
        earlier = [
            c
            for c in self.archive.candidates()
            if c.id != cand.id and c.status.final and c.sha == cand.sha and c.status is not Status.DUPLICATE
        ]
        if earlier:
            orig = earlier[0]
            return cand.with_(
                status=Status.DUPLICATE,
                same_as=orig.id,
                score=orig.score,
                mean_turns=orig.mean_turns,
                error=orig.error,
                usage=orig.usage,
                integrity_flags=orig.integrity_flags,
            )
        problems = candidate_problems(
            code, incoming=self.incoming_code, allowed_imports=self.allowed_imports, prompt_only=self.config.prompt_only
        )
        if problems:
            self.archive.write_error(cand.id, "\n".join(problems))
            return cand.with_(status=Status.INVALID, error=problems[0][:500])
        path = self._local_file(cand.id, code)
        smoke = await self.evaluator.smoke(path, self._label(cand.id))
        self.archive.write_traces(cand.id, (e.to_dict() for e in smoke.episodes), smoke=True)
        if smoke.error is not None:
            self.archive.write_error(cand.id, f"smoke test failed: {smoke.error}")
            return cand.with_(status=Status.SMOKE_FAILED, error=f"smoke: {smoke.error}"[:500], rollouts=smoke.rollouts)
        full = await self.evaluator.score(path, self._label(cand.id))
        self.archive.write_traces(cand.id, (e.to_dict() for e in full.episodes))
        self.archive.write_scores(cand.id, full.per_item())
        rollouts = smoke.rollouts + full.rollouts
        if full.error is not None:
            self.archive.write_error(cand.id, f"full evaluation failed: {full.error}")
            return cand.with_(status=Status.FAILED, error=full.error[:500], rollouts=rollouts)
        incoming = next((c for c in self.archive.candidates() if c.id == INCOMING_ID), None)
        return self._checked(
            cand.with_(status=Status.SCORED, score=full.score, mean_turns=full.mean_turns, rollouts=rollouts),
            full,
            incoming,
        )

    def _checked(self, cand: Candidate, full: RunOutcome, incoming: Candidate | None) -> Candidate:
        """``cand`` (scored) with its model usage and reward-integrity flags against the incoming harness."""
        usage = model_usage(full.episodes)
        flags = integrity_flags(
            usage,
            full.score,
            baseline=incoming.usage if incoming is not None else None,
            baseline_score=incoming.score if incoming is not None else None,
            policy=self.config.integrity,
        )
        if flags:
            log.warning(
                "candidate %s flagged for reward integrity (%s): %s",
                cand.id,
                self.config.integrity.action.value,
                "; ".join(flags),
            )
        return cand.with_(usage=usage, integrity_flags=flags)

    # ----- helpers -----------------------------------------------------------------------------------

    def _local_file(self, cid: str, code: str) -> Path:
        path = self.workdir / "candidates" / f"{cid}.py"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(code, encoding="utf-8")
        return path

    def _label(self, cid: str) -> str:
        return self.archive.candidate_key(cid, "harness.py")
