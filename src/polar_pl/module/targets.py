"""What the loss of one rollout batch is computed against, fixed before its first optimiser step:
each unit's advantage (`unit_advantages`), the off-policy weights against the engine's logprobs
(`corrections`), all of them together (`Targets`), and pi_old as a single-step batch's own
forward passes saw it (`Seen`)."""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

import torch

from polar_pl.datamodule.collate import TrainBatch
from polar_pl.module.advantages import nonzero_variance_groups
from polar_pl.module.prepare import Prepared
from polar_pl.module.rollouts import Rollouts
from polar_pl.module.segments import Segments
from polar_pl.module.settings import GRPOSettings


def unit_advantages(
    settings: GRPOSettings, units: Rollouts, penalty: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor, float]:
    """(advantage per unit (K,), keep per unit (K,) bool, fraction of groups dropped). The
    zero-variance filter looks at the task rewards, before any KL penalty."""
    rewards = units.reward if penalty is None else units.reward - penalty.to(units.reward)
    advantage = settings.advantage(rewards, units.group).to(units.reward.device)
    keep = units.present
    filtered = 0.0
    if settings.filter_zero_variance:
        signal = nonzero_variance_groups(units.reward, units.group)
        groups = units.group[keep].unique()
        dropped = units.group[keep & ~signal].unique()
        filtered = dropped.numel() / max(groups.numel(), 1)
        keep = keep & signal
    return advantage, keep, filtered


def corrections(
    settings: GRPOSettings,
    old: torch.Tensor,
    behavior: torch.Tensor,
    mask: torch.Tensor,
    segments: Segments,
    tok_adv: torch.Tensor,
) -> tuple[torch.Tensor | None, torch.Tensor | None, torch.Tensor | None]:
    """(tis weights, off-policy keep weights, their product), each (N, T) or None when off, of
    pi_old's logprobs `old` against the engine's `behavior` (offpolicy.py)."""
    tis_w, keep_w = (
        fn(old, behavior, mask, segments, tok_adv) if fn is not None else None
        for fn in (settings.tis, settings.off_policy_mask)
    )
    weights = [w for w in (tis_w, keep_w) if w is not None]
    return tis_w, keep_w, (functools.reduce(torch.mul, weights) if weights else None)


@dataclass(slots=True)
class Seen:
    """pi_old's logprobs and entropies (N, T) as a single-step batch's micro-steps computed them,
    the off-policy weights they derived, and which rows they covered (1 on those rows)."""

    old: torch.Tensor
    ent: torch.Tensor
    covered: torch.Tensor
    tis_w: torch.Tensor | None
    keep_w: torch.Tensor | None

    @classmethod
    def zeros(
        cls,
        mask: torch.Tensor,
        tis: Callable[..., torch.Tensor] | None,
        off_policy_mask: Callable[..., torch.Tensor] | None,
    ) -> Seen:
        z = functools.partial(torch.zeros_like, mask, dtype=torch.float32)
        return cls(
            z(), z(), z(), z() if tis is not None else None, z() if off_policy_mask is not None else None
        )

    def record(
        self,
        idx: torch.Tensor,
        old: torch.Tensor,
        ent: torch.Tensor,
        tis_w: torch.Tensor | None,
        keep_w: torch.Tensor | None,
    ) -> None:
        self.old[idx], self.ent[idx], self.covered[idx] = old, ent, 1.0
        if self.tis_w is not None:
            assert tis_w is not None  # both come from the same `tis`
            self.tis_w[idx] = tis_w
        if self.keep_w is not None:
            assert keep_w is not None  # both come from the same `off_policy_mask`
            self.keep_w[idx] = keep_w


@dataclass(frozen=True, slots=True)
class Targets:
    """One batch's loss inputs, (N, T) like its sequences. mask: float, the tokens in the loss;
    tok_adv: each token's advantage (0 off the mask); old: pi_old's logprobs, or None when `seen`
    is given (a single-step batch: pi_old is its own forward's, detached); ref: the frozen
    reference's logprobs (None: no KL term); corr: the off-policy weights (None: no correction)."""

    batch: TrainBatch
    prep: Prepared
    mask: torch.Tensor
    tok_adv: torch.Tensor
    old: torch.Tensor | None
    ref: torch.Tensor | None
    corr: torch.Tensor | None
    seen: Seen | None
