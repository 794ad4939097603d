"""How one RSFT step's kept sequences become optimiser updates: the one formula the trainers follow
(:func:`whale.rsft.collate.update_groups`), `whale plan` prints and the schedule accounts for.

Pure arithmetic, standard library only (no pydantic): the trainer imports it where only torch is installed.
"""

from __future__ import annotations

from typing import Literal

#: what ``rsft.miniBatchSize`` counts (see :func:`optimizer_updates`)
MiniBatchScope = Literal["perRank", "global"]


def optimizer_updates(
    sequences: int, *, ranks: int, mini_batch_size: int, sft_epochs: int, scope: MiniBatchScope
) -> int:
    """Optimiser updates one RSFT step makes on ``sequences`` kept training sequences (one per kept
    trajectory by default; more with ``rsft.sequences: turn`` where the template rewrites history) with ``ranks`` data-parallel ranks.

    ``perRank`` (the paper's verl, which shards the batch over the ranks before the minibatch split):
    each rank holds ceil(sequences / ranks) of them and cuts them into minibatches of ``mini_batch_size``;
    the ranks step together, so one update covers up to ranks x mini_batch_size sequences:
    ``sft_epochs x ceil(ceil(sequences / ranks) / mini_batch_size)``.
    ``global``: minibatches of ``mini_batch_size`` over all ranks: ``sft_epochs x ceil(sequences / mini_batch_size)``.
    No sequence, no update."""
    if sequences <= 0:
        return 0
    if ranks < 1 or mini_batch_size < 1 or sft_epochs < 0:
        raise ValueError(
            f"ranks ({ranks}) and miniBatchSize ({mini_batch_size}) must be >= 1, sftEpochs ({sft_epochs}) >= 0"
        )
    if scope == "perRank":
        per_rank = -(-sequences // ranks)
        return sft_epochs * -(-per_rank // mini_batch_size)
    if scope == "global":
        return sft_epochs * -(-sequences // mini_batch_size)
    raise ValueError(f"rsft.miniBatchScope: unknown value {scope!r}; use perRank or global")
