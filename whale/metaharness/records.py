"""The candidate record and the pure rules over an archive: acceptance, summaries, naming.

No I/O here: :mod:`whale.metaharness.archive` stores these records, the search loop
(:mod:`whale.metaharness.loop`) decides with them.

Acceptance (Meta-Harness / WHALE): the best success rate in this phase's archive; ties go to
fewer mean turns, then to the earlier candidate (so a re-proposed copy never displaces its
original, and the incoming harness wins a full tie). Under the reward-integrity policy ``reject``
(:mod:`whale.metaharness.integrity`) a candidate with integrity flags is never accepted; the
incoming harness stays eligible whatever its flags (it is the phase's fallback, already the run's
harness).
"""

from __future__ import annotations

import dataclasses
import enum
import hashlib
from collections.abc import Iterable, Sequence
from typing import Any

from whale.metaharness.integrity import ModelUsage

INCOMING_ID = "i01-incoming"


class Status(str, enum.Enum):
    """Where a candidate is in its life. Everything except PENDING is final (resume skips it)."""

    PENDING = "pending"  #: stored, not yet (fully) evaluated
    INVALID = "invalid"  #: refused by validation (syntax, imports, interface, promptOnly); never run
    SMOKE_FAILED = "smoke_failed"  #: crashed or timed out on the smoke items; never scored in full
    SCORED = "scored"  #: scored on every D_harness item
    FAILED = "failed"  #: passed the smoke test, then crashed or ran out of time in the full evaluation
    DUPLICATE = "duplicate"  #: same code as an earlier candidate (a revert); shares that one's score

    @property
    def final(self) -> bool:
        return self is not Status.PENDING


def candidate_id(iteration: int, index: int) -> str:
    """``i03-c2``: the 2nd proposal of iteration 3 (1-based both)."""
    if iteration < 1 or index < 1:
        raise ValueError(f"iteration and index are 1-based, got {iteration}, {index}")
    return f"i{iteration:02d}-c{index}"


def code_hash(code: str) -> str:
    """Content identity of a harness file (whitespace at the ends ignored)."""
    return hashlib.sha256(code.strip().encode("utf-8")).hexdigest()[:16]


@dataclasses.dataclass(frozen=True)
class Candidate:
    """One harness candidate, as ``candidates/<id>/meta.json`` holds it."""

    #: ``i01-incoming`` or ``iNN-cK``
    id: str
    iteration: int
    status: Status = Status.PENDING
    #: sha256 prefix of the code (duplicate detection)
    sha: str = ""
    #: proposer's file name / short label for the candidate
    name: str | None = None
    #: the proposer's short rationale (also in rationale.md)
    rationale: str | None = None
    #: success rate on D_harness (mean reward of all rollouts); None until scored
    score: float | None = None
    mean_turns: float | None = None
    #: rollouts spent on this candidate (smoke + full)
    rollouts: int = 0
    #: one-line reason for INVALID / SMOKE_FAILED (details in error.txt)
    error: str | None = None
    #: DUPLICATE: the earlier candidate with the same code
    same_as: str | None = None
    seconds: float = 0.0
    #: how the full evaluation used the model (None until scored)
    usage: ModelUsage | None = None
    #: reward-integrity flags, one ``[rule] message`` each (empty: none); see whale.metaharness.integrity
    integrity_flags: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out["status"] = self.status.value
        out["usage"] = self.usage.to_dict() if self.usage is not None else None
        out["integrity_flags"] = list(self.integrity_flags)
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Candidate:
        names = {f.name for f in dataclasses.fields(cls)}
        values = {k: v for k, v in data.items() if k in names}
        values["status"] = Status(values.get("status", Status.PENDING.value))
        usage = values.get("usage")
        values["usage"] = ModelUsage.from_dict(usage) if isinstance(usage, dict) else None
        values["integrity_flags"] = tuple(str(r) for r in values.get("integrity_flags") or ())
        return cls(**values)

    def with_(self, **changes: Any) -> Candidate:
        return dataclasses.replace(self, **changes)

    @property
    def has_score(self) -> bool:
        return self.status in (Status.SCORED, Status.DUPLICATE) and self.score is not None

    @property
    def flagged(self) -> bool:
        return bool(self.integrity_flags)

    def eligible(self, refuse_flagged: bool) -> bool:
        """May this candidate be accepted? Scored, and unflagged when flagged candidates are refused
        (the incoming harness always may: it is the phase's fallback)."""
        if not (self.has_score and self.status is Status.SCORED):
            return False
        return not (refuse_flagged and self.flagged and self.id != INCOMING_ID)


