"""Rows -> statistics units (side rows their own units or excluded), call segments, per-call
sampling settings and overlong masking, by hand on ragged, split-rollout, side-row batches."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from synthetic import mixed_rows, row

from polar_pl.datamodule.collate import collate
from polar_pl.module.prepare import prepare
from polar_pl.module.rollouts import rollout_rewards, rollouts
from polar_pl.module.segments import call_info, call_segments, sampling_of

T = torch.tensor


def test_side_rows_are_their_own_units() -> None:
    """The side-row crash: a title row (side_reward 0) kept its rollout's id, so the rollout had
    two rewards and `rollout_rewards` raised 'rows of one rollout disagree on reward or group'."""
    b = collate(mixed_rows(), token_budget=16)
    u = rollouts(b)
    assert u.ids == ["a0", "a1", "a2", "b0", "b1", "a0/side"]
    assert u.reward.tolist() == [1.0, 0.0, 0.5, 1.0, 0.0, 0.0]
    assert u.group.tolist() == [0, 0, 0, 1, 1, 2]  # a side group per task group
    assert u.row.tolist() == [0, 0, 5, 1, 2, 3, 4] and u.side.tolist() == [False] * 5 + [True]
    ex = rollouts(b, "exclude")
    assert ex.row.tolist() == [0, 0, -1, 1, 2, 3, 4] and ex.reward.tolist() == [1.0, 0.0, 0.5, 1.0, 0.0]
    with pytest.raises(ValueError, match="module.side_rows"):
        rollouts(b, "merge")


def test_disagreeing_rows_name_the_rollout() -> None:
    rows = mixed_rows()
    rows[1] = replace(rows[1], reward=0.25)
    with pytest.raises(
        ValueError, match=r"rows of rollout a0 disagree on reward or group \(rewards \[0.25, 1.0\]\)"
    ):
        rollouts(collate(rows, token_budget=16))
    rewards, group = rollout_rewards(T([1.0, 1.0, 0.0, 9.0]), T([0, 0, 2, -1]), T([0, 0, 1, 1]))
    assert rewards.tolist() == [1.0, 0.0, 0.0] and group.tolist() == [0, -1, 1]  # row -1 ignored
    with pytest.raises(
        ValueError, match=r"^rows of rollout 1 disagree on reward or group \(rewards \[0.0, 1.0\]\)$"
    ):
        rollout_rewards(T([1.0, 0.0, 1.0]), T([0, 1, 1]), T([0, 0, 0]))  # no ids: the index
    with pytest.raises(ValueError, match=r"^module.side_rows='merge': allowed own, exclude$"):
        rollouts(collate(rows, token_budget=16), "merge")


def test_segments_are_calls() -> None:
    rows = mixed_rows()
    b = collate(rows, token_budget=16)
    s = call_segments(b.loss_mask, b.row_index, b.position_ids, b.row_meta)
    per_row = {}
    for seg, (r, k) in enumerate(zip(s.row.tolist(), s.ordinal.tolist(), strict=True)):
        per_row.setdefault(r, []).append(k)
        where = (s.index == seg).nonzero()
        positions = sorted(b.position_ids[where[:, 0], where[:, 1]].tolist())
        start = rows[r].meta["calls"][k]["start"]
        assert positions[0] == start and len(positions) == positions[-1] - start + 1  # contiguous
    assert per_row == {0: [0, 1], 1: [0], 2: [0], 3: [0, 1, 2], 4: [0], 5: [0], 6: [0]}
    assert (s.index[b.loss_mask == 0] == -1).all()


def test_touching_calls_split_only_by_recorded_starts() -> None:
    touching = row("r", "g", 1.0, [(2, 4), (4, 6)], 7)
    b = collate([touching], token_budget=8)
    assert call_segments(b.loss_mask, b.row_index, b.position_ids, b.row_meta).count == 2
    bare = collate([replace(touching, meta={})], token_budget=8)
    assert call_segments(bare.loss_mask, bare.row_index, bare.position_ids, bare.row_meta).count == 1


def test_sampling_settings_per_call() -> None:
    r = row("r", "g", 1.0, [(1, 3), (4, 6)], 6, sampling=[{"temperature": 0.7, "top_p": 0.5}, {"top_k": 5}])
    b = collate([r, row("q", "g", 0.0, [(1, 2)], 3)], token_budget=10)
    s = call_segments(b.loss_mask, b.row_index, b.position_ids, b.row_meta)
    samp = sampling_of(s, call_info(s, b.row_meta), default_temperature=0.9)
    at = {int(p): i for i, p in enumerate(b.position_ids[0].tolist()) if b.row_index[0, i] == 0}
    assert float(samp.temperature[0, at[1]]) == pytest.approx(0.7) and float(samp.top_p[0, at[2]]) == 0.5
    assert int(samp.top_k[0, at[4]]) == 5 and float(samp.temperature[0, at[5]]) == pytest.approx(0.9)
    assert float(samp.top_p[0, at[0]]) == 1.0 and int(samp.top_k[0, at[1]]) == -1  # prompt / defaults


@pytest.mark.parametrize(("overlong", "kept"), [(None, 12), ("call", 10), ("rollout", 5)])
def test_overlong_masking(overlong, kept) -> None:
    """a0 (two chains: calls of 2, 2 and 3 tokens) has its second call cut by the length limit."""
    rows = [
        row("a0", "a", 1.0, [(2, 4), (6, 8)], 9, finish=["stop", "length"]),
        row("a0", "a", 1.0, [(3, 6)], 7),
        row("a1", "a", 0.0, [(1, 5)], 6),
        row("a2", "a", 0.0, [(1, 2)], 3),
    ]
    p = prepare(collate(rows, token_budget=16), overlong=overlong)
    assert float(p.eligible.sum()) == kept and p.truncated_calls == 1
    assert float(p.sampled.sum()) == 12
    with pytest.raises(ValueError, match="module.overlong"):
        prepare(collate(rows, token_budget=16), overlong="row")


def test_prepare_splits_touching_calls_and_defaults_to_temperature_one() -> None:
    touching = row("r", "g", 1.0, [(2, 4), (4, 6)], 7)
    p = prepare(collate([touching, row("q", "g", 0.0, [(1, 2)], 3)], token_budget=12))
    assert p.segments.count == 3 and p.segments.ordinal.tolist() == [0, 1, 0]
    assert p.calls == [*touching.meta["calls"], {"start": 1, "finish_reason": None, "sampling": {}}]
    assert (p.sampling.temperature == 1.0).all()  # no call records settings
    assert p.token_unit[0, 10:].tolist() == [-1, -1]  # padding: no unit


@pytest.mark.parametrize("overlong", ["call", "rollout"])
def test_overlong_masking_of_a_batch_without_calls(overlong) -> None:
    """Prompt-only rows (no sampled token, so no call segment)."""
    p = prepare(
        collate([row("r", "g", 1.0, [], 4), row("q", "g", 0.0, [], 3)], token_budget=8), overlong=overlong
    )
    assert p.segments.count == 0 and p.truncated_calls == 0 and float(p.eligible.sum()) == 0.0


def test_no_kept_row_gives_no_rollout() -> None:
    """Every row left out (an excluded side row alone, say): K = 0."""
    rewards, group = rollout_rewards(T([1.0, 0.5]), T([-1, -1]), T([0, 0]))
    assert rewards.shape == group.shape == (0,)
