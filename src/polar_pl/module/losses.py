"""Per-token policy losses and KL estimators, one function each.

Shapes: (N, T) for N packed sequences of T tokens; `mask` is 1.0 exactly on trainable tokens, 0 on
prompts, tool results, glue and padding. Functions return per-token tensors; `aggregation.py`
says how much each token weighs in the scalar loss.

Variants that config picks with `_target_` + `_partial_` share a signature:
- policy loss: `loss(logp, old_logp, advantages, mask, segments) -> (loss (N, T), clipped (N, T))`
  (`clipped_policy_loss` = PPO / DAPO clip-higher, `gspo_policy_loss`, `cispo_policy_loss`);
- KL to the reference, added to the loss: `kl(logp, ref_logp) -> (N, T)` (`kl_k2`, `kl_k3`,
  `kl_k3_plus`). `kl_k1` has zero expected gradient as a loss (E_pi[grad log pi] = 0): it is the
  estimator for KL in the reward (GRPOModule's `kl_reward`), where only its value counts.
"""

from __future__ import annotations

import torch

from polar_pl.module.segments import Segments, per_token, segment_sum

# exp() of a log-ratio past this overflows float32 gradients; ratios this far from 1 are clipped
# (or weighted by a cap) anyway.
MAX_LOG_RATIO = 20.0


def clipped_policy_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor | None = None,
    segments: Segments | None = None,
    *,
    eps_low: float = 0.2,
    eps_high: float = 0.28,
    dual_clip: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """PPO clipped surrogate with separate low / high epsilon (clip-higher, DAPO) and an optional
    dual clip (Ye et al. 2020).

    logp: (N, T) float trainer logprobs of the sampled tokens (with grad); old_logp: (N, T) the
    logprobs the ratio is taken against (no grad); advantages: (N, T) per-token advantage (the
    rollout's, broadcast). mask and segments are unused (the shared signature). Per token, with
    r = exp(logp - old_logp):
        loss = max(-A r, -A clip(r, 1 - eps_low, 1 + eps_high)),
    and with dual_clip = c > 1, for A < 0 the loss is also bounded by -c A (a token whose ratio
    exploded cannot dominate the batch).
    Returns (loss (N, T), clipped (N, T) bool: a clipped branch was taken, the token has no grad).
    """
    if dual_clip is not None and dual_clip <= 1.0:
        raise ValueError(f"module.policy_loss.dual_clip={dual_clip}: must be > 1 (or null)")
    log_ratio = (logp - old_logp).clamp(-MAX_LOG_RATIO, MAX_LOG_RATIO)
    return _clip(torch.exp(log_ratio), advantages, eps_low, eps_high, dual_clip)


def _clip(
    ratio: torch.Tensor,
    advantages: torch.Tensor,
    eps_low: float,
    eps_high: float,
    dual_clip: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
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


def gspo_policy_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    segments: Segments,
    *,
    eps_low: float = 3e-4,
    eps_high: float = 4e-4,
) -> tuple[torch.Tensor, torch.Tensor]:
    """GSPO (Zheng et al. 2025), token form: one ratio per call segment,
    s = exp(mean over the segment's trainable tokens of (logp - old_logp)), clipped as PPO does.

    Shapes as `clipped_policy_loss`; mask (N, T) float selects the tokens of the mean, segments
    says which call each token belongs to. Token t of segment i uses s_i with the gradient of
    s_i * pi(y_t) / sg(pi(y_t)): value s_i, gradient s_i grad log pi(y_t). The default eps are the
    paper's (3e-4, 4e-4): a sequence ratio moves far less than a token ratio.
    """
    diff = (logp - old_logp).detach() * mask
    tokens = segment_sum(mask, segments).clamp(min=1.0)
    seg_mean = (segment_sum(diff, segments) / tokens).float()
    log_s = per_token(segments, seg_mean, 0.0) + logp - logp.detach()
    ratio = torch.exp(log_s.clamp(-MAX_LOG_RATIO, MAX_LOG_RATIO))
    return _clip(ratio, advantages, eps_low, eps_high)


def cispo_policy_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor | None = None,
    segments: Segments | None = None,
    *,
    eps_low: float = 1.0,
    eps_high: float = 0.28,
) -> tuple[torch.Tensor, torch.Tensor]:
    """CISPO (MiniMax-M1, 2025): loss = -sg(clip(r, 1 - eps_low, 1 + eps_high)) A logp.

    Shapes as `clipped_policy_loss`. Unlike PPO no token loses its gradient: the clipped ratio
    only weighs it. eps_low = 1 (no lower bound) as in the paper. `clipped` marks the tokens whose
    weight was clipped.
    """
    ratio = torch.exp((logp - old_logp).detach().clamp(-MAX_LOG_RATIO, MAX_LOG_RATIO))
    weight = ratio.clamp(1.0 - eps_low, 1.0 + eps_high)
    return -weight * advantages * logp, weight != ratio


def kl_k1(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """(N, T) k1 estimator of KL(pi || ref) on tokens sampled from pi: logp - ref_logp.

    Unbiased in value, can be negative per token (Schulman, "Approximating KL divergence"). Its
    expected gradient is 0: use it for KL in the reward, not as a loss.
    """
    return logp - ref_logp


def kl_k2(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """(N, T) k2 estimator: (logp - ref_logp)^2 / 2, >= 0.

    Biased in value, but its gradient (logp - ref) grad logp is the on-policy gradient of
    KL(pi || ref): the estimator to put in the loss.
    """
    return 0.5 * (logp - ref_logp).square()


def kl_k3(logp: torch.Tensor, ref_logp: torch.Tensor, *, clamp: float | None = 10.0) -> torch.Tensor:
    """(N, T) k3 estimator of KL(pi || ref): exp(d) - d - 1 with d = ref_logp - logp, >= 0.

    Unbiased, low variance (the estimator GRPO uses). Its gradient -(exp(d) - 1) grad logp
    explodes where the policy left the reference (-402 at d = 6): the value is clamped at `clamp`
    (verl's `low_var_kl`: 10), which zeroes the gradient past it. None: unclamped.
    """
    d = (ref_logp - logp).clamp(-MAX_LOG_RATIO, MAX_LOG_RATIO)
    k3 = torch.exp(d) - d - 1.0
    return k3 if clamp is None else k3.clamp(max=clamp)


def kl_k3_plus(logp: torch.Tensor, ref_logp: torch.Tensor, *, clamp: float | None = 10.0) -> torch.Tensor:
    """(N, T) "k3+" (verl): the value of clamped k3, the gradient of k2 (straight-through).

    Logs the low-variance unbiased KL value while training on the right gradient.
    """
    k2 = kl_k2(logp, ref_logp)
    return k2 - k2.detach() + kl_k3(logp, ref_logp, clamp=clamp).detach()
