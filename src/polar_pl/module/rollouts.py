"""Rows -> the units GRPO statistics are computed over (rewards, groups, baselines, weights).

A task rollout (one attempt) may be several rows (chains); they share its reward and group. Side
calls (titles, memory extraction, routing) are rows of the same session but not steps of the
task: their reward is the builder's `side_reward` (or the rollout's, by config), so mixing them
into the rollout would give it two rewards. With `side_rows="own"` (default) the side rows of a
rollout form a unit of their own, in a side group per task group (the side rows of the other
attempts at the same task), so their baseline is their peers'; `side_rows="exclude"` leaves them
out of the loss and of every statistic.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from polar_pl.datamodule.collate import TrainBatch

SIDE_ROWS = ("own", "exclude")


@dataclass(frozen=True, slots=True)
class Rollouts:
    """row: (R,) long unit of each row, -1 for a row left out; reward: (K,) float32 per unit;
    group: (K,) long group per unit, -1 for an index without rows; side: (K,) bool, a unit of
    side rows; ids: (K,) unit names (a rollout id, "<rollout id>/side" for its side rows)."""

    row: torch.Tensor
    reward: torch.Tensor
    group: torch.Tensor
    side: torch.Tensor
    ids: list[str]

    @property
    def present(self) -> torch.Tensor:
        """(K,) bool: units with rows."""
        return self.group >= 0


def is_side_row(batch: TrainBatch) -> torch.Tensor:
    """(R,) bool: rows built from side calls."""
    flags = [(m.get("meta") or {}).get("call_kind") == "side" for m in batch.row_meta]
    return torch.tensor(flags, dtype=torch.bool, device=batch.rollout_index.device)


def rollouts(batch: TrainBatch, side_rows: str = "own") -> Rollouts:
    """The units of `batch` (see the module docstring). Raises ValueError naming the rollout when
    rows of one unit disagree on reward or group."""
    if side_rows not in SIDE_ROWS:
        raise ValueError(f"module.side_rows={side_rows!r}: allowed {', '.join(SIDE_ROWS)}")
    side = is_side_row(batch)
    k0, g0 = len(batch.rollout_ids), len(batch.group_ids)
    unit = torch.where(side, k0 + batch.rollout_index, batch.rollout_index)
    group = torch.where(side, g0 + batch.group_index, batch.group_index)
    if side_rows == "exclude":
        unit = torch.where(side, -1, unit)
    ids = list(batch.rollout_ids) + [f"{r}/side" for r in batch.rollout_ids]
    reward, unit_group = rollout_rewards(batch.rewards, unit, group, ids)
    is_side = torch.arange(reward.numel(), device=reward.device) >= k0
    return Rollouts(unit, reward, unit_group, is_side, ids[: reward.numel()])


def rollout_rewards(
    row_rewards: torch.Tensor,
    row_rollout: torch.Tensor,
    row_group: torch.Tensor,
    ids: list[str] | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Collapse rows to rollouts.

    row_rewards (R,) float, row_rollout (R,) long rollout index of each row (-1: row left out),
    row_group (R,) long. Returns (rewards (K,) float32, group (K,) long) with K = max rollout
    index + 1; an index without rows gets reward 0 and group -1. Rows of one rollout must agree
    on reward and group (ValueError naming it, from `ids` when given).
    """
    kept = row_rollout >= 0
    rr, ro, rg = row_rewards[kept].float(), row_rollout[kept], row_group[kept]
    k = int(ro.max()) + 1 if ro.numel() else 0
    rewards = torch.zeros(k, dtype=torch.float32, device=row_rewards.device)
    rewards[ro] = rr
    group = torch.full((k,), -1, dtype=torch.long, device=row_group.device)
    group[ro] = rg
    bad = (rewards[ro] != rr) | (group[ro] != rg)
    if bad.any():
        i = int(ro[bad][0])
        name = ids[i] if ids is not None else str(i)
        seen = sorted({float(x) for x in rr[ro == i]})
        raise ValueError(f"rows of rollout {name} disagree on reward or group (rewards {seen})")
    return rewards, group
