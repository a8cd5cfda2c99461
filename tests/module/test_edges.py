"""Edge values the hand-computed tests leave out: inclusive ratio bounds, defaults as configs
leave them, segments with masked tokens, non-zero old logprobs, unclamped KL past the float
guard, the optimizer's settings, the logits fallback with an attention mask."""

from __future__ import annotations

import math

import pytest
import torch
from small_model import small_model

from polar_pl.module.grpo import GRPOModule
from polar_pl.module.logprobs import Sampling, token_logprobs
from polar_pl.module.losses import cispo_policy_loss, gspo_policy_loss, kl_k3, kl_k3_plus
from polar_pl.module.offpolicy import mask_sequence, mask_sequence_kl, mask_token, tis_sequence, tis_token
from polar_pl.module.segments import Segments
from polar_pl.module.settings import GRPOSettings

L = math.log


def one_segment(n: int) -> Segments:
    return Segments(
        torch.zeros(1, n, dtype=torch.long),
        torch.zeros(1, dtype=torch.long),
        torch.zeros(1, dtype=torch.long),
    )


def test_ratio_bounds_are_inclusive() -> None:
    """Ratios exactly at low and at high are kept (exp(0) = 1 is exact)."""
    old, beh, m = torch.zeros(1, 1), torch.zeros(1, 1, dtype=torch.float64), torch.ones(1, 1)
    seg = one_segment(1)
    for fn in (mask_token, mask_sequence):
        assert fn(old, beh, m, seg, low=1.0, high=1.0).tolist() == [[1.0]]


def test_mask_defaults() -> None:
    """Defaults keep ratios in [0.5, 2]: 0.45 and 2.2 out, 0.55 and 1.9 in; both TIS cap at 2."""
    old = torch.tensor([[L(0.45), L(0.55), L(1.9), L(2.2)]])
    beh, m = torch.zeros(1, 4, dtype=torch.float64), torch.ones(1, 4)
    seg = Segments(torch.arange(4)[None], torch.zeros(4, dtype=torch.long), torch.arange(4))
    assert mask_token(old, beh, m).tolist() == [[0.0, 1.0, 1.0, 0.0]]
    assert mask_sequence(old, beh, m, seg).tolist() == [[0.0, 1.0, 1.0, 0.0]]
    big, zero, one = torch.full((1, 1), 5.0), torch.zeros(1, 1, dtype=torch.float64), torch.ones(1, 1)
    assert tis_sequence(big, zero, one, one_segment(1)).tolist() == [[2.0]]
    assert tis_token(big, zero, one).tolist() == [[2.0]]


def test_deepseek_mask_edges() -> None:
    """Mean (not summed) drift per call; zero and small positive advantages are never masked;
    a drift exactly at delta is kept; the default delta is 0.01."""
    old = torch.tensor([[0.0, 0.0]])
    beh = torch.tensor([[0.3, 0.3]], dtype=torch.float64)  # mean log(mu / pi_old) 0.3, sum 0.6
    m, seg = torch.ones(1, 2), one_segment(2)
    neg = torch.full((1, 2), -1.0)
    assert mask_sequence_kl(old, beh, m, seg, neg, delta=0.5).tolist() == [[1.0, 1.0]]
    assert mask_sequence_kl(old, beh, m, seg, neg, delta=0.2).tolist() == [[0.0, 0.0]]
    for adv in (0.0, 0.5):
        assert mask_sequence_kl(old, beh, m, seg, torch.full((1, 2), adv), delta=0.2).tolist() == [[1.0, 1.0]]
    at = torch.tensor([[0.25, 0.25]], dtype=torch.float64)
    assert mask_sequence_kl(old, at, m, seg, neg, delta=0.25).tolist() == [[1.0, 1.0]]
    small = torch.tensor([[0.02, 0.02]], dtype=torch.float64)
    assert mask_sequence_kl(old, small, m, seg, neg).tolist() == [[0.0, 0.0]]


