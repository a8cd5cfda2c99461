"""Metrics of one GRPO batch: trainer-versus-engine logprob gap, staleness, entropy, and rollout
rewards per harness. Pure functions over the batch tensors; the module logs what they return."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from polar_pl.datamodule.collate import TrainBatch
from polar_pl.module.losses import kl_k3
from polar_pl.module.rollouts import Rollouts

QUANTILES = {"p05": 0.05, "p50": 0.5, "p95": 0.95}


def numeric(metrics: Mapping[str, Any]) -> dict[str, float]:
    """The entries Lightning can log (numbers, 0-d tensors), as floats."""
    out = {}
    for k, v in metrics.items():
        if isinstance(v, bool | int | float) or (isinstance(v, torch.Tensor) and v.numel() == 1):
            out[k] = float(v)
    return out


def _mean(x: torch.Tensor, m: torch.Tensor) -> float:
    return float((x * m).sum() / m.sum().clamp(min=1))


def batch_metrics(
    *,
    old: torch.Tensor,
    behavior: torch.Tensor,
    sampled: torch.Tensor,
    mask: torch.Tensor,
    entropy: torch.Tensor | None,
    token_versions: torch.Tensor,
    current_version: int,
    tis_w: torch.Tensor | None = None,
    keep_w: torch.Tensor | None = None,
    ref: torch.Tensor | None = None,
) -> dict[str, float]:
    """All (N, T). sampled: every sampled token with a trainer logprob; mask: those in the loss.

    train/logprob_gap_mean: mean |old - behavior| over sampled tokens (trainer pi_old vs engine mu);
    train/ratio_pXX: quantiles of exp(old - behavior); train/staleness_mean / _max: engine version
    now minus the version that sampled each token; train/entropy: mean entropy of the sampled
    distribution; train/tis_weight_mean: mean truncated importance weight over the loss tokens;
    train/off_policy_masked_frac: share of the loss tokens an off-policy mask removed;
    train/kl_ref (with the reference's logprobs `ref`): KL(pi_old || reference) per sampled token,
    the k3 estimate (unclamped) over the tokens pi_old's engine sampled.
    """
    sel = sampled > 0
    diff = (old.double() - behavior.double())[sel]
    out: dict[str, float] = {}
    if diff.numel():
        out["train/logprob_gap_mean"] = float(diff.abs().mean())
        # numpy: torch.quantile refuses inputs past 2**24 elements.
        q = np.quantile(diff.exp().cpu().numpy(), list(QUANTILES.values()))
        out.update({f"train/ratio_{k}": float(v) for k, v in zip(QUANTILES, q, strict=True)})
        stale = (current_version - token_versions[sel]).double()
        out["train/staleness_mean"] = float(stale.mean())
        out["train/staleness_max"] = float(stale.max())
    if entropy is not None:
        out["train/entropy"] = _mean(entropy, sampled)
    if tis_w is not None:
        out["train/tis_weight_mean"] = _mean(tis_w, mask)
    if keep_w is not None:
        out["train/off_policy_masked_frac"] = 1.0 - _mean(keep_w, mask)
    if ref is not None:
        out["train/kl_ref"] = _mean(kl_k3(old.double(), ref.double(), clamp=None), sampled)
    return out


def unit_metrics(
    units: Rollouts, adv: torch.Tensor, penalty: torch.Tensor | None, truncated_calls: int
) -> dict[str, float]:
    """Per rollout (statistics unit), not per row: a rollout split into many rows counts once.
    adv: (K,) advantages; penalty: (K,) KL-in-reward penalties or None."""
    present = units.present
    out = {
        "train/advantage_abs_mean": float(adv[present].abs().mean()) if present.any() else 0.0,
        "train/rollouts": float((present & ~units.side).sum()),
        "train/side_rollouts": float((present & units.side).sum()),
        "train/truncated_calls": float(truncated_calls),
    }
    if penalty is not None:
        out["train/kl_reward_penalty_mean"] = float(penalty[present].mean())
    return out


def harness_metrics(batch: TrainBatch) -> dict[str, float]:
    """rollout/reward_mean/<harness>, reward_std (>= 2 rollouts) and pass_rate (reward >= 1), one
    value per rollout of the batch (a rollout's task rows share its reward; its side rows carry
    the side reward and are not counted)."""
    per: dict[str, dict[int, float]] = defaultdict(dict)
    for i, meta in enumerate(batch.row_meta):
        harness = meta.get("harness")
        if harness and (meta.get("meta") or {}).get("call_kind") != "side":
            per[harness][int(batch.rollout_index[i])] = float(batch.rewards[i])
    out = {}
    for harness, by_rollout in per.items():
        r = torch.tensor(list(by_rollout.values()), dtype=torch.float64)
        out[f"rollout/reward_mean/{harness}"] = float(r.mean())
        out[f"rollout/pass_rate/{harness}"] = float((r >= 1.0).double().mean())
        if r.numel() > 1:
            out[f"rollout/reward_std/{harness}"] = float(r.std())
    return out
