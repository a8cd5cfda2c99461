"""Collation: trajectory rows -> training tensors, packed into fixed token budgets or padded.

Packing (default) places whole rows into sequences of `token_budget` tokens (first-fit decreasing).
Inside a sequence, position ids restart at 0 for every row, and nothing else separates rows: a HF
model (Qwen3 and every model built on `transformers.masking_utils`) called with `position_ids`, no
`attention_mask` and `use_cache=False` (with a KV cache transformers skips the check) detects the
restarts (`find_packed_sequence_indices`) and builds a
block-diagonal causal mask for sdpa/eager, and flash-attention's varlen path reads the same
restarts, so no token attends across rows. The padding at the end of a sequence restarts at 0 too,
making it a segment of its own that no row attends to.

Padding (`mode="pad"`) gives each row its own sequence with a 2-D attention mask.

Tree (`mode="tree"`) packs each GRPO group as one token tree, [shared prefix, suffix_1, ...], so
the trainer computes the prompt the group's rows share once (datamodule/tree.py has the layout;
module/tree_attention.py the attention it needs).

`unpack` inverts every layout, so the batch can be checked against the rows it came from.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, fields
from typing import Any

import numpy as np
import torch

from polar_pl.datamodule.tree import Span, parents, root_path, tree_items
from polar_pl.trajectory.rows import TrajectoryRow

MODES = ("pack", "pad", "tree")
_META_FIELDS = ("session_id", "rollout_id", "group_id", "reward", "call_indices", "harness", "status", "meta")


@dataclass(slots=True)
class TrainBatch:
    """Tensors for one optimizer micro-step. Mutable (not frozen) so Lightning can move it to a device.

    Per token, shape (N, T) for N sequences of T tokens:
      input_ids (long), position_ids (long; each token's position in its row: restart at 0 per
      row and for the trailing padding; in "tree" mode a suffix continues from its prefix),
      loss_mask (float32; 1.0 exactly on sampled tokens), behavior_logprobs (float64; engine
      logprobs, 0 where masked; float64 so rows round-trip exactly), policy_version (long; -1 where
      masked), row_index (long; which row the token belongs to, -1 on padding and on a tree's
      shared prefix, which belongs to several rows).
    attention_mask: (N, T) long 1/0 in "pad" mode; None otherwise (see the module docstring).
    Per row, shape (R,): rewards (float32), advantages (float32, zeros; the trainer fills them),
      group_index (long; index into group_ids), rollout_index (long; index into rollout_ids).
    padding_tokens / total_tokens: padding waste = padding_tokens / total_tokens.
    shared_tokens: row tokens laid out once for several rows ("tree" mode): the rows hold
      shared_tokens more tokens than the batch computes.
    """

    input_ids: torch.Tensor
    position_ids: torch.Tensor
    loss_mask: torch.Tensor
    behavior_logprobs: torch.Tensor
    policy_version: torch.Tensor
    row_index: torch.Tensor
    attention_mask: torch.Tensor | None
    rewards: torch.Tensor
    advantages: torch.Tensor
    group_index: torch.Tensor
    rollout_index: torch.Tensor
    group_ids: list[str]
    rollout_ids: list[str]
    row_meta: list[dict[str, Any]] = field(default_factory=list)
    mode: str = "pack"
    padding_tokens: int = 0
    total_tokens: int = 0
    shared_tokens: int = 0

    @property
    def padding_waste(self) -> float:
        return self.padding_tokens / self.total_tokens if self.total_tokens else 0.0

    @property
    def num_rows(self) -> int:
        return len(self.row_meta)

    def to(self, device: torch.device | str) -> TrainBatch:
        """Move every tensor to `device` (in place; returns self)."""
        for f in fields(self):
            v = getattr(self, f.name)
            if isinstance(v, torch.Tensor):
                setattr(self, f.name, v.to(device))
        return self


def pack_bins(lengths: Sequence[int], token_budget: int) -> list[list[int]]:
    """First-fit decreasing: row indices per sequence, each sequence holding <= token_budget tokens."""
    too_long = [n for n in lengths if n > token_budget]
    if too_long:
        raise ValueError(f"token_budget={token_budget} is shorter than a row of {max(too_long)} tokens")
    bins: list[list[int]] = []
    free: list[int] = []
    for i in sorted(range(len(lengths)), key=lambda i: -lengths[i]):
        n = lengths[i]
        for b, room in enumerate(free):
            if n <= room:
                bins[b].append(i)
                free[b] -= n
                break
        else:
            bins.append([i])
            free.append(token_budget - n)
    return bins


def collate(
    rows: Sequence[TrajectoryRow],
    *,
    mode: str = "pack",
    token_budget: int | None = None,
    pad_id: int = 0,
    pad_to_multiple_of: int = 1,
) -> TrainBatch:
    """Rows -> TrainBatch.

    mode "pack": sequences of exactly `token_budget` tokens (required), rows never split.
    mode "pad": one sequence per row, T = longest row rounded up to `pad_to_multiple_of`
    (or token_budget when given, which must fit every row).
    mode "tree": one tree per group (datamodule/tree.py), packed like rows into sequences of
    `token_budget` tokens (None: the longest tree); a tree is never split across sequences, and a
    group whose tree exceeds the budget becomes several trees.
    """
    if mode not in MODES:
        raise ValueError(f"collate mode={mode!r}: allowed {MODES}")
    if not rows:
        raise ValueError("collate needs at least one row")
    budget_ok = token_budget is not None and token_budget > 0 or token_budget is None and mode == "tree"
    if mode != "pad" and not budget_ok:
        raise ValueError(f"collate mode={mode!r} needs a positive token_budget, got {token_budget!r}")
    lengths = [len(r.input_ids) for r in rows]
    if mode == "tree":
        items = tree_items(rows, token_budget)
    else:
        items = [[Span(i, 0, k, i)] for i, k in enumerate(lengths)]
    sizes = [sum(s.size for s in item) for item in items]
    if mode == "pad":
        longest = max(sizes)
        width = (
            token_budget
            if token_budget is not None
            else -(-longest // pad_to_multiple_of) * pad_to_multiple_of
        )
        if longest > width:
            raise ValueError(f"token_budget={token_budget} is shorter than a row of {longest} tokens")
        bins = [[i] for i in range(len(items))]
    else:
        width = token_budget if token_budget is not None else max(sizes)
        bins = pack_bins(sizes, width)

    n = len(bins)
    ids = np.full((n, width), pad_id, dtype=np.int64)
    pos = np.zeros((n, width), dtype=np.int64)
    mask = np.zeros((n, width), dtype=np.float32)
    logp = np.zeros((n, width), dtype=np.float64)
    ver = np.full((n, width), -1, dtype=np.int64)
    row_idx = np.full((n, width), -1, dtype=np.int64)
    for b, members in enumerate(bins):
        off = 0
        for s in (s for j in members for s in items[j]):
            r, cols, part = rows[s.row], slice(off, off + s.size), slice(s.start, s.stop)
            ids[b, cols] = r.input_ids[part]
            pos[b, cols] = np.arange(s.start, s.stop)  # its position in its row
            mask[b, cols] = r.loss_mask[part]
            logp[b, cols] = r.behavior_logprobs[part]
            ver[b, cols] = r.policy_version[part]
            row_idx[b, cols] = s.owner
            off += s.size
        pos[b, off:] = np.arange(width - off)  # padding: a segment of its own
    attention = torch.from_numpy((row_idx >= 0).astype(np.int64)) if mode == "pad" else None

    group_ids = list(dict.fromkeys(r.group_id for r in rows))
    rollout_ids = list(dict.fromkeys(r.rollout_id for r in rows))
    gidx, ridx = {g: i for i, g in enumerate(group_ids)}, {g: i for i, g in enumerate(rollout_ids)}
    total = n * width
    return TrainBatch(
        input_ids=torch.from_numpy(ids),
        position_ids=torch.from_numpy(pos),
        loss_mask=torch.from_numpy(mask),
        behavior_logprobs=torch.from_numpy(logp),
        policy_version=torch.from_numpy(ver),
        row_index=torch.from_numpy(row_idx),
        attention_mask=attention,
        rewards=torch.tensor([r.reward for r in rows], dtype=torch.float32),
        advantages=torch.zeros(len(rows), dtype=torch.float32),
        group_index=torch.tensor([gidx[r.group_id] for r in rows], dtype=torch.long),
        rollout_index=torch.tensor([ridx[r.rollout_id] for r in rows], dtype=torch.long),
        group_ids=group_ids,
        rollout_ids=rollout_ids,
        row_meta=[{k: getattr(r, k) for k in _META_FIELDS} | {"meta": dict(r.meta)} for r in rows],
        mode=mode,
        padding_tokens=total - sum(sizes),
        total_tokens=total,
        shared_tokens=sum(lengths) - sum(sizes),
    )


def unpack(batch: TrainBatch) -> list[TrajectoryRow]:
    """The rows a batch was collated from, in their original order (a tree's rows get their
    shared prefix back: the path from the root to the parent of their first own token)."""
    flat_idx = batch.row_index.reshape(-1).cpu().numpy()
    order = np.argsort(flat_idx, kind="stable")  # tokens grouped by row, in sequence order
    counts = np.bincount(flat_idx[flat_idx >= 0], minlength=batch.num_rows)
    starts = np.searchsorted(flat_idx[order], np.arange(batch.num_rows))
    cols = {
        "input_ids": batch.input_ids,
        "loss_mask": batch.loss_mask.to(torch.int64),
        "behavior_logprobs": batch.behavior_logprobs,
        "policy_version": batch.policy_version,
    }
    grid = {k: v.cpu().numpy() for k, v in cols.items()}
    flat = {k: v.reshape(-1)[order] for k, v in grid.items()}
    parent = parents(batch.position_ids).cpu().numpy()
    width = batch.input_ids.shape[1]
    out = []
    for i, meta in enumerate(batch.row_meta):
        s, k = starts[i], counts[i]
        seq, col = divmod(int(order[s]), width)
        prefix = root_path(parent[seq], int(parent[seq, col]))  # [] unless a tree shares it
        tokens = {name: np.concatenate([grid[name][seq, prefix], a[s : s + k]]) for name, a in flat.items()}
        out.append(TrajectoryRow(**{name: a.tolist() for name, a in tokens.items()}, **meta))
    return out
