"""Group-relative advantages, one function per variant.

Rewards are per ROLLOUT (one task attempt). A rollout may have been split into several rows
(chains); its advantage is broadcast to every row, and `rollout_row_weights` gives each row
1 / (rows of its rollout) so that sequence-level aggregation weighs every rollout once.
"""

from __future__ import annotations

import torch


def _group_stats(rewards: torch.Tensor, group: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-rollout (group sum, group count, group sum of squares), each (K,) float64."""
    g = int(group.max()) + 1 if group.numel() else 0
    r = rewards.double()
    total = torch.zeros(g, dtype=torch.float64).index_add_(0, group, r)
    count = torch.zeros(g, dtype=torch.float64).index_add_(0, group, torch.ones_like(r))
    sq = torch.zeros(g, dtype=torch.float64).index_add_(0, group, r * r)
    return total[group], count[group], sq[group]


def group_mean(rewards: torch.Tensor, group: torch.Tensor, *, std_normalize: bool = True,
               eps: float = 1e-6) -> torch.Tensor:
    """GRPO advantage: reward minus the group mean, optionally divided by the group std.

    rewards: (K,) float, one per rollout. group: (K,) long, group index of each rollout.
    Returns (K,) float32. The std is the unbiased sample std (0 for a group of one).
    """
    total, count, sq = _group_stats(rewards, group)
    mean = total / count
    adv = rewards.double() - mean
    if std_normalize:
        var = ((sq - count * mean * mean) / (count - 1).clamp(min=1)).clamp(min=0)
        adv = adv / (var.sqrt() + eps)
    return adv.float()


def leave_one_out(rewards: torch.Tensor, group: torch.Tensor, *, std_normalize: bool = False,
                  eps: float = 1e-6) -> torch.Tensor:
    """RLOO advantage: reward minus the mean of the OTHER rollouts of its group.

    rewards, group: (K,). Returns (K,) float32; 0 for a rollout alone in its group. With
    std_normalize, divides by the group std as in `group_mean`.
    """
    total, count, sq = _group_stats(rewards, group)
    r = rewards.double()
    others = count - 1
    baseline = torch.where(others > 0, (total - r) / others.clamp(min=1), r)
    adv = r - baseline
    if std_normalize:
        mean = total / count
        var = ((sq - count * mean * mean) / others.clamp(min=1)).clamp(min=0)
        adv = adv / (var.sqrt() + eps)
    return adv.float()


def rollout_rewards(row_rewards: torch.Tensor, row_rollout: torch.Tensor, row_group: torch.Tensor):
    """Collapse rows to rollouts.

    row_rewards (R,), row_rollout (R,) long rollout index per row, row_group (R,) long.
    Returns (rewards (K,), group (K,)) indexed by rollout index (K = max rollout index + 1;
    rollouts without rows get reward 0 and group -1 and are ignored by `group_mask`).
    """
    k = int(row_rollout.max()) + 1 if row_rollout.numel() else 0
    rewards = torch.zeros(k, dtype=row_rewards.dtype).index_copy_(0, row_rollout, row_rewards)
    group = torch.full((k,), -1, dtype=torch.long).index_copy_(0, row_rollout, row_group)
    return rewards, group


def rollout_row_weights(row_rollout: torch.Tensor) -> torch.Tensor:
    """(R,) float32: 1 / number of rows of the row's rollout (a split rollout weighs once)."""
    k = int(row_rollout.max()) + 1 if row_rollout.numel() else 0
    counts = torch.zeros(k).index_add_(0, row_rollout, torch.ones(row_rollout.shape[0]))
    return 1.0 / counts[row_rollout]


def nonzero_variance_groups(rewards: torch.Tensor, group: torch.Tensor, tol: float = 1e-8) -> torch.Tensor:
    """(K,) bool: rollouts whose group rewards are not all equal (the others carry no signal)."""
    total, count, sq = _group_stats(rewards, group)
    mean = total / count
    var = (sq / count - mean * mean).clamp(min=0)
    return var > tol
