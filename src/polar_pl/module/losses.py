"""Per-token policy loss, KL estimators and truncated importance sampling, one function each.

Shapes: (N, T) for N packed sequences of T tokens; `mask` is 1.0 exactly on sampled (trainable)
tokens. Functions return per-token tensors; `aggregation.py` reduces them to a scalar.
"""

from __future__ import annotations

import torch


def clipped_policy_loss(logp: torch.Tensor, old_logp: torch.Tensor, advantages: torch.Tensor, *,
                        eps_low: float = 0.2, eps_high: float = 0.28, dual_clip: float | None = None):
    """PPO clipped surrogate with separate low / high epsilon (clip-higher) and optional dual clip.

    logp: (N, T) trainer logprobs (with grad); old_logp: (N, T) logprobs the ratio is taken
    against (no grad); advantages: (N, T) per-token advantage (the rollout's, broadcast).
    dual_clip: c > 1 bounds the loss of negative-advantage tokens at -c * A (Ye et al. 2020).
    Returns (loss (N, T), clipped (N, T) bool: the clipped branch was taken).
    """
    ratio = torch.exp(logp - old_logp)
    unclipped = -advantages * ratio
    clipped_obj = -advantages * ratio.clamp(1.0 - eps_low, 1.0 + eps_high)
    loss = torch.maximum(unclipped, clipped_obj)
    was_clipped = clipped_obj > unclipped
    if dual_clip is not None:
        if dual_clip <= 1.0:
            raise ValueError(f"module.dual_clip={dual_clip}: must be > 1")
        bound = -advantages * dual_clip
        dual = (advantages < 0) & (loss > bound)
        loss = torch.where(dual, bound, loss)
        was_clipped = was_clipped | dual
    return loss, was_clipped


def kl_k1(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """(N, T) k1 estimator of KL(pi || ref) on sampled tokens: logp - ref_logp (unbiased, noisy)."""
    return logp - ref_logp


def kl_k3(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """(N, T) k3 estimator: exp(ref - logp) - (ref - logp) - 1 (unbiased, always >= 0)."""
    d = ref_logp - logp
    return torch.exp(d) - d - 1.0


def tis_token(old_logp: torch.Tensor, behavior_logp: torch.Tensor, mask: torch.Tensor, *,
              cap: float = 2.0) -> torch.Tensor:
    """Token-level truncated importance weights min(pi_old / mu, cap), (N, T), 0 where masked.

    Corrects for the engine (behaviour policy mu, logprobs recorded by the gateway) sampling
    with different numerics or an older policy version than the trainer's pi_old.
    """
    w = torch.exp((old_logp - behavior_logp).clamp(max=20.0)).clamp(max=cap)
    return (w * mask).detach()


def tis_sequence(old_logp: torch.Tensor, behavior_logp: torch.Tensor, mask: torch.Tensor,
                 row_index: torch.Tensor, num_rows: int, *, cap: float = 2.0) -> torch.Tensor:
    """Sequence-level truncated importance weights, one per row, broadcast to its tokens.

    row_index: (N, T) long row of each token (-1 on padding). Weight of a row:
    min(exp(sum over its sampled tokens of (old - behavior)), cap). Returns (N, T), 0 where masked.
    """
    diff = ((old_logp - behavior_logp) * mask).flatten()
    idx = row_index.flatten().clamp(min=0)
    per_row = torch.zeros(num_rows, dtype=diff.dtype, device=diff.device).index_add_(0, idx, diff)
    w_row = torch.exp(per_row.clamp(max=20.0)).clamp(max=cap)
    return (w_row[idx].view_as(mask) * mask).detach()
