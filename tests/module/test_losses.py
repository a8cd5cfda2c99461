"""Policy losses (PPO clip-higher and dual clip, GSPO, CISPO) and KL estimators, values and
gradients against hand-computed numbers."""

from __future__ import annotations

import math

import pytest
import torch

from polar_pl.module.losses import (
    cispo_policy_loss,
    clipped_policy_loss,
    gspo_policy_loss,
    kl_k1,
    kl_k2,
    kl_k3,
    kl_k3_plus,
)
from polar_pl.module.segments import Segments

L = math.log


def test_clip_higher_branches_by_hand() -> None:
    ratios = [1.5, 0.5, 1.1, 0.7]
    adv = torch.tensor([[1.0, 1.0, -1.0, -1.0]])
    old = torch.zeros(1, 4)
    logp = torch.tensor([[L(r) for r in ratios]], requires_grad=True)
    loss, clipped = clipped_policy_loss(logp, old, adv, eps_low=0.2, eps_high=0.28)
    # r=1.5, A=+1: max(-1.5, -1.28) = -1.28 (clipped high); r=0.5, A=+1: max(-0.5, -0.8) = -0.5;
    # r=1.1, A=-1: 1.1 inside the band; r=0.7, A=-1: max(0.7, 0.8) = 0.8 (clipped low).
    assert loss.tolist()[0] == pytest.approx([-1.28, -0.5, 1.1, 0.8])
    assert clipped.tolist() == [[True, False, False, True]]
    loss.sum().backward()
    # d(-A r)/dlogp = -A r on unclipped tokens, 0 where the clipped branch was taken.
    assert logp.grad.tolist()[0] == pytest.approx([0.0, -0.5, 1.1, 0.0])


def test_dual_clip_bounds_negative_advantage_loss() -> None:
    logp = torch.tensor([[L(5.0), L(5.0)]])
    adv = torch.tensor([[-1.0, 1.0]])
    plain, _ = clipped_policy_loss(logp, torch.zeros(1, 2), adv)
    assert plain.tolist()[0] == pytest.approx([5.0, -1.28])
    loss, clipped = clipped_policy_loss(logp, torch.zeros(1, 2), adv, dual_clip=3.0)
    assert loss.tolist()[0] == pytest.approx([3.0, -1.28]) and clipped.tolist() == [[True, True]]
    with pytest.raises(ValueError, match="dual_clip"):
        clipped_policy_loss(logp, torch.zeros(1, 2), adv, dual_clip=1.0)


def test_huge_ratio_stays_finite() -> None:
    logp = torch.tensor([[0.0]], requires_grad=True)
    loss, _ = clipped_policy_loss(logp, torch.tensor([[-500.0]]), torch.tensor([[-1.0]]))
    loss.sum().backward()
    assert torch.isfinite(loss).all() and torch.isfinite(logp.grad).all()


def test_kl_estimators() -> None:
    logp, ref = torch.tensor([[L(0.5), L(0.25)]]), torch.tensor([[L(0.25), L(0.25)]])
    assert kl_k1(logp, ref).tolist()[0] == pytest.approx([L(2.0), 0.0])
    # k3 with d = ref - logp = log(1/2): 1/2 - log(1/2) - 1.
    assert kl_k3(logp, ref).tolist()[0] == pytest.approx([0.5 + L(2.0) - 1.0, 0.0])
    assert (kl_k3(torch.randn(3, 7), torch.randn(3, 7)) >= 0).all()


def _grad(fn, logp: torch.Tensor) -> list[float]:
    x = logp.clone().requires_grad_(True)
    fn(x).sum().backward()
    return x.grad.flatten().tolist()


def test_kl_gradients_by_hand() -> None:
    """k2 and k3+ carry the on-policy KL gradient (logp - ref); k3 is clamped: unclamped, its
    gradient at a log-ratio of 6 is -(e^6 - 1) = -402."""
    logp, ref = torch.tensor([[L(0.5), 0.0]]), torch.tensor([[L(0.25), 6.0]])
    assert kl_k2(logp, ref).tolist()[0] == pytest.approx([0.5 * L(2) ** 2, 18.0])
    assert _grad(lambda x: kl_k2(x, ref), logp) == pytest.approx([L(2), -6.0])
    # k3: d = ref - logp = (-log 2, 6); value exp(d) - d - 1, clamped at 10.
    assert kl_k3(logp, ref).tolist()[0] == pytest.approx([0.5 + L(2) - 1.0, 10.0])
    assert _grad(lambda x: kl_k3(x, ref), logp) == pytest.approx([0.5, 0.0])
    assert _grad(lambda x: kl_k3(x, ref, clamp=None), logp) == pytest.approx([0.5, -(math.exp(6) - 1)])
    assert kl_k3_plus(logp, ref).tolist()[0] == pytest.approx([0.5 + L(2) - 1.0, 10.0])
    assert _grad(lambda x: kl_k3_plus(x, ref), logp) == pytest.approx([L(2), -6.0])
    assert _grad(lambda x: kl_k1(x, ref), logp) == [1.0, 1.0]


def _segments(index: list[list[int]]) -> Segments:
    idx = torch.tensor(index)
    s = int(idx.max()) + 1
    return Segments(idx, torch.zeros(s, dtype=torch.long), torch.arange(s))


