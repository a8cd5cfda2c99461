"""Per-token policy loss, KL estimators and truncated importance sampling, one function each.

Shapes: (N, T) for N packed sequences of T tokens; `mask` is 1.0 exactly on sampled (trainable)
tokens, 0 on prompts, tool results, glue and padding. Functions return per-token tensors;
`aggregation.py` says how much each token weighs in the scalar loss.

Variants that config picks with `_target_` + `_partial_` share a signature:
- KL: `kl(logp, ref_logp) -> (N, T)`;
- TIS: `tis(old_logp, behavior_logp, mask, row_index) -> (N, T)` (the cap is bound by config).
"""

from __future__ import annotations

import torch

# exp() of a log-ratio past this overflows float32 gradients; ratios this far from 1 are clipped
# (or weighted by a cap) anyway.
MAX_LOG_RATIO = 20.0


def clipped_policy_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    *,
    eps_low: float = 0.2,
    eps_high: float = 0.28,
    dual_clip: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """PPO clipped surrogate with separate low / high epsilon (clip-higher, DAPO) and an optional
    dual clip (Ye et al. 2020).

    logp: (N, T) float trainer logprobs of the sampled tokens (with grad); old_logp: (N, T) the
    logprobs the ratio is taken against (no grad); advantages: (N, T) per-token advantage (the
    rollout's, broadcast). Per token, with r = exp(logp - old_logp):
        loss = max(-A r, -A clip(r, 1 - eps_low, 1 + eps_high)),
    and with dual_clip = c > 1, for A < 0 the loss is also bounded by -c A (a token whose ratio
    exploded cannot dominate the batch).
    Returns (loss (N, T), clipped (N, T) bool: a clipped branch was taken, the token has no grad).
    """
    if dual_clip is not None and dual_clip <= 1.0:
        raise ValueError(f"module.dual_clip={dual_clip}: must be > 1 (or null)")
    log_ratio = (logp - old_logp).clamp(-MAX_LOG_RATIO, MAX_LOG_RATIO)
    ratio = torch.exp(log_ratio)
    unclipped = -advantages * ratio
    clipped_obj = -advantages * ratio.clamp(1.0 - eps_low, 1.0 + eps_high)
    loss = torch.maximum(unclipped, clipped_obj)
    was_clipped = clipped_obj > unclipped
    if dual_clip is not None:
        bound = -advantages * dual_clip
        dual = (advantages < 0) & (loss > bound)
        loss = torch.where(dual, bound, loss)
        was_clipped = was_clipped | dual
    return loss, was_clipped


def kl_k1(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """(N, T) k1 estimator of KL(pi || ref) on tokens sampled from pi: logp - ref_logp.

    Unbiased, high variance, can be negative per token (Schulman, "Approximating KL divergence").
    """
    return logp - ref_logp


def kl_k3(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """(N, T) k3 estimator of KL(pi || ref): exp(ref - logp) - (ref - logp) - 1.

    Unbiased, low variance, >= 0 per token (the estimator GRPO uses).
    """
    d = (ref_logp - logp).clamp(-MAX_LOG_RATIO, MAX_LOG_RATIO)
    return torch.exp(d) - d - 1.0


def tis_token(
    old_logp: torch.Tensor,
    behavior_logp: torch.Tensor,
    mask: torch.Tensor,
    row_index: torch.Tensor | None = None,
    *,
    cap: float = 2.0,
) -> torch.Tensor:
    """Token-level truncated importance weights min(pi_old / mu, cap), (N, T), 0 where masked.

    old_logp: (N, T) the trainer's logprobs before the update (pi_old); behavior_logp: (N, T) the
    engine's logprobs recorded by the gateway (mu: other numerics, maybe an older policy version).
    row_index is unused (kept so both TIS variants share a signature). No grad flows through.
    """
    log_w = (old_logp.double() - behavior_logp.double()).clamp(max=MAX_LOG_RATIO)
    w = torch.exp(log_w).clamp(max=cap)
    return (w * mask).to(old_logp.dtype).detach()


def tis_sequence(
    old_logp: torch.Tensor,
    behavior_logp: torch.Tensor,
    mask: torch.Tensor,
    row_index: torch.Tensor,
    *,
    cap: float = 2.0,
) -> torch.Tensor:
    """Sequence-level truncated importance weights, one per row, broadcast to its tokens.

    row_index: (N, T) long row of each token (-1 on padding). The weight of a row is
    min(exp(sum over its sampled tokens of (old_logp - behavior_logp)), cap): the importance
    ratio of the whole sampled sequence. Returns (N, T) in old_logp's dtype, 0 where masked.
    """
    diff = ((old_logp.double() - behavior_logp.double()) * mask).flatten()
    idx = row_index.flatten().clamp(min=0)
    num_rows = int(row_index.max()) + 1 if row_index.numel() else 0
    per_row = torch.zeros(max(num_rows, 1), dtype=torch.float64, device=diff.device).index_add_(0, idx, diff)
    w_row = torch.exp(per_row.clamp(max=MAX_LOG_RATIO)).clamp(max=cap)
    return (w_row[idx].view_as(mask) * mask).to(old_logp.dtype).detach()
