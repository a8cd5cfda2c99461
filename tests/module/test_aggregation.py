"""Aggregation weights by hand, masks respected, and a split rollout weighing as a merged one."""

from __future__ import annotations

import functools

import pytest
import torch

from polar_pl.module.aggregation import rollout_mean, seq_mean_token_mean, seq_mean_token_sum_norm, token_mean

SUM_NORM = functools.partial(seq_mean_token_sum_norm, max_len=4)
ALL = [token_mean, seq_mean_token_mean, SUM_NORM, rollout_mean]

# Two packed sequences. Sequence 0: row 0 (prompt, 2 sampled) then row 1 (prompt, 1 sampled);
# sequence 1: row 2 (prompt, 2 sampled, prompt) then padding. Rows 0 and 1 are one rollout (0)
# split into two chains; row 2 is rollout 1.
MASK = torch.tensor([[0.0, 1, 1, 0, 1], [0, 1, 1, 0, 0]])
ROWS = torch.tensor([[0, 0, 0, 1, 1], [2, 2, 2, 2, -1]])
ROLLOUT = torch.tensor([0, 0, 1])


@pytest.mark.parametrize(
    ("fn", "expected"),
    [
        # 5 trainable tokens, each 1/5.
        (token_mean, [[0, 1 / 5, 1 / 5, 0, 1 / 5], [0, 1 / 5, 1 / 5, 0, 0]]),
        # K = 2 rollouts; rollout 0 has 2 rows: row 0 tokens 1/(2*2*2), row 1 token 1/(1*2*2);
        # row 2 tokens 1/(2*1*2).
        (seq_mean_token_mean, [[0, 1 / 8, 1 / 8, 0, 1 / 4], [0, 1 / 4, 1 / 4, 0, 0]]),
        # every token 1 / (max_len K) = 1/8.
        (SUM_NORM, [[0, 1 / 8, 1 / 8, 0, 1 / 8], [0, 1 / 8, 1 / 8, 0, 0]]),
        # rollout 0 has 3 tokens: 1/(3*2); rollout 1 has 2: 1/(2*2).
        (rollout_mean, [[0, 1 / 6, 1 / 6, 0, 1 / 6], [0, 1 / 4, 1 / 4, 0, 0]]),
    ],
)
def test_weights_by_hand(fn, expected) -> None:
    w = fn(MASK, ROWS, ROLLOUT)
    assert w.tolist() == [pytest.approx(r) for r in expected]
    assert w.dtype == MASK.dtype


@pytest.mark.parametrize("fn", ALL)
def test_masked_tokens_do_not_count(fn) -> None:
    """A masked token's loss never reaches the scalar, whatever its value."""
    w = fn(MASK, ROWS, ROLLOUT)
    loss = torch.randn(2, 5)
    wild = torch.where(MASK > 0, loss, torch.full_like(loss, 1e6))
    assert float((wild * w).sum()) == pytest.approx(float((loss * w).sum()))
    assert (w[MASK == 0] == 0).all()


@pytest.mark.parametrize("fn", ALL)
def test_nothing_trainable_gives_zero_weights(fn) -> None:
    assert (fn(torch.zeros(2, 5), ROWS, ROLLOUT) == 0).all()


def _layout(split: bool, lengths=(3, 4), other=5):
    """Rollout 0 samples lengths[0] + lengths[1] tokens; rollout 1 samples `other` tokens.

    Merged: rollout 0 is one row (prompt, chunk 1, glue, chunk 2). Split: two rows, each with a
    prompt token then its chunk. Each layout is one padded sequence per row.
    """
    a, b = lengths
    if split:
        rows_masks = [[0] + [1] * a, [0] + [1] * b, [0] + [1] * other]
        rollout = [0, 0, 1]
    else:
        rows_masks = [[0] + [1] * a + [0] + [1] * b, [0] + [1] * other]
        rollout = [0, 1]
    width = max(map(len, rows_masks))
    mask = torch.zeros(len(rows_masks), width)
    rows = torch.full((len(rows_masks), width), -1)
    for i, m in enumerate(rows_masks):
        mask[i, : len(m)] = torch.tensor(m, dtype=torch.float32)
        rows[i, : len(m)] = i
    return mask, rows, torch.tensor(rollout)