def test_gspo_one_ratio_per_call() -> None:
    # call 0: log ratios 0.1, 0.3 -> s = e^0.2 inside the band; call 1: log ratio 0.5 -> s = e^0.5
    # above 1 + eps_high: clipped, no grad. A masked prompt token (its ratio is wild) never counts.
    old = torch.tensor([[0.0, -0.1, -0.3, 5.0, -0.5]])
    logp = torch.zeros(1, 5, requires_grad=True)
    mask = torch.tensor([[0.0, 1.0, 1.0, 0.0, 1.0]])
    seg = _segments([[-1, 0, 0, -1, 1]])
    loss, clipped = gspo_policy_loss(logp, old, torch.ones(1, 5), mask, seg, eps_low=0.2, eps_high=0.28)
    s0 = math.exp(0.2)
    assert loss.tolist()[0][1:3] == pytest.approx([-s0, -s0]) and loss.tolist()[0][4] == pytest.approx(-1.28)
    assert clipped.tolist()[0][1:3] == [False, False] and clipped.tolist()[0][4] is True
    (loss * mask).sum().backward()
    assert logp.grad.tolist()[0] == pytest.approx([0.0, -s0, -s0, 0.0, 0.0])


def test_cispo_weights_every_token() -> None:
    logp = torch.tensor([[L(1.5), L(0.5), L(1.1)]], requires_grad=True)
    adv = torch.tensor([[1.0, -1.0, 1.0]])
    loss, clipped = cispo_policy_loss(logp, torch.zeros(1, 3), adv)
    # weights sg(clip(r, 0, 1.28)) = 1.28, 0.5, 1.1; loss = -w A logp
    assert loss.tolist()[0] == pytest.approx([-1.28 * L(1.5), 0.5 * L(0.5), -1.1 * L(1.1)])
    assert clipped.tolist() == [[True, False, False]]
    loss.sum().backward()
    assert logp.grad.tolist()[0] == pytest.approx([-1.28, 0.5, -1.1])


def test_gspo_default_band_is_the_papers() -> None:
    """eps (3e-4, 4e-4) by default: a call whose sequence ratio moved 1% is clipped on both sides."""
    old = torch.tensor([[0.01, 0.01, -0.01, -0.01]])
    logp = torch.zeros(1, 4)
    seg = _segments([[0, 0, 1, 1]])
    adv = torch.tensor([[-1.0, -1.0, 1.0, 1.0]])
    loss, clipped = gspo_policy_loss(logp, old, adv, torch.ones(1, 4), seg)
    # call 0: s = e^-0.01 < 1 - 3e-4, A < 0 -> loss 1 - 3e-4; call 1: s = e^0.01, A > 0 -> -(1 + 4e-4)
    assert loss.tolist()[0] == pytest.approx([0.9997, 0.9997, -1.0004, -1.0004], abs=1e-6)
    assert clipped.tolist() == [[True] * 4]


def test_cispo_log_ratio_is_floored_at_the_guard() -> None:
    """Like every ratio here, CISPO's is exp of a log-ratio clamped to [-20, 20]."""
    logp = torch.tensor([[-30.0]])
    loss, clipped = cispo_policy_loss(logp, torch.zeros(1, 1), torch.ones(1, 1))
    assert loss.item() == pytest.approx(30 * math.exp(-20), rel=1e-4) and clipped.tolist() == [[False]]


def test_ppo_default_band_and_a_dual_clip_just_above_one() -> None:
    # defaults eps (0.2, 0.28): r = 0.5 with A < 0 is lifted to 0.8; r = 1.5 with A > 0 capped at 1.28.
    logp = torch.tensor([[L(0.5), L(1.5), L(5.0)]])
    adv = torch.tensor([[-1.0, 1.0, -1.0]])
    loss, _ = clipped_policy_loss(logp, torch.zeros(1, 3), adv)
    assert loss.tolist()[0] == pytest.approx([0.8, -1.28, 5.0])
    loss, clipped = clipped_policy_loss(logp, torch.zeros(1, 3), adv, dual_clip=1.5)
    assert loss.tolist()[0] == pytest.approx([0.8, -1.28, 1.5]) and clipped.tolist() == [[True] * 3]


def test_sequence_and_token_log_ratios_are_clamped_at_the_guard() -> None:
    """Log-ratios past +-20 are clamped before exp(), in the token (PPO) and sequence (GSPO) ratio."""
    loss, _ = clipped_policy_loss(torch.tensor([[-30.0]]), torch.zeros(1, 1), torch.ones(1, 1))
    assert loss.item() == pytest.approx(-math.exp(-20), rel=1e-4)
    old = torch.tensor([[30.0, 30.0, -30.0, -30.0]])
    adv = torch.tensor([[1.0, 1.0, -1.0, -1.0]])
    loss, _ = gspo_policy_loss(torch.zeros(1, 4), old, adv, torch.ones(1, 4), _segments([[0, 0, 1, 1]]))
    # call 0: s = e^-20, A > 0 -> -s (unclipped); call 1: s = e^20, A < 0 -> s (unclipped)
    assert loss.tolist()[0] == pytest.approx([-math.exp(-20)] * 2 + [math.exp(20)] * 2, rel=1e-4)


def test_a_ratio_exactly_at_the_dual_bound_is_not_dual_clipped() -> None:
    logp = torch.tensor([[L(3.0)]], requires_grad=True)
    c = float(torch.exp(logp.detach()))  # the ratio as computed, so the tie is exact
    loss, clipped = clipped_policy_loss(logp, torch.zeros(1, 1), torch.tensor([[-1.0]]), dual_clip=c)
    assert loss.item() == c and clipped.tolist() == [[False]]
    loss.sum().backward()
    assert logp.grad.item() == pytest.approx(c)  # the unclipped branch: d(-A r)/dlogp = r
