"""GRPOSettings: every hyper-parameter of the GRPO update in one typed, frozen record.

conf/module/grpo.yaml keeps its flat keys (`module.lr`, `module.kl_coef`, ...); its `_target_`
(`grpo.grpo_module`) reads them with `GRPOSettings.from_config`. A bad value is a ValueError naming
its `module.<key>`. Functions are chosen by config (`_target_` + `_partial_`), as in losses.py,
advantages.py, aggregation.py and offpolicy.py.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields
from typing import Any

import torch
from torch.optim.lr_scheduler import LRScheduler

from polar_pl.module import advantages as adv_fns
from polar_pl.module import aggregation as agg_fns
from polar_pl.module import losses
from polar_pl.module.lora import LoraSpec
from polar_pl.module.prepare import OVERLONG
from polar_pl.module.rollouts import SIDE_ROWS

# Null in the config for these means their default, as it did when they were keyword arguments.
_DEFAULT_WHEN_NULL = ("advantage", "aggregation", "policy_loss")


@dataclass(frozen=True, slots=True)
class GRPOSettings:
    """The model.
    dtype: the weights' torch dtype name (None: float32); attn_implementation: transformers'
        (None: its default, sdpa); gradient_checkpointing: recompute each decoder layer in the
        backward; lora: a LoraSpec (lora.py), None for full fine-tuning.

    Rewards to advantages.
    advantage: fn(rewards (K,), group (K,)) -> (K,), see advantages.py (default group_mean).
    filter_zero_variance: drop groups whose task rewards are all equal.
    side_rows: "own" (side calls are units of their own) or "exclude" (see rollouts.py).
    overlong: None, "call" or "rollout": drop the tokens of calls cut by the length limit, or of
        their whole rollout (see prepare.py).

    The loss.
    policy_loss: fn(logp, old_logp, advantages, mask, segments) -> (loss, clipped), see losses.py
        (default clipped_policy_loss with eps 0.2 / 0.28).
    aggregation: fn(mask, row_index, row_rollout) -> token weights, see aggregation.py.
    kl: fn(logp, ref_logp) -> (N, T) added to the loss with kl_coef (kl_k2 / kl_k3 / kl_k3_plus).
    kl_reward: fn(old_logp, ref_logp) -> (N, T) (kl_k1), summed over a rollout's tokens and
        subtracted from its reward with kl_reward_coef before the advantages.
    kl_monitor: compute the frozen initial model's logprobs every step, with or without a KL term,
        and log train/kl_ref (how far the policy has moved from where it started; one more
        no-grad forward a step).
    entropy_coef: entropy bonus (the loss subtracts entropy_coef x the sampled distribution's
        entropy at each trainable token).
    tis / off_policy_mask: fn(old_logp, behavior_logp, mask, segments, advantages) -> (N, T)
        weights multiplying the policy loss (see offpolicy.py), or None.
    temperature: the sampling temperature of calls that record no sampling settings (the trainer
        otherwise uses each call's recorded temperature / top_p / top_k).

    Optimisation: epochs x minibatches optimiser steps per rollout batch.
    micro_batch_size / micro_batch_tokens: sequences / tokens per forward-backward (None: the
        whole minibatch); logprob_chunk_tokens: tokens per LM-head chunk (None: all at once).
    lr, weight_decay, betas, adam_eps: AdamW's (with LoRA, lora.lr replaces lr when set).
    lr_scheduler: fn(optimizer) -> an LR scheduler stepped after every optimiser step, or None.
    grad_clip: the gradient norm bound (None: no clipping); seed: the minibatch shuffle's.
    push_every: push the weights to the engine after every N optimiser steps.
    """

    dtype: str | None = None
    attn_implementation: str | None = None
    gradient_checkpointing: bool = False
    lora: LoraSpec | None = None

    advantage: Callable[..., torch.Tensor] = functools.partial(adv_fns.group_mean, std_normalize=True)
    filter_zero_variance: bool = True
    side_rows: str = "own"
    overlong: str | None = None

    policy_loss: Callable[..., tuple[torch.Tensor, torch.Tensor]] = functools.partial(
        losses.clipped_policy_loss, eps_low=0.2, eps_high=0.28
    )
    aggregation: Callable[..., torch.Tensor] = agg_fns.token_mean
    kl: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None
    kl_coef: float = 0.0
    kl_reward: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None
    kl_reward_coef: float = 0.0
    kl_monitor: bool = False
    entropy_coef: float = 0.0
    tis: Callable[..., torch.Tensor] | None = None
    off_policy_mask: Callable[..., torch.Tensor] | None = None
    temperature: float = 1.0

    epochs: int = 1
    minibatches: int = 1
    micro_batch_size: int | None = None
    micro_batch_tokens: int | None = None
    logprob_chunk_tokens: int | None = None
    lr: float = 1e-6
    weight_decay: float = 0.0
    betas: tuple[float, float] = (0.9, 0.999)
    adam_eps: float = 1e-8
    lr_scheduler: Callable[[torch.optim.Optimizer], LRScheduler] | None = None
    grad_clip: float | None = 1.0
    seed: int = 0
    push_every: int = 1

    def __post_init__(self) -> None:
        """ValueError naming the module.* key of a bad setting."""
        for key in ("epochs", "minibatches", "push_every"):
            if (value := getattr(self, key)) < 1:
                raise ValueError(f"module.{key}={value}: must be >= 1")
        for key in ("micro_batch_size", "micro_batch_tokens", "logprob_chunk_tokens"):
            if (size := getattr(self, key)) is not None and size < 1:
                raise ValueError(f"module.{key}={size}: must be >= 1 or null")
        if self.kl_coef > 0 and self.kl is None:
            raise ValueError("module.kl_coef > 0 needs module.kl (kl_k2, kl_k3 or kl_k3_plus)")
        if self.kl_coef > 0 and _is(self.kl, losses.kl_k1):
            raise ValueError(
                "module.kl=kl_k1 has zero expected gradient as a loss: use kl_k2 / kl_k3 / kl_k3_plus, "
                "or put k1 in the reward (module.kl_reward with module.kl_reward_coef)"
            )
        if self.kl_reward_coef > 0 and self.kl_reward is None:
            raise ValueError("module.kl_reward_coef > 0 needs module.kl_reward (e.g. kl_k1)")
        if self.side_rows not in SIDE_ROWS:
            raise ValueError(f"module.side_rows={self.side_rows!r}: allowed {', '.join(SIDE_ROWS)}")
        if self.overlong not in OVERLONG:
            raise ValueError(f"module.overlong={self.overlong!r}: allowed null, call, rollout")
        if self.lora is not None and not isinstance(self.lora, LoraSpec):
            raise ValueError(f"module.lora={self.lora!r}: a LoraSpec (LoraSpec.from_config reads a mapping)")
        if len(self.betas) != 2:
            raise ValueError(f"module.betas={list(self.betas)}: two numbers, [beta1, beta2]")

    @classmethod
    def from_config(cls, cfg: Mapping[str, Any]) -> GRPOSettings:
        """The settings from the flat `module.*` keys Hydra passes (functions already built from
        their `_target_`s; `lora` a mapping, `betas` a list). An unknown key is a ValueError naming
        it and the known keys."""
        known = [f.name for f in fields(cls)]
        if unknown := sorted(set(cfg) - set(known)):
            raise ValueError(f"module.{unknown[0]}: unknown key; known: {', '.join(sorted(known))}")
        values = {k: v for k, v in cfg.items() if not (v is None and k in _DEFAULT_WHEN_NULL)}
        if "betas" in values:
            values["betas"] = tuple(values["betas"])
        if "lora" in values:
            values["lora"] = LoraSpec.from_config(values["lora"])
        return cls(**values)

    @property
    def optimizer_lr(self) -> float:
        """AdamW's learning rate: the adapter's own with LoRA when set, else `lr`."""
        return self.lora.lr if self.lora is not None and self.lora.lr is not None else self.lr

    @property
    def needs_ref(self) -> bool:
        """The frozen initial model is needed: KL in the loss or the reward, or KL monitored."""
        return self.kl_coef > 0 or self.kl_reward_coef > 0 or self.kl_monitor

    @property
    def single_step(self) -> bool:
        """One optimiser step per batch: pi_old is the model before that step, so the logprobs of
        the update's forward (detached) are pi_old's and no separate no-grad pass is needed."""
        return self.epochs == 1 and self.minibatches == 1


def _is(fn: Callable[..., Any] | None, target: Callable[..., Any]) -> bool:
    return fn is not None and getattr(fn, "func", fn) is target
