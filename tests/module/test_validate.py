"""GRPOModule's config checks: each bad setting is a ValueError whose message names its module.*
key; the boundary values are accepted."""

from __future__ import annotations

import functools
import re

import pytest

from polar_pl.module import losses
from polar_pl.module.validate import check_config

GOOD = {
    "epochs": 1, "minibatches": 1, "push_every": 1, "micro_batch_size": None, "micro_batch_tokens": None,
    "logprob_chunk_tokens": None, "kl": None, "kl_coef": 0.0, "kl_reward": None, "kl_reward_coef": 0.0,
}  # fmt: skip
K1_LOSS = (
    "module.kl=kl_k1 has zero expected gradient as a loss: use kl_k2 / kl_k3 / kl_k3_plus, "
    "or put k1 in the reward (module.kl_reward with module.kl_reward_coef)"
)


@pytest.mark.parametrize(
    "bad, message",
    [
        ({"epochs": 0}, "module.epochs=0: must be >= 1"),
        ({"minibatches": 0}, "module.minibatches=0: must be >= 1"),
        ({"push_every": -1}, "module.push_every=-1: must be >= 1"),
        ({"micro_batch_size": 0}, "module.micro_batch_size=0: must be >= 1 or null"),
        ({"micro_batch_tokens": 0}, "module.micro_batch_tokens=0: must be >= 1 or null"),
        ({"logprob_chunk_tokens": 0}, "module.logprob_chunk_tokens=0: must be >= 1 or null"),
        ({"kl_coef": 0.1}, "module.kl_coef > 0 needs module.kl (kl_k2, kl_k3 or kl_k3_plus)"),
        ({"kl_coef": 0.1, "kl": losses.kl_k1}, K1_LOSS),
        ({"kl_coef": 0.1, "kl": functools.partial(losses.kl_k1)}, K1_LOSS),  # as Hydra builds it
        ({"kl_reward_coef": 0.1}, "module.kl_reward_coef > 0 needs module.kl_reward (e.g. kl_k1)"),
    ],
)
def test_bad_settings_name_their_key(bad, message) -> None:
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        check_config(**(GOOD | bad))


@pytest.mark.parametrize(
    "ok",
    [
        {},
        {"micro_batch_size": 1, "micro_batch_tokens": 1, "logprob_chunk_tokens": 1},
        {"kl": losses.kl_k1},  # k1 without a coefficient: not in the loss
        {"kl": functools.partial(losses.kl_k3, clamp=None), "kl_coef": 0.1},
        {"kl": losses.kl_k2, "kl_coef": 0.1, "kl_reward": losses.kl_k1, "kl_reward_coef": 0.1},
    ],
)
def test_boundary_settings_are_accepted(ok) -> None:
    check_config(**(GOOD | ok))
