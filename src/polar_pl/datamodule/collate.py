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

`unpack` inverts either layout, so the batch can be checked against the rows it came from.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, fields
from typing import Any

import numpy as np
import torch

from polar_pl.datamodule.rows import TrajectoryRow

MODES = ("pack", "pad")
_META_FIELDS = ("session_id", "rollout_id", "group_id", "reward", "call_indices", "harness", "status", "meta")


@dataclass(slots=True)
class TrainBatch:
    """Tensors for one optimizer micro-step. Mutable (not frozen) so Lightning can move it to a device.

    Per token, shape (N, T) for N sequences of T tokens:
      input_ids (long), position_ids (long; restart at 0 per row and for the trailing padding),
      loss_mask (float32; 1.0 exactly on sampled tokens), behavior_logprobs (float64; engine
      logprobs, 0 where masked; float64 so rows round-trip exactly), policy_version (long; -1 where
      masked), row_index (long; which row the token belongs to, -1 on padding).
    attention_mask: (N, T) long 1/0 in "pad" mode; None in "pack" mode (see the module docstring).
    Per row, shape (R,): rewards (float32), advantages (float32, zeros; the trainer fills them),
      group_index (long; index into group_ids), rollout_index (long; index into rollout_ids).
    padding_tokens / total_tokens: padding waste = padding_tokens / total_tokens.
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
    """
    if mode not in MODES:
        raise ValueError(f"collate mode={mode!r}: allowed {MODES}")
    if not rows:
        raise ValueError("collate needs at least one row")
    lengths = [len(r.input_ids) for r in rows]
    if mode == "pack":
        if token_budget is None or token_budget <= 0:
            raise ValueError(f"collate mode='pack' needs a positive token_budget, got {token_budget!r}")
        bins, width = pack_bins(lengths, token_budget), token_budget
    else:
        longest = max(lengths)
        width = (
            token_budget
            if token_budget is not None
            else -(-longest // pad_to_multiple_of) * pad_to_multiple_of
        )
        if longest > width:
            raise ValueError(f"token_budget={token_budget} is shorter than a row of {longest} tokens")
        bins = [[i] for i in range(len(rows))]

    n = len(bins)
    ids = np.full((n, width), pad_id, dtype=np.int64)
    pos = np.zeros((n, width), dtype=np.int64)
    mask = np.zeros((n, width), dtype=np.float32)
    logp = np.zeros((n, width), dtype=np.float64)
    ver = np.full((n, width), -1, dtype=np.int64)
    row_idx = np.full((n, width), -1, dtype=np.int64)
    for b, members in enumerate(bins):
        off = 0
        for i in members:
            r, k = rows[i], lengths[i]
            ids[b, off : off + k] = r.input_ids
            pos[b, off : off + k] = np.arange(k)
            mask[b, off : off + k] = r.loss_mask
            logp[b, off : off + k] = r.behavior_logprobs
            ver[b, off : off + k] = r.policy_version
            row_idx[b, off : off + k] = i
            off += k
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
        padding_tokens=total - sum(lengths),
        total_tokens=total,
    )


def unpack(batch: TrainBatch) -> list[TrajectoryRow]:
    """The rows a batch was collated from, in their original order."""
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
    flat = {k: v.reshape(-1).cpu().numpy()[order] for k, v in cols.items()}
    out = []
    for i, meta in enumerate(batch.row_meta):
        s, k = starts[i], counts[i]
        out.append(TrajectoryRow(**{name: a[s : s + k].tolist() for name, a in flat.items()}, **meta))
    return out
