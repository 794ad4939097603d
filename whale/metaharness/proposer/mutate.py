"""Blind-search proposer (backend ``mutate``): no model, no key. Each candidate is the incoming harness with 1 or 2
of its declared knobs changed at random (:mod:`whale.metaharness.mutate`), drawn from a generator seeded by
(``spec.experiment.harnessSearch.seed``, the iteration, the incoming harness), so a run's search is reproducible. It writes the
``proposalsPerIteration`` candidates the LLM proposers write, under the same iterations: the baseline an LLM
proposer must beat."""

from __future__ import annotations

import hashlib
import random

from whale.metaharness.mutate import mutate
from whale.metaharness.proposer.base import Proposal, ProposalRequest, Proposer, ProposerReport


class MutateProposer(Proposer):
    backend = "mutate"

    def __init__(self, seed: int | None = 0):
        #: None: unseeded (a fresh draw every run)
        self.seed = seed

    def _rng(self, request: ProposalRequest) -> random.Random:
        if self.seed is None:
            return random.Random()
        digest = hashlib.blake2b(request.incoming_code.encode("utf-8"), digest_size=8).hexdigest()
        return random.Random(f"mutate:{self.seed}:{request.iteration}:{digest}")

    async def propose(self, request: ProposalRequest) -> ProposerReport:
        rng = self._rng(request)
        report = ProposerReport(stopped_by="finish")
        seen = {request.incoming_code}
        for j in range(request.count):
            for _ in range(4):  # a draw equal to the incoming or an earlier candidate is drawn again
                m = mutate(request.incoming_code, rng)
                if m is None or m.code not in seen:
                    break
            if m is None:
                report.notes.append("the incoming harness declares no literal knob (class constants) to mutate")
                break
            if m.code in seen:
                continue
            seen.add(m.code)
            report.proposals.append(
                Proposal(f"mutate-i{request.iteration}-{j + 1}", m.code, "blind mutation: " + "; ".join(m.changes))
            )
        return report
