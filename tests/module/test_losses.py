"""Clipped surrogate (clip-higher, dual clip), KL estimators and TIS against hand-computed values."""

from __future__ import annotations

import math

import pytest
import torch

from polar_pl.module.losses import clipped_policy_loss, kl_k1, kl_k3

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