def test_gspo_mean_over_trainable_tokens_only() -> None:
    """A segment token left out of the loss (mask 0) does not enter the segment's mean ratio; a
    one-token segment's mean is its own log ratio."""
    logp = torch.zeros(1, 3)
    old = torch.tensor([[-0.1, -5.0, -0.05]])
    seg = Segments(torch.tensor([[0, 0, 1]]), torch.zeros(2, dtype=torch.long), torch.arange(2))
    mask = torch.tensor([[1.0, 0.0, 1.0]])
    loss, _ = gspo_policy_loss(logp, old, torch.ones(1, 3), mask, seg, eps_low=1.0, eps_high=1.0)
    assert loss.tolist()[0][0] == pytest.approx(-math.exp(0.1)) and loss.tolist()[0][2] == pytest.approx(
        -math.exp(0.05)
    )
    default, _ = gspo_policy_loss(logp, old, torch.ones(1, 3), mask, seg)
    assert default.tolist()[0][0] == pytest.approx(-(1 + 4e-4))  # clipped at the paper's eps_high


def test_cispo_ratio_against_nonzero_old_and_lower_bound() -> None:
    logp = torch.tensor([[L(0.3), L(0.3)]], requires_grad=True)
    old = torch.tensor([[L(0.6), L(0.1)]])  # ratios 0.5 and 3
    loss, clipped = cispo_policy_loss(logp, old, torch.ones(1, 2), eps_low=0.2, eps_high=0.28)
    assert loss.tolist()[0] == pytest.approx([-0.8 * L(0.3), -1.28 * L(0.3)])
    assert clipped.tolist() == [[True, True]]
    default, _ = cispo_policy_loss(logp, old, torch.ones(1, 2))
    assert default.tolist()[0][0] == pytest.approx(-0.5 * L(0.3))  # eps_low 1: no lower bound


def test_unclamped_kl_past_the_float_guard() -> None:
    logp, ref = torch.zeros(1, 2), torch.tensor([[25.0, -25.0]])
    # d = ref - logp is clipped to +-20 before exp, whatever the value clamp
    assert kl_k3(logp, ref, clamp=None).tolist()[0] == pytest.approx([math.exp(20) - 21, math.exp(-20) + 19])
    assert kl_k3_plus(torch.zeros(1, 1), torch.full((1, 1), 6.0), clamp=None).tolist() == [
        [pytest.approx(math.exp(6) - 7)]
    ]


def test_optimizer_takes_the_configured_settings() -> None:
    m = GRPOModule(
        model=small_model(), settings=GRPOSettings(lr=0.3, betas=(0.5, 0.6), adam_eps=1e-3, weight_decay=0.2)
    )
    (group,) = m.configure_optimizers().param_groups
    assert (group["lr"], group["betas"], group["eps"], group["weight_decay"]) == (0.3, (0.5, 0.6), 1e-3, 0.2)


def test_uniform_sampling_is_the_raw_distribution() -> None:
    model = small_model()
    ids = torch.randint(0, 40, (1, 6), generator=torch.Generator().manual_seed(0))
    pos = torch.arange(6)[None]
    with torch.no_grad():
        a, _ = token_logprobs(model, ids, pos, sampling=Sampling.uniform(ids))
        b = torch.log_softmax(model(input_ids=ids, position_ids=pos).logits[0, :-1], -1)
    assert a[0, 1:].tolist() == pytest.approx(b.gather(-1, ids[0, 1:, None]).squeeze(-1).tolist(), abs=1e-5)


def test_logits_fallback_passes_the_attention_mask() -> None:
    """A model without a base_model / LM head split gets the pad-mode attention mask too."""
    hf = small_model()

    class Wrapper(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.inner = hf

        def forward(self, **kw):
            return self.inner(**kw)

    ids = torch.tensor([[5, 6, 7, 0, 0], [8, 9, 10, 11, 12]])
    attn = torch.tensor([[0, 1, 1, 1, 1], [1, 1, 1, 1, 1]])  # left padding moves the real tokens
    pos = torch.tensor([[0, 0, 1, 2, 3], [0, 1, 2, 3, 4]])
    with torch.no_grad():
        a, _ = token_logprobs(Wrapper(), ids, pos, attn)
        b, _ = token_logprobs(hf, ids, pos, attn)
        c, _ = token_logprobs(Wrapper(), ids, pos)
    assert torch.allclose(a, b, atol=1e-6) and not torch.allclose(a, c, atol=1e-4)
