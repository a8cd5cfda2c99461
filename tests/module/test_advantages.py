"""Advantages and zero-variance filtering against values computed by hand."""

from __future__ import annotations

import math

import pytest
import torch

from polar_pl.module.advantages import group_mean, leave_one_out, nonzero_variance_groups

T = torch.tensor


def test_group_mean_with_and_without_std() -> None:
    rewards = T([1.0, 0.0, 0.0, 1.0, 2.0, 2.0])
    group = T([0, 0, 0, 0, 1, 1])
    # group 0: mean 0.5, sample std sqrt(4 * 0.25 / 3) = sqrt(1/3); group 1: no spread.
    a = 0.5 / math.sqrt(1 / 3)
    assert group_mean(rewards, group).tolist() == pytest.approx([a, -a, -a, a, 0, 0], abs=1e-5)
    assert group_mean(rewards, group, std_normalize=False).tolist() == [0.5, -0.5, -0.5, 0.5, 0, 0]
    assert group_mean(rewards, group).dtype == torch.float32


def test_group_mean_single_rollout_and_missing_index_are_zero() -> None:
    # index 2 has no rows (group -1): it neither gets an advantage nor shifts group 0's mean.
    adv = group_mean(T([1.0, 0.0, 5.0, 7.0]), T([0, 0, -1, 1]))
    s = math.sqrt(0.5)
    assert adv.tolist() == pytest.approx([0.5 / s, -0.5 / s, 0.0, 0.0], abs=1e-5)


def test_leave_one_out() -> None:
    rewards, group = T([1.0, 0.0, 0.0, 3.0]), T([0, 0, 0, 1])
    # r0: 1 - (0 + 0) / 2; r1: 0 - (1 + 0) / 2; alone in group 1: 0.
    assert leave_one_out(rewards, group).tolist() == pytest.approx([1.0, -0.5, -0.5, 0.0])
    std = math.sqrt(((2 / 3) ** 2 + 2 * (1 / 3) ** 2) / 2)
    assert leave_one_out(rewards, group, std_normalize=True).tolist() == pytest.approx(
        [1.0 / std, -0.5 / std, -0.5 / std, 0.0], abs=1e-5
    )


def test_nonzero_variance_groups() -> None:
    rewards = T([1.0, 1.0, 0.0, 1.0, 5.0, 0.3, 0.3])
    group = T([0, 0, 1, 1, 2, -1, 3])
    # group 0 all equal, group 1 spread, group 2 alone, index 5 has no rows, group 3 alone.
    assert nonzero_variance_groups(rewards, group).tolist() == [False, False, True, True, False, False, False]
    assert nonzero_variance_groups(T([0.0, 1e-12]), T([0, 0])).tolist() == [False, False]


def test_eps_keeps_a_near_zero_spread_finite() -> None:
    """A group whose rewards differ by 1e-6 is divided by std + eps, not by ~0."""
    r, g = T([0.0, 1e-6]), T([0, 0])
    std = math.sqrt(2 * (0.5e-6) ** 2)
    a = 0.5e-6 / (std + 1e-6)
    assert group_mean(r, g).tolist() == pytest.approx([-a, a], rel=1e-3)
    assert leave_one_out(r, g, std_normalize=True).tolist() == pytest.approx([-2 * a, 2 * a], rel=1e-3)


def test_variance_filter_tolerance_is_strict() -> None:
    assert nonzero_variance_groups(T([0.0, 0.5, 0.0, 0.75]), T([0, 0, 1, 1]), tol=0.5).tolist() == [
        False, False, True, True,
    ]  # fmt: skip


def test_no_rollouts_gives_empty_advantages() -> None:
    """A batch whose every row is left out (side_rows="exclude" on side rows only) has K = 0
    units: the advantage runs before the skip and must return an empty tensor, not raise."""
    none_r, none_g = torch.zeros(0), torch.zeros(0, dtype=torch.long)
    for fn in (group_mean, leave_one_out, nonzero_variance_groups):
        assert fn(none_r, none_g).tolist() == []
    assert group_mean(T([3.0, 4.0]), T([-1, -1])).tolist() == [0.0, 0.0]


def test_a_missing_index_stays_zero_when_group_zero_scored_nothing() -> None:
    """Index 2 has no rows; its (clamped) lookup lands on group 0, whose rewards are all 0: its
    advantage is 0, not 0 / 0."""
    r, g = T([0.0, 0.0, 5.0, 1.0, 0.0]), T([0, 0, -1, 1, 1])
    a = 0.5 / math.sqrt(0.5)
    assert group_mean(r, g).tolist() == pytest.approx([0.0, 0.0, 0.0, a, -a], abs=1e-5)
    assert leave_one_out(r, g, std_normalize=True).tolist() == pytest.approx(
        [0.0, 0.0, 0.0, 2 * a, -2 * a], abs=1e-5
    )
