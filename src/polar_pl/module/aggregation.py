"""Loss aggregation: per-token losses (N, T) -> one scalar, one function per variant.

Common arguments: loss (N, T) per-token loss; mask (N, T) float, 1 on trainable tokens;
row_index (N, T) long row of each token (-1 on padding); row_weight (R,) float, the weight of each
row (1 / rows of its rollout, see advantages.rollout_row_weights); row_rollout (R,) long.
"""

from __future__ import annotations

import torch


def _per_row(loss: torch.Tensor, mask: torch.Tensor, row_index: torch.Tensor, num_rows: int):
    idx = row_index.flatten().clamp(min=0)
    m = mask.flatten().to(loss.dtype)
    sums = torch.zeros(num_rows, dtype=loss.dtype, device=loss.device).index_add(0, idx, loss.flatten() * m)
    counts = torch.zeros(num_rows, dtype=loss.dtype, device=loss.device).index_add(0, idx, m)
    return sums, counts


def token_mean(loss, mask, row_index, row_weight, row_rollout) -> torch.Tensor:
    """Mean over every trainable token of the batch (DAPO). Each sampled token appears once
    across a rollout's rows, so a split rollout weighs exactly as a merged one."""
    m = mask.to(loss.dtype)
    return (loss * m).sum() / m.sum().clamp(min=1.0)


def seq_mean_token_mean(loss, mask, row_index, row_weight, row_rollout) -> torch.Tensor:
    """Mean over rows of each row's token mean (original GRPO), rows weighted by row_weight."""
    sums, counts = _per_row(loss, mask, row_index, row_weight.numel())
    has = (counts > 0).to(loss.dtype)
    w = row_weight.to(loss.dtype) * has
    return (w * sums / counts.clamp(min=1.0)).sum() / w.sum().clamp(min=1e-12)


def seq_mean_token_sum_norm(loss, mask, row_index, row_weight, row_rollout, *, max_len: int = 1024):
    """Dr. GRPO: each row's token SUM divided by a constant `max_len`, weighted mean over rows
    (no length bias from per-row normalisation)."""
    sums, counts = _per_row(loss, mask, row_index, row_weight.numel())
    w = row_weight.to(loss.dtype) * (counts > 0).to(loss.dtype)
    return (w * sums).sum() / (w.sum().clamp(min=1e-12) * max_len)


def rollout_mean(loss, mask, row_index, row_weight, row_rollout) -> torch.Tensor:
    """Token mean within each rollout (over all its rows), then mean over rollouts."""
    sums, counts = _per_row(loss, mask, row_index, row_weight.numel())
    k = int(row_rollout.max()) + 1 if row_rollout.numel() else 0
    r_sum = torch.zeros(k, dtype=loss.dtype, device=loss.device).index_add(0, row_rollout, sums)
    r_cnt = torch.zeros(k, dtype=loss.dtype, device=loss.device).index_add(0, row_rollout, counts)
    has = r_cnt > 0
    return (r_sum[has] / r_cnt[has]).mean() if has.any() else loss.sum() * 0.0
