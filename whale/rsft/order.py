"""The order in which an RSFT run visits the prompts of D_weight: seeded, epoch-aware, resumable.

The prompts form one endless stream: epoch 0's permutation of D_weight, then epoch 1's, and so on,
each permutation drawn from ``(seed, epoch)`` alone. Global step ``s`` takes the stream's slots
``[s * k, (s + 1) * k)`` for ``k = promptsPerStep``. The whole order is therefore a pure function
of (dataset size, seed, promptsPerStep, step): a phase that was killed and restarted at its last
checkpoint's step sees exactly the prompts the uninterrupted run would have seen, and a later
phase of the same run continues the stream where the earlier one stopped. Pure: no I/O.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from functools import lru_cache


@dataclass(frozen=True)
class PromptSlot:
    """One prompt of one step: which epoch of the stream it belongs to and the item's index."""

    epoch: int
    index: int


@lru_cache(maxsize=8)
def epoch_permutation(size: int, seed: int, epoch: int) -> tuple[int, ...]:
    """The permutation of ``range(size)`` used in ``epoch`` (a string seed: stable across Pythons)."""
    if size < 1:
        raise ValueError(f"D_weight is empty (size {size}): the weight phase needs at least one prompt")
    order = list(range(size))
    random.Random(f"whale-rsft-order:{seed}:{epoch}").shuffle(order)
    return tuple(order)


@dataclass(frozen=True)
class PromptOrder:
    """The prompt stream of one run. ``size`` = |D_weight|, ``per_step`` = promptsPerStep."""

    size: int
    per_step: int
    seed: int = 0

    def __post_init__(self) -> None:
        if self.size < 1:
            raise ValueError(f"D_weight is empty (size {self.size}): the weight phase needs at least one prompt")
        if self.per_step < 1:
            raise ValueError(f"promptsPerStep must be >= 1, got {self.per_step}")

    def cursor(self, step: int) -> int:
        """Stream position before global step ``step`` (0-based: step 0 is the first RSFT step)."""
        if step < 0:
            raise ValueError(f"step must be >= 0, got {step}")
        return step * self.per_step

    def slots(self, step: int) -> list[PromptSlot]:
        """The prompts of global step ``step`` (the (step+1)-th RSFT step of the run)."""
        start = self.cursor(step)
        out: list[PromptSlot] = []
        for pos in range(start, start + self.per_step):
            epoch, offset = divmod(pos, self.size)
            out.append(PromptSlot(epoch, epoch_permutation(self.size, self.seed, epoch)[offset]))
        return out

    def indices(self, step: int) -> list[int]:
        return [slot.index for slot in self.slots(step)]

    def epochs_done(self, steps_done: int) -> float:
        """Epochs of D_weight consumed after ``steps_done`` steps."""
        return self.cursor(steps_done) / self.size
