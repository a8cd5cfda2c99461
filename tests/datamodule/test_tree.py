"""The tree layout (collate mode "tree"): a group's shared prefix laid out once, each row's suffix
after it at its own positions; parents and the attention mask read back from the position ids;
`unpack` inverts it. Literal token lists, then a property over random groups."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from polar_pl.datamodule.collate import collate, unpack
from polar_pl.datamodule.tree import attention_tail, leading_chain, parents, root_path, shared_prefix
from polar_pl.trajectory.rows import TrajectoryRow


def row(ids: list[int], sampled: list[int], *, group: str = "g", rollout: str = "r") -> TrajectoryRow:
    """A row whose tokens at the `sampled` positions were sampled (behaviour logprob -0.5, v3)."""
    mask = [int(i in sampled) for i in range(len(ids))]
    return TrajectoryRow(
        input_ids=ids,
        loss_mask=mask,
        behavior_logprobs=[-0.5 if m else 0.0 for m in mask],
        policy_version=[3 if m else -1 for m in mask],
        session_id=rollout,
        rollout_id=rollout,
        group_id=group,
    )


def test_a_group_is_one_tree_and_unpacks_to_its_rows() -> None:
    """Prefix [1, 2] once (row index -1), then each row's suffix at the positions it has in its
    row; a group of one row is the row itself; the trees pack like rows."""
    rows = [
        row([1, 2, 3, 4, 5], [3, 4], rollout="a"),
        row([1, 2, 3, 7], [3], rollout="b"),  # shares [1, 2, 3], but 3 is sampled in row c
        row([1, 2, 9, 8, 6], [2, 4], rollout="c"),
        row([5, 6], [1], group="h", rollout="d"),
    ]
    b = collate(rows, mode="tree")
    assert b.input_ids.tolist() == [[1, 2, 3, 4, 5, 3, 7, 9, 8, 6], [5, 6, 0, 0, 0, 0, 0, 0, 0, 0]]
    assert b.position_ids.tolist() == [[0, 1, 2, 3, 4, 2, 3, 2, 3, 4], [0, 1, 0, 1, 2, 3, 4, 5, 6, 7]]
    assert b.row_index.tolist() == [[-1, -1, 0, 0, 0, 1, 1, 2, 2, 2], [3, 3] + [-1] * 8]
    assert b.loss_mask[0].tolist() == [0, 0, 0, 1, 1, 0, 1, 1, 0, 1]
    assert (b.shared_tokens, b.padding_tokens, b.total_tokens) == (4, 8, 20)
    assert parents(b.position_ids).tolist() == [
        [-1, 0, 1, 2, 3, 1, 5, 1, 7, 8],
        [-1, 0, -1, 2, 3, 4, 5, 6, 7, 8],
    ]
    assert unpack(b) == rows


def test_the_prefix_stops_before_any_sampled_token_and_leaves_each_row_a_token() -> None:
    prompt = [4, 4, 5, 6]
    assert shared_prefix([row(prompt + [1], [4]), row(prompt + [1, 2], [4, 5])]) == 4  # same sampled 1: cut
    assert (
        shared_prefix([row(prompt, []), row(prompt + [7], [4])]) == 3
    )  # a row equal to the prompt keeps [6]
    assert shared_prefix([row(prompt + [1], [4]), row(prompt + [2], [4])]) == 4  # prefix plus one token
    assert shared_prefix([row([1, 2], [1]), row([3, 2], [1])]) == 0  # nothing shared
    assert shared_prefix([row(prompt + [1, 2], [5])]) == 5  # one row: its prompt


def test_edge_groups_round_trip() -> None:
    """A row equal to the prefix plus one token, rows of different lengths, a one-row group, a
    group with nothing in common, and a row without sampled tokens."""
    p = [10, 11, 12]
    rows = [
        row(p + [1], [3], rollout="a"),
        row(p + [2, 3, 4, 5, 6], [3, 4, 7], rollout="b"),
        row(p, [], rollout="c"),
        row([7, 8, 9], [2], group="solo", rollout="d"),
        row([1, 2], [1], group="apart", rollout="e"),
        row([3, 2], [1], group="apart", rollout="f"),
    ]
    b = collate(rows, mode="tree", token_budget=12)
    assert b.shared_tokens == 2 * 2  # [10, 11] laid out once instead of three times
    assert unpack(b) == rows


def test_a_tree_over_the_budget_becomes_several_trees_each_with_the_prefix() -> None:
    p = list(range(20, 26))
    rows = [row(p + [i] * 3, [6, 7, 8], rollout=f"r{i}") for i in range(4)]
    b = collate(rows, mode="tree", token_budget=12)  # 6 + 3 x 2 = 12: two rows per tree
    assert b.input_ids.shape == (2, 12) and b.shared_tokens == 2 * 6
    assert b.input_ids[1].tolist() == p + [2] * 3 + [3] * 3
    assert unpack(b) == rows
    with pytest.raises(ValueError, match="shorter than a row of 9 tokens"):
        collate(rows, mode="tree", token_budget=8)


def test_tail_mask_is_the_ancestor_relation() -> None:
    """Queries of the leading chain attend causally (no mask rows); each suffix token attends to the
    prefix and its own earlier tokens; padding to the padding before it (never an empty row)."""
    pos = torch.tensor([[0, 1, 2, 3, 2, 3, 0, 1]])  # prefix [0, 1], suffixes at 2-3 and 4-5, padding
    assert leading_chain(pos) == 4
    mask = attention_tail(pos)
    assert mask.shape == (1, 1, 4, 8)
    assert mask[0, 0].int().tolist() == [
        [1, 1, 0, 0, 1, 0, 0, 0],
        [1, 1, 0, 0, 1, 1, 0, 0],
        [0, 0, 0, 0, 0, 0, 1, 0],
        [0, 0, 0, 0, 0, 0, 1, 1],
    ]
    assert attention_tail(torch.tensor([[0, 1, 2, 3]])) is None  # one chain: causal is the whole story


GROUPS = st.lists(
    st.tuples(
        st.lists(st.integers(1, 5), min_size=0, max_size=6),  # the group's prompt
        st.lists(  # rows: (suffix tokens, sampled flags)
            st.lists(st.tuples(st.integers(1, 5), st.booleans()), min_size=0, max_size=6),
            min_size=1,
            max_size=4,
        ),
    ),
    min_size=1,
    max_size=3,
)


@settings(max_examples=60, deadline=None)
@given(groups=GROUPS, budget=st.sampled_from([None, 16]))
def test_random_groups_round_trip_and_attend_to_their_own_row(groups, budget) -> None:
    """For every row: unpack gives it back, and each of its tokens attends to exactly the tokens
    before it in its row (the path from the root), at the row's positions."""
    rows = []
    for g, (prompt, members) in enumerate(groups):
        for k, suffix in enumerate(members):
            ids = prompt + [t for t, _ in suffix]
            if ids:
                sampled = [len(prompt) + i for i, (_, s) in enumerate(suffix) if s]
                rows.append(row(ids, sampled, group=f"g{g}", rollout=f"g{g}r{k}"))
    if not rows:
        return
    budget = None if budget is None else max(budget, *(len(r.input_ids) for r in rows))
    b = collate(rows, mode="tree", token_budget=budget)
    assert unpack(b) == rows
    par = parents(b.position_ids)
    c, tail = leading_chain(b.position_ids), attention_tail(b.position_ids)
    for i, r in enumerate(rows):
        seq, col = (int(x) for x in torch.nonzero(b.row_index == i)[0])
        own = torch.nonzero(b.row_index[seq] == i).squeeze(-1).tolist()
        path = root_path(par[seq].tolist(), int(par[seq, col])) + own
        assert b.input_ids[seq, path].tolist() == list(r.input_ids)
        assert b.position_ids[seq, path].tolist() == list(range(len(r.input_ids)))
        for q in own:
            seen = list(range(q + 1)) if q < c else torch.nonzero(tail[seq, 0, q - c]).squeeze(-1).tolist()
            assert seen == path[: path.index(q) + 1]
