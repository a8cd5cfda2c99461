"""Off-policy corrections by hand: truncated importance weights (token, per call), ratio masks
(token, per call) and DeepSeek-style masking of drifted negative-advantage calls."""

from __future__ import annotations

import math

import pytest
import torch

from polar_pl.module.offpolicy import mask_sequence, mask_sequence_kl, mask_token, tis_sequence, tis_token
from polar_pl.module.segments import Segments

L = math.log

# One packed sequence: a prompt token, call 0 (2 tokens), glue, call 1 (1 token), then a prompt
# token with a wild behaviour value that must never count.
OLD = torch.tensor([[0.0, L(2.0), L(2.0), 0.0, L(0.5), 0.0]])
BEHAVIOR = torch.tensor([[0.0, 0.0, 0.0, 0.0, 0.0, -50.0]], dtype=torch.float64)
MASK = torch.tensor([[0.0, 1.0, 1.0, 0.0, 1.0, 0.0]])
SEG = Segments(torch.tensor([[-1, 0, 0, -1, 1, -1]]), torch.tensor([0, 0]), torch.tensor([0, 1]))
ADV = torch.tensor([[0.0, -1.0, -1.0, 0.0, 1.0, 0.0]])


def test_tis_token_caps_and_masks() -> None:
    old = torch.tensor([[L(0.5), L(0.25), L(0.9)]])
    behavior = torch.tensor([[L(0.25), L(0.5), L(0.1)]], dtype=torch.float64)
    w = tis_token(old, behavior, torch.tensor([[1.0, 1.0, 0.0]]), cap=1.5)
    # ratios 2 -> capped 1.5, 0.5 kept, masked token 0 (its ratio 9 is ignored).
    assert w.tolist()[0] == pytest.approx([1.5, 0.5, 0.0]) and w.dtype == torch.float32


def test_tis_sequence_one_weight_per_call() -> None:
    """Per call, not per row: over the whole row the product would be 4 * 0.5 = 2 for every token."""
    w = tis_sequence(OLD, BEHAVIOR, MASK, SEG, ADV, cap=3.0)
    assert w.tolist()[0] == pytest.approx([0.0, 3.0, 3.0, 0.0, 0.5, 0.0])  # call 0: 4 -> 3
    w = tis_sequence(OLD, BEHAVIOR, MASK, SEG, ADV, cap=3.0, length_norm=True)
    assert w.tolist()[0] == pytest.approx([0.0, 2.0, 2.0, 0.0, 0.5, 0.0])  # geometric means


def test_masks_by_ratio_bounds() -> None:
    assert mask_token(OLD, BEHAVIOR, MASK, SEG, ADV, low=0.6, high=2.01).tolist()[0] == [0, 1, 1, 0, 0, 0]
    # per call: geometric mean 2 (call 0) and 0.5 (call 1); the product would be 4 for call 0
    assert mask_sequence(OLD, BEHAVIOR, MASK, SEG, ADV, low=0.4, high=2.01).tolist()[0] == [0, 1, 1, 0, 1, 0]
    assert mask_sequence(OLD, BEHAVIOR, MASK, SEG, ADV, low=0.4, high=3.0, length_norm=False).tolist()[0] == [
        0, 0, 0, 0, 1, 0,
    ]  # fmt: skip


def test_deepseek_mask_drops_drifted_negative_calls_only() -> None:
    # mean log(mu / pi_old): call 0 = -log 2 (mu below pi_old), call 1 = log 2 > delta.
    w = mask_sequence_kl(OLD, BEHAVIOR, MASK, SEG, ADV, delta=0.1)
    assert w.tolist()[0] == [0, 1, 1, 0, 1, 0]  # call 1 drifted but its advantage is positive
    w = mask_sequence_kl(OLD, BEHAVIOR, MASK, SEG, -ADV, delta=0.1)
    assert w.tolist()[0] == [0, 1, 1, 0, 0, 0]
    assert mask_sequence_kl(OLD, BEHAVIOR, MASK, SEG, -ADV, delta=1.0).tolist()[0] == [0, 1, 1, 0, 1, 0]


def test_a_masked_token_inside_a_call_never_counts() -> None:
    """Token 1 belongs to call 0 but is out of the loss (mask 0) with a wild ratio e^5: the call's
    product and mean are those of token 2 alone (ratio 1.5)."""
    old = torch.tensor([[0.0, 5.0, L(1.5)]])
    behavior = torch.zeros(1, 3, dtype=torch.float64)
    mask = torch.tensor([[0.0, 0.0, 1.0]])
    seg = Segments(torch.tensor([[-1, 0, 0]]), torch.tensor([0]), torch.tensor([0]))
    adv = torch.tensor([[0.0, 0.0, -1.0]])
    for length_norm in (False, True):
        w = tis_sequence(old, behavior, mask, seg, adv, cap=10.0, length_norm=length_norm)
        assert w.tolist()[0] == pytest.approx([0.0, 0.0, 1.5])
    assert mask_sequence(old, behavior, mask, seg, adv, length_norm=False).tolist()[0] == [0.0, 0.0, 1.0]
    # DeepSeek mask: log(mu / pi_old) of token 2 alone is 0.5 > delta (dropped); token 1's -5
    # would pull the call's estimate below delta.
    drifted = torch.tensor([[0.0, 0.0, 0.5 + L(1.5)]], dtype=torch.float64)
    assert mask_sequence_kl(old, drifted, mask, seg, adv, delta=0.1).tolist()[0] == [0.0, 0.0, 0.0]
