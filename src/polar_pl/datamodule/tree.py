"""Tree layout: a GRPO group's rows as one token tree, so their shared prompt is computed once.

Every row of a group starts with the same prompt (a CLI's system prompt, tool schemas, the task:
~1.4k-15k tokens). Packed row by row, the trainer runs that prompt once per row. In the tree
layout a group is one item of a packed sequence: [shared prefix, suffix_1, suffix_2, ...], a
suffix being what follows the prefix in its row. Each token keeps the position id it has in its
row, so RoPE sees every row unchanged, and the layout obeys one invariant:

    position id = depth in the tree; tokens in depth-first order.

Everything else follows from the position ids alone. A token's parent (the token whose hidden
state predicts it) is the last earlier token one level up: t - 1 inside a chain, the prefix's last
token for the first token of a suffix. Token i attends to token j iff j is an ancestor of i or i
itself: j <= i < end(j), end(j) being the first later token no deeper than j (where j's subtree
ends in depth-first order). Ordinary packing is the special case of chains restarting at depth 0,
so `collate`, `unpack` and the trainer read both layouts the same way.

Where the prefix ends: the longest common token prefix of the group's rows, cut before the first
sampled token of any row (a sampled token has its row's loss mask, behaviour logprob and
advantage) and leaving every row at least one token of its own (that suffix carries the row's
index; the prefix carries row index -1, as it belongs to several rows).

Memory: the suffixes' attention mask is (rows' suffix tokens + later trees) x (sequence length)
bools per sequence (module/tree_attention.py runs the prefix causally, unmasked), so the token
budget bounds it; a group whose tree exceeds the budget is laid out as several trees, each
repeating the prefix.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from polar_pl.trajectory.rows import TrajectoryRow


@dataclass(frozen=True, slots=True)
class Span:
    """Tokens [start, stop) of row `row`, laid out with position ids start..stop-1; `owner` is the
    row index they are recorded under (-1 for a shared prefix)."""

    row: int
    start: int
    stop: int
    owner: int

    @property
    def size(self) -> int:
        return self.stop - self.start


def shared_prefix(rows: Sequence[TrajectoryRow]) -> int:
    """Tokens the rows share at their start: the longest common token prefix, cut before the first
    sampled token of any row and leaving every row at least one token of its own."""
    first = np.asarray(rows[0].input_ids)
    n = min(len(r.input_ids) for r in rows) - 1
    for r in rows:
        sampled = np.flatnonzero(np.asarray(r.loss_mask)[:n])
        n = int(sampled[0]) if sampled.size else n
        differ = np.flatnonzero(np.asarray(r.input_ids)[:n] != first[:n])
        n = int(differ[0]) if differ.size else n
    return n


def tree_items(rows: Sequence[TrajectoryRow], token_budget: int | None = None) -> list[list[Span]]:
    """One item (its spans, in layout order) per group of `rows`, in order of first appearance;
    a group whose tree is longer than `token_budget` is cut into several trees that fit, each
    repeating the prefix (a tree of one row is the row itself)."""
    groups: dict[str, list[int]] = {}
    for i, r in enumerate(rows):
        groups.setdefault(r.group_id, []).append(i)
    items = []
    for members in groups.values():
        p = shared_prefix([rows[i] for i in members])
        suffixes = [Span(i, p, len(rows[i].input_ids), i) for i in members]
        for run in _fill(suffixes, p, token_budget):
            if len(run) == 1 or p == 0:  # nothing shared: the rows as they are
                items.append([Span(s.row, 0, s.stop, s.row) for s in run])
            else:
                items.append([Span(run[0].row, 0, p, -1), *run])
    return items


def _fill(suffixes: list[Span], prefix: int, token_budget: int | None) -> list[list[Span]]:
    """Suffixes cut into consecutive runs whose tree (prefix + run) fits the budget; a suffix that
    alone overflows gets a run of its own (the packer then names the row that does not fit)."""
    runs: list[list[Span]] = [[]]
    size = prefix
    for s in suffixes:
        if runs[-1] and token_budget is not None and size + s.size > token_budget:
            runs.append([])
            size = prefix
        runs[-1].append(s)
        size += s.size
    return runs


def _branches(position_ids: torch.Tensor) -> torch.Tensor:
    """(N, T) bool: tokens that open a branch, the first token of a suffix (deeper than 0, and not
    one deeper than the token before it)."""
    prev = torch.cat([position_ids.new_full((position_ids.shape[0], 1), -1), position_ids[:, :-1]], 1)
    return (position_ids > 0) & (position_ids != prev + 1)


def has_branches(position_ids: torch.Tensor) -> bool:
    """Whether some sequence holds a tree with more than one suffix (else: chains only)."""
    return bool(_branches(position_ids).any())


def parents(position_ids: torch.Tensor) -> torch.Tensor:
    """(N, T) long: the column of each token's parent, whose hidden state predicts it; -1 for a
    root (position 0: the first token of a row, a tree or the padding)."""
    n, t = position_ids.shape
    cols = torch.arange(t, device=position_ids.device).expand(n, t)
    out = torch.where(position_ids > 0, cols - 1, -1)
    for b, c in _branches(position_ids).nonzero().tolist():  # a few per tree: one per suffix
        up = torch.nonzero(position_ids[b, :c] == position_ids[b, c] - 1)
        assert up.numel(), f"column {c} of sequence {b} has no token one level up: not a tree layout"
        out[b, c] = up[-1, 0]
    return out


def _subtree_end(position_ids: torch.Tensor) -> torch.Tensor:
    """(N, T) long: for each token, the first later column no deeper than it (T if none), where
    its subtree ends. Such a column always breaks a chain, so only those are tried."""
    n, t = position_ids.shape
    cols = torch.arange(t, device=position_ids.device)
    prev = torch.cat([position_ids.new_full((n, 1), -1), position_ids[:, :-1]], 1)
    breaks = (position_ids != prev + 1) & (cols > 0)
    end = torch.full_like(position_ids, t)
    for b, k in reversed(breaks.nonzero().tolist()):  # last to first: the nearest break wins
        end[b] = torch.where((cols < k) & (position_ids[b] >= position_ids[b, k]), k, end[b])
    return end


def leading_chain(position_ids: torch.Tensor) -> int:
    """Columns [0, c) that are one chain from the root in every sequence (position = column):
    the first tree's prefix, whose queries attend causally."""
    cols = torch.arange(position_ids.shape[1], device=position_ids.device)
    off = (position_ids != cols).any(0)
    return int(off.int().argmax()) if bool(off.any()) else position_ids.shape[1]


def attention_tail(position_ids: torch.Tensor) -> torch.Tensor | None:
    """(N, 1, T - c, T) bool, True where query c + q may attend to key k (k is an ancestor of the
    query or the query itself), c = `leading_chain`: the queries before c attend causally and need
    no mask. None when every sequence is a single chain (causal attention is the whole story)."""
    t = position_ids.shape[1]
    c = leading_chain(position_ids)
    if c == t:
        return None
    cols = torch.arange(t, device=position_ids.device)
    q = cols[c:, None]  # (T - c, 1)
    end = _subtree_end(position_ids)[:, None, :]  # (N, 1, T)
    return ((cols[None, :] <= q) & (q < end))[:, None]  # (N, 1, T - c, T)


def root_path(parent_row: Sequence[int], col: int) -> list[int]:
    """Columns from the root down to `col` (inclusive), following one sequence's parents."""
    path = []
    while col >= 0:
        path.append(col)
        col = parent_row[col]
    return path[::-1]
