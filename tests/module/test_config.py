"""conf/module/grpo.yaml composes with the real root config and instantiates a GRPOModule whose
variants are the configured functions; each weight_sync option instantiates unbound."""

from __future__ import annotations

import functools

import pytest
from fixture_paths import CONF
from hydra import compose, initialize_config_dir
from hydra.utils import instantiate
from recipes import tiny

from polar_pl.module import aggregation, losses, offpolicy
from polar_pl.module.grpo import GRPOModule
from polar_pl.module.weight_sync import DiskSync, EmbeddedStateDictSync, NoSync, VLLMWeightTransferSync


def module_cfg(tiny_model_dir, *overrides: str):
    """The module group as the tiny model's recipe sets it, unless `overrides` pick another."""
    with initialize_config_dir(config_dir=str(CONF), version_base=None):
        cfg = compose("config", overrides=tiny(f"model_dir={tiny_model_dir}", *overrides))
    return cfg.module


def test_default_module_config(tiny_model_dir) -> None:
    module = instantiate(module_cfg(tiny_model_dir))
    assert isinstance(module, GRPOModule)
    assert isinstance(module.weight_sync, EmbeddedStateDictSync) and module.weight_sync.engine is None
    assert module.settings.advantage.keywords == {"std_normalize": True}
    assert module.settings.aggregation.func is aggregation.token_mean
    assert module.settings.tis.func is offpolicy.tis_token and module.settings.tis.keywords == {"cap": 2.0}
    assert module.settings.policy_loss.func is losses.clipped_policy_loss
    assert module.settings.policy_loss.keywords == {"eps_low": 0.2, "eps_high": 0.28, "dual_clip": None}
    assert (module.settings.kl, module.settings.kl_coef, module.settings.lr, module.settings.push_every) == (
        None,
        0.0,
        3e-2,
        1,
    )
    assert (
        module.settings.side_rows,
        module.settings.overlong,
        module.settings.off_policy_mask,
        module.settings.lr_scheduler,
    ) == (
        "own",
        None,
        None,
        None,
    )
    assert module.settings.betas == (0.9, 0.999)


@pytest.mark.parametrize(
    ("choice", "cls"),
    [
        ("disk", DiskSync),
        ("none", NoSync),
        ("vllm_nccl", VLLMWeightTransferSync),
        ("embedded", EmbeddedStateDictSync),
    ],
)
def test_weight_sync_choices(tiny_model_dir, choice, cls) -> None:
    sync = instantiate(module_cfg(tiny_model_dir, f"module/weight_sync={choice}").weight_sync)
    assert isinstance(sync, cls) and sync.engine is None


def test_variants_by_override(tiny_model_dir) -> None:
    cfg = module_cfg(
        tiny_model_dir,
        "module.aggregation._target_=polar_pl.module.aggregation.seq_mean_token_sum_norm",
        "+module.aggregation.max_len=512",
        "module.kl={_target_: polar_pl.module.losses.kl_k3, _partial_: true}",
        "module.kl_coef=0.05",
        "module.tis=null",
    )
    module = instantiate(cfg)
    assert isinstance(
        module.settings.aggregation, functools.partial
    ) and module.settings.aggregation.keywords == {"max_len": 512}
    assert (
        module.settings.kl.func is losses.kl_k3
        and module.settings.kl_coef == 0.05
        and module.settings.tis is None
    )


def test_gpu_variant_extends_the_default(tiny_model_dir) -> None:
    cfg = module_cfg(tiny_model_dir, "~experiment", "module=grpo_gpu", "module/weight_sync=disk")
    assert (cfg.gradient_checkpointing, cfg.micro_batch_size, cfg.lr) == (True, 1, 1e-6)
    assert cfg.policy_loss.eps_high == 0.28 and cfg.weight_sync._target_.endswith("DiskSync")
    module = instantiate(cfg)
    assert module.model.is_activation_checkpointing
