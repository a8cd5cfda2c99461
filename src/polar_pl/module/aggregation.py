"""Loss aggregation: how much each token weighs in the scalar loss, one function per variant.

Every variant is linear in the per-token loss, so each function returns token WEIGHTS and the
scalar is `(loss * weights).sum()`. Weights computed once for a minibatch stay exact when the
minibatch is cut into micro-batches for memory (sum the micro-batch losses), and the same weights
average logged per-token quantities.

Common arguments (config binds any extra keyword with `_partial_`):
  mask (N, T) float, 1.0 on trainable tokens (sampled, not filtered out), 0 elsewhere;
  row_index (N, T) long, the row of each token (-1 on padding);
  row_rollout (R,) long, the rollout of each row (rows of one rollout are its chains).
Returns (N, T) float weights, 0 where mask is 0, summing to 1 (0 if nothing is trainable) except
for `seq_mean_token_sum_norm`, whose constant normaliser is the point.

Rollouts, not rows, are the unit: a rollout split into several chains weighs exactly as much as one
that merged into a single row (each sampled token is trainable in exactly one row).
"""

from __future__ import annotations

import torch


def _row_counts(mask: torch.Tensor, row_index: torch.Tensor, num_rows: int) -> torch.Tensor:
    """(R,) trainable tokens per row."""
    idx = row_index.flatten().clamp(min=0)
    m = mask.flatten().to(torch.float64)
    return torch.zeros(num_rows, dtype=torch.float64, device=mask.device).index_add_(0, idx, m)


def _rollout_counts(row_counts: torch.Tensor, row_rollout: torch.Tensor) -> torch.Tensor:
    """(K,) trainable tokens per rollout."""
    k = int(row_rollout.max()) + 1 if row_rollout.numel() else 0
    return torch.zeros(k, dtype=torch.float64, device=row_counts.device).index_add_(
        0, row_rollout, row_counts
    )


def _broadcast(per_row: torch.Tensor, mask: torch.Tensor, row_index: torch.Tensor) -> torch.Tensor:
    """Per-row values (R,) -> (N, T), 0 where masked, in mask's dtype."""
    if per_row.numel() == 0:
        return torch.zeros_like(mask)
    return (per_row[row_index.clamp(min=0)] * mask).to(mask.dtype)


def token_mean(mask: torch.Tensor, row_index: torch.Tensor, row_rollout: torch.Tensor) -> torch.Tensor:
    """Every trainable token of the batch weighs the same (DAPO): mask / mask.sum().

    A long rollout weighs in proportion to its sampled tokens, however it is split into rows.
    """
    return mask / mask.sum().clamp(min=1.0)


def seq_mean_token_mean(
    mask: torch.Tensor, row_index: torch.Tensor, row_rollout: torch.Tensor
) -> torch.Tensor:
    """Token mean within each row, then a mean over rollouts in which each rollout's rows share
    one unit of weight (original GRPO, with a rollout as the sequence).

    Row r of a rollout with n trainable rows: each of its c_r tokens weighs 1 / (n c_r K), K the
    number of rollouts with trainable tokens.
    """
    counts = _row_counts(mask, row_index, row_rollout.numel())
    has = (counts > 0).double()
    k = int(row_rollout.max()) + 1 if row_rollout.numel() else 0
    rows_per_rollout = torch.zeros(k, dtype=torch.float64, device=mask.device).index_add_(0, row_rollout, has)
    num_rollouts = (rows_per_rollout > 0).sum().clamp(min=1)
    per_row = has / (counts.clamp(min=1) * rows_per_rollout[row_rollout].clamp(min=1) * num_rollouts)
    return _broadcast(per_row, mask, row_index)


def seq_mean_token_sum_norm(
    mask: torch.Tensor, row_index: torch.Tensor, row_rollout: torch.Tensor, *, max_len: int = 1024
) -> torch.Tensor:
    """Dr. GRPO: each rollout's token SUM divided by a constant `max_len`, mean over rollouts.

    Every trainable token weighs 1 / (max_len K), K the number of rollouts with trainable tokens:
    no per-sequence length normalisation, hence no length bias. Weights sum to tokens / (max_len K).
    """
    if max_len <= 0:
        raise ValueError(f"module.aggregation.max_len={max_len}: must be > 0")
    per_rollout = _rollout_counts(_row_counts(mask, row_index, row_rollout.numel()), row_rollout)
    num_rollouts = (per_rollout > 0).sum().clamp(min=1)
    return mask / (max_len * num_rollouts).to(mask.dtype)


def rollout_mean(mask: torch.Tensor, row_index: torch.Tensor, row_rollout: torch.Tensor) -> torch.Tensor:
    """Token mean within each rollout (over all its rows), then mean over rollouts.

    Each of the c_k tokens of rollout k weighs 1 / (c_k K).
    """
    per_rollout = _rollout_counts(_row_counts(mask, row_index, row_rollout.numel()), row_rollout)
    num_rollouts = (per_rollout > 0).sum().clamp(min=1)
    per_row = 1.0 / (per_rollout[row_rollout].clamp(min=1) * num_rollouts)
    return _broadcast(per_row, mask, row_index)