def _order_key(c: Candidate) -> tuple[int, int, str]:
    return (c.iteration, 0 if c.id == INCOMING_ID else 1, c.id)


def pick_best(candidates: Iterable[Candidate], refuse_flagged: bool = False) -> Candidate | None:
    """The accepted candidate: highest score, then fewer mean turns, then the earliest; with
    ``refuse_flagged``, among the candidates without integrity flags (and the incoming harness)."""
    scored = [c for c in candidates if c.eligible(refuse_flagged)]
    if not scored:
        return None
    return min(
        scored,
        key=lambda c: (-float(c.score or 0.0), float(c.mean_turns if c.mean_turns is not None else 0.0), _order_key(c)),
    )


def best_scores_by_iteration(
    candidates: Sequence[Candidate], iterations: int, refuse_flagged: bool = False
) -> list[float]:
    """``b_i`` for i = 1..iterations: the archive's best score after iteration i (0.0 before any)."""
    out: list[float] = []
    for i in range(1, iterations + 1):
        best = pick_best((c for c in candidates if c.iteration <= i), refuse_flagged)
        out.append(float(best.score) if best is not None and best.score is not None else 0.0)
    return out


def summary(candidates: Sequence[Candidate], refuse_flagged: bool = False) -> dict[str, Any]:
    """The archive's summary.json: one row per candidate (ordered), the current best and the flagged."""
    rows = sorted(candidates, key=_order_key)
    best = pick_best(rows, refuse_flagged)
    return {
        "best": best.id if best else None,
        "best_score": best.score if best else None,
        "flagged_refused": refuse_flagged,
        "flagged": [c.id for c in rows if c.flagged],
        "candidates": [
            {
                "id": c.id,
                "iteration": c.iteration,
                "status": c.status.value,
                "score": c.score,
                "mean_turns": c.mean_turns,
                "rollouts": c.rollouts,
                "error": c.error,
                "same_as": c.same_as,
                "name": c.name,
                "rationale": (c.rationale or "")[:200] or None,
                "completion_tokens_per_episode": round(c.usage.mean_completion_tokens, 1) if c.usage else None,
                "episodes_without_model": c.usage.without_model if c.usage else None,
                "integrity_flags": list(c.integrity_flags),
            }
            for c in rows
        ],
    }


def summary_markdown(candidates: Sequence[Candidate], refuse_flagged: bool = False) -> str:
    """The same summary as a table, for a proposer that reads files."""
    data = summary(candidates, refuse_flagged)
    lines = [
        "# Harness candidates of this phase",
        "",
        f"Best so far: {data['best']} (score {data['best_score']})",
        "",
        "| id | status | score | mean turns | tokens/episode | rollouts | note |",
        "|---|---|---|---|---|---|---|",
    ]
    for row in data["candidates"]:
        score = "" if row["score"] is None else f"{row['score']:.4f}"
        turns = "" if row["mean_turns"] is None else f"{row['mean_turns']:.2f}"
        tokens = "" if row["completion_tokens_per_episode"] is None else f"{row['completion_tokens_per_episode']:.1f}"
        note = row["error"] or (f"same code as {row['same_as']}" if row["same_as"] else (row["rationale"] or ""))
        if row["integrity_flags"]:
            verdict = "REFUSED" if refuse_flagged and row["id"] != INCOMING_ID else "flagged"
            note = f"{verdict} (reward without the model): {row['integrity_flags'][0]}"
        note = note.replace("|", "/").replace("\n", " ")[:240]
        lines.append(f"| {row['id']} | {row['status']} | {score} | {turns} | {tokens} | {row['rollouts']} | {note} |")
    if data["flagged"]:
        lines += [
            "",
            f"Flagged for reward integrity: {', '.join(data['flagged'])}. A harness must earn its reward through "
            "the model's replies; one that answers without calling the model (or while the model's output "
            "collapses) is " + ("never accepted." if refuse_flagged else "flagged in the results."),
        ]
    return "\n".join(lines) + "\n"
