"""One observer of a run's store, for both controllers (the store is the truth; see docs/storage.md)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from whale.core import layout
from whale.core.alternation import Child, Observations
from whale.core.spec import WhaleRunStatus
from whale.store import Store


class StoreObserver:
    """Reads what the workloads of one run wrote, as ``decide()`` observations.

    Reads only what can still change the status: the result of each phase not yet absorbed into it
    (a finished phase's result is never re-read), the running main phase's metrics lines, and the
    complete checkpoints — cached, since a complete checkpoint never changes."""

    def __init__(self, store: Store, run: str):
        self.store = store
        self.run = run
        self._complete: set[int] = set()

    def results(self, status: WhaleRunStatus) -> dict[str, dict[str, Any]]:
        """result.json of every phase not yet absorbed into ``status``."""
        absorbed = set(status.completed_phases) | {e.phase for e in status.evals if e.mean_at_k is not None}
        out: dict[str, dict[str, Any]] = {}
        for entry in self.store.list(layout.phases_prefix(self.run), recursive=False):
            phase = entry.rstrip("/").rsplit("/", 1)[-1]
            if phase in absorbed:
                continue
            raw = self.store.read_json_or_none(layout.result_key(self.run, phase))
            if raw is not None:
                out[phase] = raw
        return out

    def metrics(self, status: WhaleRunStatus) -> dict[str, list[dict[str, Any]]]:
        """The metrics lines of the running main phase (the only ones ``decide`` reads)."""
        if not status.active_phase:
            return {}
        return {status.active_phase: self.store.read_jsonl(layout.metrics_key(self.run, status.active_phase))}

    def checkpoints(self) -> frozenset[int]:
        """Steps with a COMPLETE checkpoint."""
        for entry in self.store.list(layout.checkpoints_prefix(self.run) + "/", recursive=False):
            step = layout.parse_checkpoint_step(entry.rstrip("/").rsplit("/", 1)[-1])
            if (
                step is not None
                and step not in self._complete
                and self.store.exists(layout.checkpoint_complete_key(self.run, step))
            ):
                self._complete.add(step)
        return frozenset(self._complete)

    def observe(
        self,
        status: WhaleRunStatus,
        children: Mapping[str, Child],
        split_sizes: Mapping[str, int],
        now: str,
        generation: int | None = None,
    ) -> Observations:
        """Everything ``decide`` needs, with the controller's view of the children."""
        return Observations(
            run=self.run,
            children=dict(children),
            results=self.results(status),
            metrics=self.metrics(status),
            checkpoints=self.checkpoints(),
            split_sizes=dict(split_sizes),
            now=now,
            generation=generation,
        )
