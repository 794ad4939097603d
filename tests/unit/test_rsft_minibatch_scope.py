"""Per-rank vs global mini-batches: the one formula (``optimizer_updates``), the split both trainers
train on (``update_groups``), and the figure ``whale plan`` prints for the paper's twelve runs."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import yaml

from tests.fixtures.specs import flat
from whale.core.batching import optimizer_updates
from whale.core.schedule import optimizer_updates_per_step
from whale.core.spec import WhaleRunSpec
from whale.rsft.collate import Example, update_groups
from whale.rsft.config import RSFTConfig

EXAMPLES = Path(__file__).resolve().parents[2] / "manifests" / "examples"


@pytest.mark.parametrize(
    "sequences,ranks,mini,epochs,scope,expected",
    [
        # the paper: ~1024 of 2048 rollouts kept, 8 ranks, 64 per rank -> about 2 updates per RSFT step
        (1024, 8, 64, 1, "perRank", 2),
        (1024, 8, 64, 1, "global", 16),  # the same 64 over all ranks: 8x the AdamW steps
        (2048, 8, 64, 1, "perRank", 4),  # every rollout kept: the upper bound
        (2048, 4, 64, 1, "perRank", 8),
        (1025, 8, 64, 1, "perRank", 3),  # one sequence more: a rank holds 129 -> a third update
        (10, 2, 2, 2, "perRank", 6),  # 2 epochs x ceil(5 / 2)
        (10, 2, 2, 2, "global", 10),  # 2 epochs x ceil(10 / 2)
        (10, 1, 2, 1, "perRank", 5),  # one rank: the scopes agree
        (10, 1, 2, 1, "global", 5),
        (3, 8, 64, 1, "perRank", 1),  # fewer sequences than ranks: still one update
        (0, 8, 64, 1, "perRank", 0),  # nothing kept, nothing trained
    ],
)
def test_optimizer_updates_formula(sequences, ranks, mini, epochs, scope, expected):
    assert optimizer_updates(sequences, ranks=ranks, mini_batch_size=mini, sft_epochs=epochs, scope=scope) == expected


def test_a_bad_scope_or_count_is_a_clear_error():
    with pytest.raises(ValueError, match="miniBatchScope"):
        optimizer_updates(4, ranks=1, mini_batch_size=2, sft_epochs=1, scope="perGpu")
    with pytest.raises(ValueError, match="ranks"):
        optimizer_updates(4, ranks=0, mini_batch_size=2, sft_epochs=1, scope="global")


def _examples(n: int) -> list[Example]:
    return [Example((i, i), (i, i)) for i in range(n)]


@pytest.mark.parametrize("n,ranks,mini", [(10, 2, 2), (13, 4, 3), (64, 8, 4), (5, 8, 2), (1, 3, 1)])
@pytest.mark.parametrize("scope", ["perRank", "global"])
def test_update_groups_partition_the_sequences_into_the_formulas_updates(n, ranks, mini, scope):
    examples = _examples(n)
    groups = update_groups(examples, mini, ranks, scope, random.Random(0))
    assert len(groups) == optimizer_updates(n, ranks=ranks, mini_batch_size=mini, sft_epochs=1, scope=scope)
    assert all(len(shares) == ranks for shares in groups)
    seen = [e.input_ids[0] for shares in groups for share in shares for e in share]
    assert sorted(seen) == list(range(n))  # every sequence exactly once per epoch
    limit = mini if scope == "perRank" else -(-mini // ranks)
    assert all(len(share) <= limit for shares in groups for share in shares)
    assert all(any(shares) for shares in groups)  # no empty update


def test_per_rank_is_global_with_ranks_times_the_minibatch():
    """verl's per-rank split is a global split with ranks x miniBatchSize sequences per update: the
    same sequences land in the same update (that is how one process reproduces a multi-rank run)."""
    examples = _examples(23)
    per_rank = update_groups(examples, 3, 4, "perRank", random.Random(7))
    global_ = update_groups(examples, 12, 4, "global", random.Random(7))
    as_sets = [{e.input_ids[0] for share in shares for e in share} for shares in per_rank]
    assert as_sets == [{e.input_ids[0] for share in shares for e in share} for shares in global_]


def test_the_trainer_config_reads_the_scope_from_the_spec():
    from whale.core.protocol import WeightPhaseArgs

    spec = WhaleRunSpec.model_validate(
        {"domain": "synthetic", "condition": "rsft_only", "model": {"name": "m"}, "schedule": {"totalSteps": 2}}
    )
    args = WeightPhaseArgs(
        cycle=1, harness=None, from_checkpoint=None, from_step=0, target_step=2, steps_per_epoch=2, total_steps=2
    )
    assert (
        spec.experiment.rsft.mini_batch_scope == "perRank"
        and RSFTConfig.from_spec(spec, args).mini_batch_scope == "perRank"
    )
    glob = spec.with_sections(**{"rsft": spec.experiment.rsft.model_copy(update={"mini_batch_scope": "global"})})
    assert RSFTConfig.from_spec(glob, args).mini_batch_scope == "global"
    with pytest.raises(ValueError, match="miniBatchScope"):
        WhaleRunSpec.model_validate({**flat(spec.to_wire()), "rsft": {"miniBatchScope": "perGpu"}})


# the paper's data-parallel world sizes (search QA 6 training GPUs, math 8, chess 4 trainer GPUs) and what
# they give with 64 sequences per rank: (ranks, upper bound, updates at 512 / 1024 / 2048 kept of 2048)
PAPER_UPDATES = {
    "searchqa": (6, 6, [2, 3, 6]),
    "math": (8, 4, [1, 2, 4]),
    "chess": (4, 8, [2, 4, 8]),
}


PAPER_RUNS = sorted(p for p in EXAMPLES.glob("*.yaml") if p.stem.split("-")[0] in ("searchqa", "math", "chess"))


def test_there_are_twelve_paper_runs():
    assert len(PAPER_RUNS) == 12


@pytest.mark.parametrize("path", PAPER_RUNS, ids=lambda p: p.stem)
def test_the_paper_manifests_plan_the_papers_optimizer_updates(path):
    spec = WhaleRunSpec.model_validate(yaml.safe_load(path.read_text())["spec"])
    figure = optimizer_updates_per_step(spec)
    if not spec.condition.trains_weights:
        assert figure is None
        return
    ranks, bound, by_kept = PAPER_UPDATES[path.stem.split("-")[0]]
    assert figure == {
        "miniBatchScope": "perRank",
        "sequences": "trajectory",
        "exact": True,
        "dataParallelRanks": ranks,
        "sequencesPerUpdate": ranks * 64,
        "formula": f"1 x ceil(ceil(kept / {ranks}) / 64)",
        "upperBound": bound,
        "byKept": [{"kept": k, "updates": u} for k, u in zip((512, 1024, 2048), by_kept, strict=True)],
    }
