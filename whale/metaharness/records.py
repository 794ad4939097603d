"""The candidate record and the pure rules over an archive: acceptance, summaries, naming.

No I/O here: :mod:`whale.metaharness.archive` stores these records, the search loop
(:mod:`whale.metaharness.loop`) decides with them.

Acceptance (Meta-Harness / WHALE): the best success rate in this phase's archive; ties go to
fewer mean turns, then to the earlier candidate (so a re-proposed copy never displaces its
original, and the incoming harness wins a full tie).
"""

from __future__ import annotations

import dataclasses
import enum
import hashlib
from collections.abc import Iterable, Sequence
from typing import Any

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

    def to_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out["status"] = self.status.value
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Candidate:
        names = {f.name for f in dataclasses.fields(cls)}
        values = {k: v for k, v in data.items() if k in names}
        values["status"] = Status(values.get("status", Status.PENDING.value))
        return cls(**values)

    def with_(self, **changes: Any) -> Candidate:
        return dataclasses.replace(self, **changes)

    @property
    def has_score(self) -> bool:
        return self.status in (Status.SCORED, Status.DUPLICATE) and self.score is not None


def _order_key(c: Candidate) -> tuple[int, int, str]:
    return (c.iteration, 0 if c.id == INCOMING_ID else 1, c.id)


def pick_best(candidates: Iterable[Candidate]) -> Candidate | None:
    """The accepted candidate: highest score, then fewer mean turns, then the earliest."""
    scored = [c for c in candidates if c.has_score and c.status is Status.SCORED]
    if not scored:
        return None
    return min(
        scored,
        key=lambda c: (-float(c.score or 0.0), float(c.mean_turns if c.mean_turns is not None else 0.0), _order_key(c)),
    )


def best_scores_by_iteration(candidates: Sequence[Candidate], iterations: int) -> list[float]:
    """``b_i`` for i = 1..iterations: the archive's best score after iteration i (0.0 before any)."""
    out: list[float] = []
    for i in range(1, iterations + 1):
        best = pick_best(c for c in candidates if c.iteration <= i)
        out.append(float(best.score) if best is not None and best.score is not None else 0.0)
    return out


def summary(candidates: Sequence[Candidate]) -> dict[str, Any]:
    """The archive's summary.json: one row per candidate (ordered) and the current best."""
    rows = sorted(candidates, key=_order_key)
    best = pick_best(rows)
    return {
        "best": best.id if best else None,
        "best_score": best.score if best else None,
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
            }
            for c in rows
        ],
    }


def summary_markdown(candidates: Sequence[Candidate]) -> str:
    """The same summary as a table, for a proposer that reads files."""
    data = summary(candidates)
    lines = [
        "# Harness candidates of this phase",
        "",
        f"Best so far: {data['best']} (score {data['best_score']})",
        "",
        "| id | status | score | mean turns | rollouts | note |",
        "|---|---|---|---|---|---|",
    ]
    for row in data["candidates"]:
        score = "" if row["score"] is None else f"{row['score']:.4f}"
        turns = "" if row["mean_turns"] is None else f"{row['mean_turns']:.2f}"
        note = row["error"] or (f"same code as {row['same_as']}" if row["same_as"] else (row["rationale"] or ""))
        note = note.replace("|", "/").replace("\n", " ")[:160]
        lines.append(f"| {row['id']} | {row['status']} | {score} | {turns} | {row['rollouts']} | {note} |")
    return "\n".join(lines) + "\n"
