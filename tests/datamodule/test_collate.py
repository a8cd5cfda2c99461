"""Collation: packing layout, padding waste, errors, and packed logits equal per-row logits."""

from __future__ import annotations

import pytest
import torch

from polar_pl.datamodule.collate import collate, pack_bins, unpack
from polar_pl.trajectory.rows import TrajectoryRow


def row(ids: list[int], *, group: str = "g", rollout: str = "r", reward: float = 0.0) -> TrajectoryRow:
    n = len(ids)
    mask = [int(i % 3 == 2) for i in range(n)]
    return TrajectoryRow(
        input_ids=ids,
        loss_mask=mask,
        behavior_logprobs=[-0.5 * (i + 1) if m else 0.0 for i, m in enumerate(mask)],
        policy_version=[7 if m else -1 for m in mask],
        session_id="s",
        rollout_id=rollout,
        group_id=group,
        reward=reward,
    )


def test_first_fit_decreasing_fills_budget() -> None:
    assert pack_bins([5, 3, 4, 2, 6], 8) == [[4, 3], [0, 1], [2]]
    with pytest.raises(ValueError, match="token_budget=4 is shorter than a row of 5 tokens"):
        pack_bins([5], 4)


def test_packed_layout_positions_rows_and_per_row_tensors() -> None:
    rows = [
        row([11, 12, 13], group="a", rollout="r1", reward=1.0),
        row([21, 22, 23, 24, 25], group="b", rollout="r2"),
        row([31, 32], group="a", rollout="r3", reward=0.5),
    ]
    b = collate(rows, mode="pack", token_budget=8, pad_id=0)
    assert b.input_ids.tolist() == [[21, 22, 23, 24, 25, 11, 12, 13], [31, 32, 0, 0, 0, 0, 0, 0]]
    assert b.position_ids.tolist() == [[0, 1, 2, 3, 4, 0, 1, 2], [0, 1, 0, 1, 2, 3, 4, 5]]
    assert b.row_index.tolist() == [[1, 1, 1, 1, 1, 0, 0, 0], [2, 2, -1, -1, -1, -1, -1, -1]]
    assert b.loss_mask.dtype == torch.float32 and b.loss_mask[0].tolist() == [0, 0, 1, 0, 0, 0, 0, 1]
    assert b.policy_version[0].tolist() == [-1, -1, 7, -1, -1, -1, -1, 7]
    assert b.attention_mask is None
    assert b.rewards.tolist() == [1.0, 0.0, 0.5] and b.advantages.tolist() == [0.0, 0.0, 0.0]
    assert b.group_ids == ["a", "b"] and b.group_index.tolist() == [0, 1, 0]
    assert b.rollout_ids == ["r1", "r2", "r3"] and b.rollout_index.tolist() == [0, 1, 2]
    assert (b.padding_tokens, b.total_tokens, b.padding_waste) == (6, 16, 6 / 16)
    assert unpack(b) == rows


def test_plain_padding_mode() -> None:
    rows = [row([1, 2, 3]), row([4, 5, 6, 7, 8])]
    b = collate(rows, mode="pad", pad_id=9, pad_to_multiple_of=4)
    assert b.input_ids.tolist() == [[1, 2, 3, 9, 9, 9, 9, 9], [4, 5, 6, 7, 8, 9, 9, 9]]
    assert b.attention_mask.tolist() == [[1, 1, 1, 0, 0, 0, 0, 0], [1, 1, 1, 1, 1, 0, 0, 0]]
    assert b.padding_tokens == 8 and unpack(b) == rows


def test_bad_arguments_name_the_key() -> None:
    with pytest.raises(ValueError, match="allowed"):
        collate([row([1])], mode="zip")
    with pytest.raises(ValueError, match="token_budget"):
        collate([row([1])], mode="pack")
    with pytest.raises(ValueError, match="at least one row"):
        collate([], mode="pad")


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_packed_logits_equal_per_row_logits(tiny_model_dir, attn: str) -> None:
    """The tiny Qwen3 model sees each packed row exactly as if it ran alone."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, attn_implementation=attn).eval()
    g = torch.Generator().manual_seed(0)
    lengths = [17, 5, 29, 11, 3, 23]
    rows = [row(torch.randint(10, 8000, (n,), generator=g).tolist()) for n in lengths]
    packed = collate(rows, mode="pack", token_budget=40)
    padded = collate(rows, mode="pad")
    assert packed.input_ids.shape[0] < len(rows)  # rows really share sequences
    with torch.no_grad():
        alone = [model(input_ids=torch.tensor([r.input_ids])).logits[0] for r in rows]
        # use_cache=False: with a KV cache transformers skips the packed-sequence detection
        out_packed = model(
            input_ids=packed.input_ids, position_ids=packed.position_ids, use_cache=False
        ).logits
        out_padded = model(
            input_ids=padded.input_ids, attention_mask=padded.attention_mask, position_ids=padded.position_ids
        ).logits
    for i, ref in enumerate(alone):
        got = out_packed[packed.row_index == i]
        torch.testing.assert_close(got, ref, atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(out_padded[padded.row_index == i], ref, atol=1e-4, rtol=1e-4)
    # the check is not vacuous: without position-id restarts the rows would see each other
    with torch.no_grad():
        leaky = model(input_ids=packed.input_ids, use_cache=False).logits
    second = packed.row_index[0, -1].item()
    assert not torch.allclose(leaky[packed.row_index == second], alone[second], atol=1e-3)
