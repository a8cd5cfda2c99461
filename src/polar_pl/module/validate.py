"""Config checks for GRPOModule: a bad setting is a ValueError naming its module.* key."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from polar_pl.module import losses


def _is(fn: Callable[..., Any] | None, target: Callable[..., Any]) -> bool:
    return fn is not None and getattr(fn, "func", fn) is target


def check_config(
    *,
    epochs: int,
    minibatches: int,
    push_every: int,
    micro_batch_size: int | None,
    micro_batch_tokens: int | None,
    logprob_chunk_tokens: int | None,
    kl: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None,
    kl_coef: float,
    kl_reward: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None,
    kl_reward_coef: float,
) -> None:
    """ValueError naming the module.* key of a bad setting."""
    for key, value in (("epochs", epochs), ("minibatches", minibatches), ("push_every", push_every)):
        if int(value) < 1:
            raise ValueError(f"module.{key}={value}: must be >= 1")
    for key, size in (
        ("micro_batch_size", micro_batch_size),
        ("micro_batch_tokens", micro_batch_tokens),
        ("logprob_chunk_tokens", logprob_chunk_tokens),
    ):
        if size is not None and int(size) < 1:
            raise ValueError(f"module.{key}={size}: must be >= 1 or null")
    if kl_coef > 0 and kl is None:
        raise ValueError("module.kl_coef > 0 needs module.kl (kl_k2, kl_k3 or kl_k3_plus)")
    if kl_coef > 0 and _is(kl, losses.kl_k1):
        raise ValueError(
            "module.kl=kl_k1 has zero expected gradient as a loss: use kl_k2 / kl_k3 / kl_k3_plus, "
            "or put k1 in the reward (module.kl_reward with module.kl_reward_coef)"
        )
    if kl_reward_coef > 0 and kl_reward is None:
        raise ValueError("module.kl_reward_coef > 0 needs module.kl_reward (e.g. kl_k1)")