@pytest.mark.parametrize("fn", ALL)
@pytest.mark.parametrize("lengths", [(3, 4), (1, 9), (6, 6)])
def test_split_rollout_weighs_as_merged(fn, lengths) -> None:
    """A rollout split into two chains carries the same total weight as the same rollout merged
    into one row, and the other rollout of the batch keeps its weight."""
    totals = []
    for split in (False, True):
        mask, rows, rollout = _layout(split, lengths)
        w = fn(mask, rows, rollout)
        per_rollout = torch.zeros(2).index_add_(0, rollout[rows.clamp(min=0)].flatten(), (w * mask).flatten())
        totals.append(per_rollout)
    assert totals[1].tolist() == pytest.approx(totals[0].tolist())


@pytest.mark.parametrize("fn", ALL)
def test_a_single_rollout_and_an_empty_batch(fn) -> None:
    """One rollout (two chains, 3 tokens) takes all the weight: 1 (sum_norm: tokens / max_len).
    A batch of no sequences and no rows gives empty weights."""
    mask = torch.tensor([[0.0, 1, 1, 0, 1]])
    w = fn(mask, torch.tensor([[0, 0, 0, 1, 1]]), torch.tensor([0, 0]))
    assert float(w.sum()) == pytest.approx(3 / 4 if fn is SUM_NORM else 1.0)
    empty = fn(torch.zeros(0, 4), torch.zeros(0, 4, dtype=torch.long), torch.zeros(0, dtype=torch.long))
    assert empty.shape == (0, 4)


def test_sum_norm_divides_by_max_len() -> None:
    w = seq_mean_token_sum_norm(MASK, ROWS, ROLLOUT)  # default max_len 1024, K = 2
    assert w.tolist() == [pytest.approx([x / 2048 for x in r]) for r in MASK.tolist()]
    w = seq_mean_token_sum_norm(MASK, ROWS, ROLLOUT, max_len=1)
    assert w.tolist() == [pytest.approx([x / 2 for x in r]) for r in MASK.tolist()]
    with pytest.raises(ValueError, match=r"^module.aggregation.max_len=0: must be > 0$"):
        seq_mean_token_sum_norm(MASK, ROWS, ROLLOUT, max_len=0)


@pytest.mark.parametrize(
    ("fn", "expected"),
    [
        (token_mean, [1 / 3, 1 / 3, 1 / 3]),
        # K = 2 (rollout 1 has no trainable token left): 1 / (1 * 1 * 2), then 1 / (2 * 1 * 2)
        (seq_mean_token_mean, [1 / 2, 1 / 4, 1 / 4]),
        (SUM_NORM, [1 / 8, 1 / 8, 1 / 8]),
        (rollout_mean, [1 / 2, 1 / 4, 1 / 4]),
    ],
)
def test_one_token_rollout_and_a_fully_masked_one(fn, expected) -> None:
    """Rollout 0 trains one token, rollout 1 none (all filtered out), rollout 2 two: a one-token
    rollout counts as a rollout; one with nothing trainable does not."""
    mask = torch.tensor([[0.0, 1, 0, 0], [0, 0, 0, 0], [0, 1, 1, 0]])
    rows = torch.tensor([[0] * 4, [1] * 4, [2] * 4])
    w = fn(mask, rows, torch.tensor([0, 1, 2]))
    assert w[mask > 0].tolist() == pytest.approx(expected)


@pytest.mark.parametrize("fn", ALL)
def test_a_single_row_with_a_single_token(fn) -> None:
    w = fn(torch.tensor([[0.0, 1.0, 0.0]]), torch.zeros(1, 3, dtype=torch.long), torch.tensor([0]))
    assert w.tolist() == [[0.0, pytest.approx(1 / 4 if fn is SUM_NORM else 1.0), 0.0]]
