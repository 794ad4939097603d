"""Which checkpoints a finished run keeps (``spec.experiment.rsft.keepCheckpoints``): pure.

Every evaluation point and phase end writes a checkpoint (and ``checkpointEverySteps`` more), a few GB each for
a real model; once the run has succeeded only two are worth their space: the last (``status.currentCheckpoint``,
what a continuation would start from) and the best evaluation's (``status.best``, the paper's headline), plus
the final evaluation's when it is another. ``all`` keeps every one.
"""

from __future__ import annotations

from collections.abc import Iterable

from whale.core import layout
from whale.core.spec import KeepCheckpoints
from whale.core.status import WhaleRunStatus


def kept_steps(status: WhaleRunStatus) -> frozenset[int]:
    """The steps of the checkpoints ``lastAndBest`` keeps: the last, the best evaluation's, the final one's."""
    keys = [status.current_checkpoint, *(p.checkpoint for p in (status.best, status.final) if p is not None)]
    steps = {layout.parse_checkpoint_step(key.rstrip("/").rsplit("/", 1)[-1]) for key in keys if key}
    return frozenset(s for s in steps if s is not None)


def prunable(status: WhaleRunStatus, present: Iterable[int], keep: KeepCheckpoints) -> tuple[int, ...]:
    """The checkpoint steps of a Succeeded run to delete, sorted; none before it succeeds (a resumed or retried
    run may need any of them) or with ``keep: all``."""
    if keep == "all" or status.phase.value != "Succeeded":
        return ()
    kept = kept_steps(status)
    return tuple(sorted(s for s in set(present) if s not in kept))
