"""The prompt order: a pure function of (size, seed, promptsPerStep, step), epoch-aware."""

from __future__ import annotations

import pytest

from whale.rsft.order import PromptOrder, epoch_permutation


def test_each_epoch_visits_every_prompt_once():
    order = PromptOrder(size=10, per_step=5, seed=3)
    first_epoch = order.indices(0) + order.indices(1)
    assert sorted(first_epoch) == list(range(10))
    assert [s.epoch for s in order.slots(1)] == [0] * 5
    assert [s.epoch for s in order.slots(2)] == [1] * 5


def test_a_step_straddling_an_epoch_boundary_takes_the_next_permutation():
    order = PromptOrder(size=7, per_step=4, seed=0)
    slots = order.slots(1)  # stream positions 4..7: three of epoch 0, one of epoch 1
    assert [s.epoch for s in slots] == [0, 0, 0, 1]
    assert slots[3].index == epoch_permutation(7, 0, 1)[0]


def test_order_depends_only_on_the_step_so_a_restart_sees_the_same_prompts():
    a = PromptOrder(size=100, per_step=8, seed=1)
    b = PromptOrder(size=100, per_step=8, seed=1)
    history = [a.indices(s) for s in range(30)]
    assert b.indices(17) == history[17]
    assert a.epochs_done(25) == pytest.approx(2.0)


def test_the_seed_and_the_epoch_change_the_order():
    assert epoch_permutation(50, 0, 0) != epoch_permutation(50, 1, 0)
    assert epoch_permutation(50, 0, 0) != epoch_permutation(50, 0, 1)


@pytest.mark.parametrize("size,per_step", [(0, 4), (4, 0)])
def test_bad_sizes_are_refused_with_the_field_named(size, per_step):
    with pytest.raises(ValueError, match="D_weight is empty|promptsPerStep"):
        PromptOrder(size=size, per_step=per_step)
