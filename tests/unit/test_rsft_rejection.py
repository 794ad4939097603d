"""Rejection sampling: keep reward strictly above the threshold."""

from __future__ import annotations

from whale.rsft.rejection import Trajectory, select


def traj(reward: float) -> Trajectory:
    return Trajectory(prompt_index=0, messages=({"role": "assistant", "content": "x"},), reward=reward)


def test_keeps_rewards_strictly_above_the_threshold():
    sel = select([traj(0.0), traj(0.5), traj(0.75), traj(1.0)], 0.5)
    assert [t.reward for t in sel.kept] == [0.75, 1.0]
    assert sel.acceptance_rate == 0.5
    assert sel.reward_mean == 0.5625
    assert sel.rollouts == 4


def test_no_rollouts_kept_is_an_empty_selection_not_an_error():
    sel = select([traj(0.0), traj(0.0)], 0.5)
    assert sel.kept == [] and sel.acceptance_rate == 0.0 and sel.reward_mean == 0.0
    assert select([], 0.5).rollouts == 0
