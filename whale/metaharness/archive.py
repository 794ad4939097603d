"""The Meta-Harness archive of one harness phase, in the object store.

Under ``layout.archive_prefix(run, cycle)`` (``runs/<run>/archive/cKK/``)::

    README.md                         this layout, for the proposer
    summary.json                      every candidate: status, score, mean turns, completion tokens per
                                      episode, rollouts, error, integrity flags; the best; the flagged
    summary.md                        the same as a table
    candidates/<id>/harness.py        the candidate's code (ids: i01-incoming, i02-c1, i02-c2, ...)
    candidates/<id>/meta.json         the Candidate record (status, score, error, rationale, model usage,
                                      integrity flags, ...)
    candidates/<id>/rationale.md      the proposer's short rationale
    candidates/<id>/scores.json       per-item rewards and turns of the full evaluation
    candidates/<id>/traces.jsonl      one episode per line (whale.harness.trace), full evaluation
    candidates/<id>/smoke_traces.jsonl  the smoke-test episodes
    candidates/<id>/error.txt         why it was refused / failed (validation messages, crash, timeout)
    iterations/<NN>.json              the proposer's report of iteration NN (backend, turns, tokens,
                                      seconds, notes, candidate ids) and whether the iteration is done
    iterations/<NN>-transcript.jsonl  the proposer's conversation (built-in backend) or output (CLI)

Only D_harness episodes are ever written here; the test split never is. Every file is written
whole (the store writes atomically); ``meta.json`` is written after the files it describes, so a
candidate whose meta says ``scored`` has its traces and scores. Resume reads the metas back.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from whale.metaharness.records import Candidate, summary, summary_markdown
from whale.store.base import ObjectNotFound, Store, join_key

log = logging.getLogger(__name__)

#: archive files that are rewritten during a phase (everything else is written once)
_MUTABLE = ("meta.json", "summary.json", "summary.md", "README.md", "error.txt")

README = __doc__.split("::", 1)[1].split("Only D_harness", 1)[0]
README_TEXT = (
    "# Meta-Harness archive of this harness phase\n\n"
    "Read-only for the proposer. Layout:\n\n```\n" + README.strip("\n") + "\n```\n\n"
    "Scores are success rates on the D_harness items (mean reward). Traces are JSON lines: each has "
    "`messages` (the whole conversation), `steps` (model calls, parsed actions with results, harness "
    "decisions), `reward`, `turns`, `end` and `error`.\n\n"
    "Reward integrity: a harness must earn its reward through the model's replies. The answer graded must be "
    "text the model wrote in that episode (a harness picks which reply is final and may cut the answer out of "
    "it, but an answer it writes itself scores 0; a trace step's `graded` shows what was graded). A candidate "
    "whose rewarded episodes never called the model, that submits answers the model did not write, that tells "
    "the model the answer, or whose score rises while the model's completion tokens per episode collapse "
    "against the incoming harness's, is flagged (`integrity_flags` in meta.json and summary.json, `REFUSED` in "
    "summary.md) and, by default, never accepted. Its test evaluation is checked the same way.\n"
)


class Archive:
    """Reads and writes one phase's archive under ``prefix`` in ``store``."""

    def __init__(self, store: Store, prefix: str):
        self.store = store
        self.prefix = prefix.rstrip("/")

    def key(self, *parts: str) -> str:
        key = self.prefix
        for part in parts:
            key = join_key(key, part)
        return key

    def candidate_key(self, cid: str, name: str) -> str:
        return self.key("candidates", cid, name)

    # ----- candidates ------------------------------------------------------------------------------

    def init(self) -> None:
        if not self.store.exists(self.key("README.md")):
            self.store.write_text(self.key("README.md"), README_TEXT)

    def add(self, candidate: Candidate, code: str) -> None:
        """Store a new candidate's code (and rationale), then its meta."""
        self.store.write_text(self.candidate_key(candidate.id, "harness.py"), code)
        if candidate.rationale:
            self.store.write_text(self.candidate_key(candidate.id, "rationale.md"), candidate.rationale.strip() + "\n")
        self.put(candidate)

    def put(self, candidate: Candidate) -> None:
        self.store.write_json(self.candidate_key(candidate.id, "meta.json"), candidate.to_dict())

    def code(self, cid: str) -> str:
        return self.store.read_text(self.candidate_key(cid, "harness.py"))

    def candidates(self) -> list[Candidate]:
        """Every candidate with a meta.json, in id order."""
        out = []
        for key in self.store.list(self.key("candidates")):
            if key.endswith("/meta.json"):
                data = self.store.read_json_or_none(key)
                if isinstance(data, dict):
                    out.append(Candidate.from_dict(data))
        return sorted(out, key=lambda c: (c.iteration, c.id))

    def write_error(self, cid: str, text: str) -> None:
        self.store.write_text(self.candidate_key(cid, "error.txt"), text.rstrip() + "\n")

    def write_traces(self, cid: str, episodes: Iterable[dict[str, Any]], smoke: bool = False) -> None:
        name = "smoke_traces.jsonl" if smoke else "traces.jsonl"
        body = "".join(json.dumps(e, ensure_ascii=False, sort_keys=True) + "\n" for e in episodes)
        self.store.write_text(self.candidate_key(cid, name), body)

    def write_scores(self, cid: str, scores: dict[str, Any]) -> None:
        self.store.write_json(self.candidate_key(cid, "scores.json"), scores)

    def write_summary(self, candidates: list[Candidate] | None = None, refuse_flagged: bool = False) -> None:
        """``refuse_flagged``: the phase's integrity policy refuses flagged candidates (the best excludes them)."""
        cands = self.candidates() if candidates is None else candidates
        self.store.write_json(self.key("summary.json"), summary(cands, refuse_flagged))
        self.store.write_text(self.key("summary.md"), summary_markdown(cands, refuse_flagged))

    # ----- iterations ------------------------------------------------------------------------------

    def iteration_key(self, iteration: int) -> str:
        return self.key("iterations", f"{iteration:02d}.json")

    def iteration(self, iteration: int) -> dict[str, Any] | None:
        return self.store.read_json_or_none(self.iteration_key(iteration))

    def put_iteration(self, iteration: int, record: dict[str, Any]) -> None:
        self.store.write_json(self.iteration_key(iteration), record)

    def write_transcript(self, iteration: int, lines: list[dict[str, Any]]) -> None:
        body = "".join(json.dumps(x, ensure_ascii=False, sort_keys=True, default=str) + "\n" for x in lines)
        self.store.write_text(self.key("iterations", f"{iteration:02d}-transcript.jsonl"), body)

    # ----- the proposer's view ---------------------------------------------------------------------

    def materialise(self, local_dir: Path) -> Path:
        """Bring ``local_dir`` (the proposer's view) up to date with the archive.

        Incremental: code, rationales, scores and traces are written once per candidate, so only
        new ones are fetched; the few files that change (metas, summaries, iteration records) are
        fetched every time. A phase of many candidates x 256 traces stays cheap on S3."""
        local_dir = Path(local_dir)
        local_dir.mkdir(parents=True, exist_ok=True)
        strip = len(self.prefix) + 1
        for key in self.store.list(self.prefix):
            rel = key[strip:]
            dest = local_dir / rel
            if dest.exists() and not (rel.endswith(_MUTABLE) or rel.startswith("iterations/")):
                continue
            try:
                self.store.download_file(key, dest)
            except ObjectNotFound:  # deleted between list and read
                continue
        return local_dir
