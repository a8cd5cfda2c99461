"""GRPOModule's construction: the documented defaults (as a config that sets nothing gets them),
loading from model_dir, activation checkpointing, the frozen reference only when KL needs it, and
config errors raised before any model is loaded."""

from __future__ import annotations

import pytest
import torch
from small_model import small_model
from synthetic import row

from polar_pl.datamodule.collate import collate
from polar_pl.module import losses
from polar_pl.module.grpo import GRPOModule
from polar_pl.module.settings import GRPOSettings

ROWS = [row(f"r{i}", "g", float(i), [(1, 2 + i)], 8) for i in range(6)]


def test_defaults() -> None:
    """AdamW lr 1e-6, no weight decay, eps 1e-8; clipped loss eps 0.2 / 0.28; no entropy bonus;
    grad_clip 1.0; no reference model; no activation checkpointing; shuffle seed 0."""
    mod = GRPOModule(model=small_model(), settings=GRPOSettings(minibatches=2))
    (group,) = mod.configure_optimizers().param_groups
    assert (group["lr"], group["betas"], group["eps"], group["weight_decay"]) == (
        1e-6,
        (0.9, 0.999),
        1e-8,
        0.0,
    )
    assert mod.settings.policy_loss.func is losses.clipped_policy_loss
    assert mod.settings.policy_loss.keywords == {"eps_low": 0.2, "eps_high": 0.28}
    assert (mod.settings.entropy_coef, mod.settings.grad_clip, mod._ref) == (0.0, 1.0, None)
    assert not mod.model.is_activation_checkpointing
    # behaviour at lr 0 (ratio 1): the loss is the token mean of -advantage, no entropy term;
    # the gradient applied is clipped to norm 1; the minibatches follow seed 0
    opt = torch.optim.SGD(mod.model.parameters(), lr=0.0)
    applied = []
    opt.register_step_pre_hook(
        lambda *_: applied.append(float(torch.cat([p.grad.flatten() for p in mod.model.parameters()]).norm()))
    )
    batch = collate(ROWS, mode="pad")
    m = mod.update(batch, opt)
    r = torch.arange(6, dtype=torch.float64)
    adv = (r - r.mean()) / (r.std() + 1e-6)
    assert m["train/loss"] == pytest.approx(float(-(adv * (r + 1)).sum() / 21), rel=1e-5)
    assert m["train/grad_norm"] > 1.0 and applied == pytest.approx([1.0, 1.0], rel=1e-4)
    norms = {}
    for seed in (0, 1):  # the minibatch split shows in the mean pre-clip gradient norm
        other = GRPOModule(model=small_model(), settings=GRPOSettings(minibatches=2, seed=seed))
        norms[seed] = other.update(
            collate(ROWS, mode="pad"), torch.optim.SGD(other.model.parameters(), lr=0.0)
        )
    assert m["train/grad_norm"] == norms[0]["train/grad_norm"] != norms[1]["train/grad_norm"]


def test_model_dir_loads_the_model(tiny_model_dir) -> None:
    mod = GRPOModule(
        tiny_model_dir,
        settings=GRPOSettings(dtype="bfloat16", attn_implementation="eager", gradient_checkpointing=True),
    )
    assert mod.model_dir == tiny_model_dir and mod.model.training
    assert next(mod.model.parameters()).dtype == torch.bfloat16
    assert mod.model.config._attn_implementation == "eager"
    assert mod.model.is_activation_checkpointing
    with pytest.raises(ValueError, match=r"^GRPOModule needs module.model_dir \(or a model\)$"):
        GRPOModule()


def test_reference_only_when_kl_needs_it() -> None:
    assert (
        GRPOModule(model=small_model(), settings=GRPOSettings(kl_coef=0.0, kl_reward_coef=0.0))._ref is None
    )
    assert (
        GRPOModule(model=small_model(), settings=GRPOSettings(kl=losses.kl_k2, kl_coef=0.1))._ref is not None
    )
    assert (
        GRPOModule(
            model=small_model(), settings=GRPOSettings(kl_reward=losses.kl_k1, kl_reward_coef=0.1)
        )._ref
        is not None
    )


@pytest.mark.parametrize("key", ["micro_batch_size", "logprob_chunk_tokens"])
def test_sizes_are_checked_at_construction(key) -> None:
    with pytest.raises(ValueError, match=f"module.{key}=0"):
        GRPOModule(model=small_model(), settings=GRPOSettings(**{key: 0}))
