"""GRPOModule options through update() on hand-built batches: KL in the reward, the LR schedule,
GSPO / CISPO / off-policy masks / overlong masking in a real step, and config errors that name
their key."""

from __future__ import annotations

import functools

import pytest
import torch
from small_model import small_model
from synthetic import mixed_rows, row
from transformers import get_constant_schedule_with_warmup

from polar_pl.datamodule.collate import collate
from polar_pl.module import advantages, losses, offpolicy
from polar_pl.module.grpo import GRPOModule
from polar_pl.module.logprobs import token_logprobs
from polar_pl.module.settings import GRPOSettings

ROWS = [
    row("a0", "a", 1.0, [(2, 5)], 6),
    row("a1", "a", 0.0, [(1, 4), (5, 7)], 8),
    row("a2", "a", 0.5, [(2, 3)], 4, finish=["length"]),
]


def perturbed(module: GRPOModule) -> GRPOModule:
    g = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for p in module.model.parameters():
            p.add_(0.1 * torch.randn(p.shape, generator=g))
    return module


def sgd(module: GRPOModule, lr: float = 0.1) -> torch.optim.SGD:
    return torch.optim.SGD(module.model.parameters(), lr=lr)


def test_kl_in_reward_lowers_each_rollouts_reward_by_its_summed_k1() -> None:
    beta = 0.3
    module = perturbed(
        GRPOModule(model=small_model(), settings=GRPOSettings(kl_reward=losses.kl_k1, kl_reward_coef=beta))
    )
    batch = collate(ROWS, token_budget=16)
    with torch.no_grad():
        pol, _ = token_logprobs(module.model, batch.input_ids, batch.position_ids)
        ref, _ = token_logprobs(module._ref.model, batch.input_ids, batch.position_ids)
    penalty = []
    for r in range(3):
        sel = (batch.row_index == r) & (batch.loss_mask > 0)
        penalty.append(beta * float((pol - ref)[sel].sum()))
    rewards = torch.tensor([1.0, 0.0, 0.5]) - torch.tensor(penalty)
    expected = advantages.group_mean(rewards, torch.zeros(3, dtype=torch.long))
    m = module.update(batch, sgd(module))
    assert batch.advantages.tolist() == pytest.approx(expected.tolist(), abs=1e-4)
    assert m["train/kl_reward_penalty_mean"] == pytest.approx(sum(penalty) / 3, abs=1e-5)


def test_kl_monitor_logs_the_distance_from_the_initial_model_and_leaves_the_step_alone() -> None:
    """kl_monitor computes the reference's logprobs with no KL term: train/kl_ref is 0 before the
    first step, then the k3 estimate of KL(pi_old || initial model) over the sampled tokens, and
    the weights move exactly as without it."""
    batch = collate(ROWS, token_budget=16)
    plain, watched = (
        GRPOModule(model=small_model()),
        GRPOModule(model=small_model(), settings=GRPOSettings(kl_monitor=True)),
    )
    assert plain._ref is None and watched._ref is not None
    first = [module.update(collate(ROWS, token_budget=16), sgd(module)) for module in (plain, watched)]
    assert "train/kl_ref" not in first[0]
    assert first[1]["train/kl_ref"] == pytest.approx(0.0, abs=1e-9)  # the policy is still the reference
    for a, b in zip(plain.model.parameters(), watched.model.parameters(), strict=True):
        assert torch.equal(a, b)
    with torch.no_grad():
        old, _ = token_logprobs(watched.model, batch.input_ids, batch.position_ids)
        ref, _ = token_logprobs(watched._ref.model, batch.input_ids, batch.position_ids)
    d = (ref - old).double()[batch.loss_mask > 0]
    expected = float((d.exp() - d - 1).mean())
    assert expected > 1e-4  # the step moved the policy
    assert watched.update(batch, sgd(watched))["train/kl_ref"] == pytest.approx(expected, rel=1e-4)


def test_lr_schedule_is_stepped_per_optimiser_step() -> None:
    sched = functools.partial(get_constant_schedule_with_warmup, num_warmup_steps=4)
    module = GRPOModule(model=small_model(), settings=GRPOSettings(lr=0.4, lr_scheduler=sched, minibatches=2))
    conf = module.configure_optimizers()
    opt, scheduler = conf["optimizer"], conf["lr_scheduler"]["scheduler"]
    assert conf["lr_scheduler"]["interval"] == "step" and opt.param_groups[0]["lr"] == 0.0
    module.update(collate(mixed_rows(), token_budget=16), opt, scheduler)
    assert module.optimizer_steps == 2 and opt.param_groups[0]["lr"] == pytest.approx(0.4 * 2 / 4)


@pytest.mark.parametrize(
    "loss",
    [
        functools.partial(losses.gspo_policy_loss, eps_low=3e-4, eps_high=4e-4),
        losses.cispo_policy_loss,
        functools.partial(losses.clipped_policy_loss, dual_clip=3.0),
    ],
)
def test_policy_losses_move_probability_toward_positive_advantages(loss) -> None:
    module = GRPOModule(model=small_model(), settings=GRPOSettings(policy_loss=loss))
    batch = collate(ROWS, token_budget=16)
    with torch.no_grad():
        before, _ = token_logprobs(module.model, batch.input_ids, batch.position_ids)
    m = module.update(batch, sgd(module, lr=0.01))
    with torch.no_grad():
        after, _ = token_logprobs(module.model, batch.input_ids, batch.position_ids)
    sampled = batch.loss_mask > 0
    gain = [float((after - before)[(batch.row_index == r) & sampled].mean()) for r in range(3)]
    assert gain[0] > 0 > gain[1], gain  # reward 1 vs 0 in a group of mean 0.5
    assert m["train/optimizer_steps"] == 1.0


def test_off_policy_mask_and_overlong_in_a_step() -> None:
    rows = [row(r.rollout_id, "a", r.reward, [(c["start"], c["start"] + 1) for c in r.meta["calls"]],
                len(r.input_ids), behavior=-50.0) for r in ROWS]  # fmt: skip
    module = GRPOModule(
        model=small_model(),
        settings=GRPOSettings(off_policy_mask=functools.partial(offpolicy.mask_token, low=0.5, high=2.0)),
    )
    m = module.update(collate(rows, token_budget=16), sgd(module))
    assert m["train/off_policy_masked_frac"] == 1.0  # mu = e^-50: every ratio far above 2
    trimmed = GRPOModule(model=small_model(), settings=GRPOSettings(overlong="call")).update(
        collate(ROWS, token_budget=16), sgd(module)
    )
    assert trimmed["train/trainable_tokens"] == 3 + 5 and trimmed["train/truncated_calls"] == 1.0


def test_config_errors_name_the_key() -> None:
    model = small_model()
    for k1 in (losses.kl_k1, functools.partial(losses.kl_k1)):  # as config builds it: a partial
        with pytest.raises(ValueError, match="module.kl=kl_k1 has zero expected gradient as a loss"):
            GRPOModule(model=model, settings=GRPOSettings(kl=k1, kl_coef=0.1))
    with pytest.raises(ValueError, match="module.kl_reward_coef > 0 needs module.kl_reward"):
        GRPOModule(model=model, settings=GRPOSettings(kl_reward_coef=0.1))
    with pytest.raises(ValueError, match="module.micro_batch_tokens=0"):
        GRPOModule(model=model, settings=GRPOSettings(micro_batch_tokens=0))
    with pytest.raises(ValueError, match="module.side_rows"):
        GRPOModule(model=model, settings=GRPOSettings(side_rows="merge")).update(
            collate(ROWS, token_budget=16), sgd(GRPOModule(model=model))
        )
