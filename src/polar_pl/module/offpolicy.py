"""Off-policy corrections between the engine that sampled (mu, behaviour logprobs) and the
trainer before the update (pi_old): truncated importance weights and off-policy masks.

The engine's numerics differ from the trainer's, and a sample may come from an older policy
version; the ratio pi_old / mu measures both. A correction multiplies each token's policy loss by
a weight that carries no grad: truncation (TIS) caps the ratio; masking zeroes tokens or whole
call segments whose ratio is out of bounds (TRL's `token_mask` / `sequence_mask`) or, DeepSeek-V3.2
style, calls with a negative advantage that drifted too far (mean log(mu / pi_old) > delta).

Every function shares one signature, so config picks one with `_target_` + `_partial_`:
`fn(old_logp, behavior_logp, mask, segments, advantages) -> (N, T) float32 weights`, with
old_logp (N, T) float, behavior_logp (N, T) float64, mask (N, T) float (1 on trainable tokens),
segments (`Segments`: which model call each sampled token belongs to), advantages (N, T) float.
Weights are 0 where mask is 0. Sequence-level variants work per CALL: a prefix-merged multi-turn
row holds many calls, and one product over all of them is nearly always ~0 or capped.
"""

from __future__ import annotations

import torch

from polar_pl.module.losses import MAX_LOG_RATIO
from polar_pl.module.segments import Segments, per_token, segment_sum


def _log_ratio(old_logp: torch.Tensor, behavior_logp: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """(N, T) float64 log(pi_old / mu), 0 where masked (a masked token's value never counts)."""
    return torch.where(mask > 0, old_logp.double() - behavior_logp.double(), 0.0)


def _segment_log_ratio(
    log_r: torch.Tensor, mask: torch.Tensor, segments: Segments, mean: bool
) -> torch.Tensor:
    """(N, T) float64 per-token copy of its segment's summed (or mean) log ratio."""
    total = segment_sum(log_r, segments)
    if mean:
        total = total / segment_sum(mask, segments).clamp(min=1.0)
    return per_token(segments, total, 0.0)


def _weights(w: torch.Tensor, mask: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    return (w * mask).to(like.dtype).detach()


def tis_token(
    old_logp: torch.Tensor,
    behavior_logp: torch.Tensor,
    mask: torch.Tensor,
    segments: Segments | None = None,
    advantages: torch.Tensor | None = None,
    *,
    cap: float = 2.0,
) -> torch.Tensor:
    """Token-level truncated importance weights min(pi_old / mu, cap)."""
    w = torch.exp(_log_ratio(old_logp, behavior_logp, mask).clamp(max=MAX_LOG_RATIO)).clamp(max=cap)
    return _weights(w, mask, old_logp)


def tis_sequence(
    old_logp: torch.Tensor,
    behavior_logp: torch.Tensor,
    mask: torch.Tensor,
    segments: Segments,
    advantages: torch.Tensor | None = None,
    *,
    cap: float = 2.0,
    length_norm: bool = False,
) -> torch.Tensor:
    """Call-level truncated importance weights, one per call segment, broadcast to its tokens:
    min(exp(sum over the call's trainable tokens of log(pi_old / mu)), cap) — the importance ratio
    of the call's whole response; with length_norm, its per-token geometric mean instead."""
    seg = _segment_log_ratio(_log_ratio(old_logp, behavior_logp, mask), mask, segments, length_norm)
    w = torch.exp(seg.clamp(max=MAX_LOG_RATIO)).clamp(max=cap)
    return _weights(w, mask, old_logp)


def mask_token(
    old_logp: torch.Tensor,
    behavior_logp: torch.Tensor,
    mask: torch.Tensor,
    segments: Segments | None = None,
    advantages: torch.Tensor | None = None,
    *,
    low: float = 0.5,
    high: float = 2.0,
) -> torch.Tensor:
    """1 where the token's ratio pi_old / mu lies in [low, high], else 0 (TRL `token_mask`)."""
    r = torch.exp(_log_ratio(old_logp, behavior_logp, mask))
    return _weights(((r >= low) & (r <= high)).double(), mask, old_logp)


def mask_sequence(
    old_logp: torch.Tensor,
    behavior_logp: torch.Tensor,
    mask: torch.Tensor,
    segments: Segments,
    advantages: torch.Tensor | None = None,
    *,
    low: float = 0.5,
    high: float = 2.0,
    length_norm: bool = True,
) -> torch.Tensor:
    """1 on the calls whose ratio lies in [low, high], else 0 (TRL `sequence_mask`). The call's
    ratio is the per-token geometric mean (length_norm, default: comparable across lengths) or
    the product over its tokens."""
    seg = _segment_log_ratio(_log_ratio(old_logp, behavior_logp, mask), mask, segments, length_norm)
    r = torch.exp(seg)
    return _weights(((r >= low) & (r <= high)).double(), mask, old_logp)


def mask_sequence_kl(
    old_logp: torch.Tensor,
    behavior_logp: torch.Tensor,
    mask: torch.Tensor,
    segments: Segments,
    advantages: torch.Tensor,
    *,
    delta: float = 1e-2,
) -> torch.Tensor:
    """DeepSeek-V3.2 off-policy sequence masking: 0 on a call whose advantage is negative and
    whose mean log(mu / pi_old) over its trainable tokens (a KL(mu || pi_old) estimate) exceeds
    delta; 1 elsewhere. Positive-advantage calls are never masked."""
    kl = -_segment_log_ratio(_log_ratio(old_logp, behavior_logp, mask), mask, segments, True)
    drop = (advantages < 0) & (kl > delta)
    return _weights((~drop).double(), mask, old_logp)
