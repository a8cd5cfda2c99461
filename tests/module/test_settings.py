"""GRPOSettings' checks: each bad setting is a ValueError whose message names its module.* key; the
boundary values are accepted; `from_config` reads the flat keys Hydra passes."""

from __future__ import annotations

import functools
import re

import pytest
from omegaconf import OmegaConf

from polar_pl.module import advantages, losses
from polar_pl.module.lora import LoraSpec
from polar_pl.module.settings import GRPOSettings

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
        ({"side_rows": "merge"}, "module.side_rows='merge': allowed own, exclude"),
        ({"overlong": "turn"}, "module.overlong='turn': allowed null, call, rollout"),
        ({"betas": (0.9,)}, "module.betas=[0.9]: two numbers, [beta1, beta2]"),
        ({"lora": {"rank": 4}}, "module.lora={'rank': 4}: a LoraSpec (LoraSpec.from_config reads a mapping)"),
    ],
)
def test_bad_settings_name_their_key(bad, message) -> None:
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        GRPOSettings(**bad)


@pytest.mark.parametrize(
    "ok",
    [
        {},
        {"micro_batch_size": 1, "micro_batch_tokens": 1, "logprob_chunk_tokens": 1},
        {"kl": losses.kl_k1},  # k1 without a coefficient: not in the loss
        {"kl": functools.partial(losses.kl_k3, clamp=None), "kl_coef": 0.1},
        {"kl": losses.kl_k2, "kl_coef": 0.1, "kl_reward": losses.kl_k1, "kl_reward_coef": 0.1},
        {"side_rows": "exclude", "overlong": "rollout"},
    ],
)
def test_boundary_settings_are_accepted(ok) -> None:
    GRPOSettings(**ok)


def test_from_config_reads_hydras_containers() -> None:
    """`lora` arrives as a DictConfig, `betas` as a ListConfig; a null function is its default."""
    cfg = OmegaConf.create(
        {"lr": 1e-5, "betas": [0.8, 0.9], "lora": {"rank": 4, "alpha": 8}, "advantage": None}
    )
    s = GRPOSettings.from_config({**cfg})
    assert (s.lr, s.betas, s.lora) == (1e-5, (0.8, 0.9), LoraSpec(rank=4, alpha=8.0))
    assert s.advantage.func is advantages.group_mean
    assert GRPOSettings.from_config({"lora": {"rank": None}}).lora is None


def test_from_config_names_an_unknown_key_and_the_known_ones() -> None:
    """A misspelt key (module.kl_cof=0.1) was a TypeError from deep inside Hydra's instantiate."""
    with pytest.raises(
        ValueError, match=r"^module.kl_cof: unknown key; known: adam_eps, advantage, .*, weight_decay$"
    ):
        GRPOSettings.from_config({"kl_cof": 0.1})


def test_lora_lr_replaces_lr_and_the_reference_follows_the_kl_settings() -> None:
    assert GRPOSettings(lr=1e-6).optimizer_lr == 1e-6
    assert GRPOSettings(lr=1e-6, lora=LoraSpec(rank=4, lr=1e-4)).optimizer_lr == 1e-4
    assert GRPOSettings(lr=1e-6, lora=LoraSpec(rank=4)).optimizer_lr == 1e-6
    assert not GRPOSettings().needs_ref and GRPOSettings(kl_monitor=True).needs_ref
    assert GRPOSettings(kl=losses.kl_k2, kl_coef=0.1).needs_ref
