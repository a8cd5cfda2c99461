"""Group-relative advantages, one function per variant, and the zero-variance group filter.

Rewards are per ROLLOUT (one task attempt; see rollouts.py for how rows become rollouts). A
rollout may have been split into several rows (chains); its advantage is broadcast to every row.
Rollouts are indexed 0..K-1; `group` (K,) long gives each rollout's GRPO group, -1 for an index
that has no rows (it is ignored everywhere).

Advantage functions share one signature, so config picks one with `_target_` + `_partial_`:
`fn(rewards (K,) float, group (K,) long) -> (K,) float32`.
"""

from __future__ import annotations

import torch


def _group_stats(
    rewards: torch.Tensor, group: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per rollout: (sum, count, sum of squares) of its group's rewards, each (K,) float64.

    Rollouts with group -1 get count 0 (and sums 0).
    """
    valid = group >= 0
    g = int(group.max()) + 1 if valid.any() else 0
    idx = group.clamp(min=0)
    r = torch.where(valid, rewards.double(), 0.0)
    one = valid.double()
    total = torch.zeros(g + 1, dtype=torch.float64, device=r.device).index_add_(0, idx, r)
    count = torch.zeros(g + 1, dtype=torch.float64, device=r.device).index_add_(0, idx, one)
    sq = torch.zeros(g + 1, dtype=torch.float64, device=r.device).index_add_(0, idx, r * r)
    return total[idx] * one, count[idx] * one, sq[idx] * one


def _unbiased_std(total: torch.Tensor, count: torch.Tensor, sq: torch.Tensor) -> torch.Tensor:
    """Sample std (n - 1 in the denominator) from group sums; 0 for a group of one."""
    mean = total / count.clamp(min=1)
    var = (sq - count * mean * mean) / (count - 1).clamp(min=1)
    return var.clamp(min=0).sqrt()


def group_mean(
    rewards: torch.Tensor, group: torch.Tensor, *, std_normalize: bool = True, eps: float = 1e-6
) -> torch.Tensor:
    """GRPO advantage: reward minus its group's mean, optionally divided by the group's std.

    rewards: (K,) float, one per rollout. group: (K,) long group of each rollout (-1: no rows).
    Returns (K,) float32; 0 for a group of one and for group -1. The std is the sample std
    (n - 1), as in DeepSeekMath / TRL; eps keeps a zero-variance group at advantage 0.
    """
    total, count, sq = _group_stats(rewards, group)
    adv = torch.where(count > 0, rewards.double() - total / count.clamp(min=1), 0.0)
    if std_normalize:
        adv = adv / (_unbiased_std(total, count, sq) + eps)
    return adv.float()


def leave_one_out(
    rewards: torch.Tensor, group: torch.Tensor, *, std_normalize: bool = False, eps: float = 1e-6
) -> torch.Tensor:
    """RLOO advantage: reward minus the mean of the OTHER rollouts of its group.

    rewards, group: (K,) as in `group_mean`. Returns (K,) float32; 0 for a rollout alone in its
    group. With std_normalize, divides by the group's sample std as `group_mean` does.
    """
    total, count, sq = _group_stats(rewards, group)
    r = rewards.double()
    others = count - 1
    adv = torch.where(others > 0, r - (total - r) / others.clamp(min=1), 0.0)
    if std_normalize:
        adv = adv / (_unbiased_std(total, count, sq) + eps)
    return adv.float()


def nonzero_variance_groups(rewards: torch.Tensor, group: torch.Tensor, tol: float = 1e-8) -> torch.Tensor:
    """(K,) bool: rollouts whose group's rewards are not all equal (max - min > tol).

    A group whose rollouts all scored the same has advantage 0 everywhere: it adds no signal
    but still counts in token-mean denominators, so DAPO drops it. A group of one is dropped too;
    so is group -1.
    """
    valid = group >= 0
    if not valid.any():
        return valid
    g = int(group.max()) + 1
    idx = group.clamp(min=0)
    r = rewards.double()
    hi = torch.full((g,), -torch.inf, dtype=torch.float64, device=r.device)
    lo = torch.full((g,), torch.inf, dtype=torch.float64, device=r.device)
    hi = hi.scatter_reduce(0, idx[valid], r[valid], "amax")
    lo = lo.scatter_reduce(0, idx[valid], r[valid], "amin")
    return valid & ((hi - lo)[idx] > tol)
