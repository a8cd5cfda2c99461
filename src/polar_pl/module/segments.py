"""Call segments: the sampled span of each model call inside the packed batch.

A prefix-merged row holds several calls; each call's response is one contiguous run of sampled
tokens. Sequence-level quantities (GSPO's ratio, sequence-level TIS and masks, overlong masking)
are per call, not per row: one product over a whole multi-turn chain is nearly always ~0 or
capped. Segments are the runs of `loss_mask` within a row, split further at the call starts that
builders record in `meta["calls"]` (two calls whose responses touch would otherwise be one run).

Per-call data travels in each row's `meta["calls"]`: a list, in call order, of
`{"start": position of the first sampled token in the row, "finish_reason": str | None,
"sampling": {"temperature", "top_p", "top_k"}}` for every call with sampled tokens.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from polar_pl.module.logprobs import Sampling

_DEFAULTS = {"temperature": 1.0, "top_p": 1.0, "top_k": -1}


@dataclass(frozen=True, slots=True)
class Segments:
    """index: (N, T) long segment of each sampled token, -1 elsewhere; row: (S,) long row of each
    segment; ordinal: (S,) long its position among its row's segments (0 = first call)."""

    index: torch.Tensor
    row: torch.Tensor
    ordinal: torch.Tensor

    @property
    def count(self) -> int:
        return int(self.row.numel())

    def select(self, idx: torch.Tensor) -> Segments:
        """The segments of sequences `idx` (ids stay global: a segment never spans sequences)."""
        return Segments(self.index[idx], self.row, self.ordinal)


def call_segments(
    loss_mask: torch.Tensor,
    row_index: torch.Tensor,
    position_ids: torch.Tensor,
    row_meta: Sequence[dict[str, Any]] = (),
) -> Segments:
    """Segments of a batch. loss_mask, row_index, position_ids: (N, T) as in `TrainBatch`;
    row_meta: per-row dicts whose "meta" may hold "calls" (see the module docstring)."""
    sampled = (loss_mask > 0) & (row_index >= 0)
    flat_s, flat_r = sampled.flatten(), row_index.flatten()
    prev_s = torch.cat([flat_s.new_zeros(1), flat_s[:-1]])
    prev_r = torch.cat([flat_r.new_full((1,), -1), flat_r[:-1]])
    start = flat_s & ~(prev_s & (prev_r == flat_r))
    explicit = _explicit_starts(row_meta, row_index, position_ids)
    if explicit is not None:
        start |= explicit & flat_s
    seg = torch.where(flat_s, torch.cumsum(start.long(), 0) - 1, -1)
    rows = flat_r[start]
    s = rows.numel()
    first = torch.full((max(int(row_index.max()) + 1, 1),), s, dtype=torch.long, device=rows.device)
    first = first.scatter_reduce(0, rows, torch.arange(s, device=rows.device), "amin")
    return Segments(seg.view_as(row_index), rows, torch.arange(s, device=rows.device) - first[rows])


def _explicit_starts(
    row_meta: Sequence[dict[str, Any]], row_index: torch.Tensor, position_ids: torch.Tensor
) -> torch.Tensor | None:
    """(N*T,) bool at the recorded call starts, or None when no row records its calls."""
    starts = {
        i: [c["start"] for c in (m.get("meta") or {}).get("calls") or ()] for i, m in enumerate(row_meta)
    }
    if not any(starts.values()):
        return None
    flat_r, flat_p = row_index.flatten(), position_ids.flatten()
    lookup = torch.zeros(len(row_meta), int(flat_p.max()) + 1, dtype=torch.bool)
    for i, ps in starts.items():
        ps = [p for p in ps if p < lookup.shape[1]]
        lookup[i, ps] = True
    valid = flat_r >= 0
    out = torch.zeros_like(valid)
    out[valid] = lookup.to(flat_r.device)[flat_r[valid], flat_p[valid]]
    return out


def call_info(segments: Segments, row_meta: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per segment, the recorded call dict ({} where the row records none)."""
    out = []
    for r, k in zip(segments.row.tolist(), segments.ordinal.tolist(), strict=True):
        calls = (row_meta[r].get("meta") or {}).get("calls") or () if r < len(row_meta) else ()
        out.append(calls[k] if k < len(calls) else {})
    return out


def per_token(segments: Segments, values: torch.Tensor, fill: float) -> torch.Tensor:
    """(S,) per-segment values broadcast to (N, T), `fill` outside segments."""
    idx = segments.index
    full = torch.full(idx.shape, fill, dtype=values.dtype, device=idx.device)
    inside = idx >= 0
    full[inside] = values.to(idx.device)[idx[inside]]
    return full


def sampling_of(
    segments: Segments, info: Sequence[dict[str, Any]], default_temperature: float = 1.0
) -> Sampling:
    """Per-token `Sampling` from the recorded per-call settings; calls that record none (and
    prompt tokens) get `default_temperature`, no top-k, no top-p."""
    base = {**_DEFAULTS, "temperature": default_temperature}
    params = [base | {k: v for k, v in (c.get("sampling") or {}).items() if v is not None} for c in info]
    temp = torch.tensor([float(p["temperature"]) for p in params], dtype=torch.float32)
    top_k = torch.tensor([int(p["top_k"]) for p in params], dtype=torch.long)
    top_p = torch.tensor([float(p["top_p"]) for p in params], dtype=torch.float32)
    return Sampling(
        per_token(segments, temp, default_temperature),
        per_token(segments, top_k, -1),
        per_token(segments, top_p, 1.0),
    )


def segment_sum(x: torch.Tensor, segments: Segments) -> torch.Tensor:
    """(S,) float64 sum of x (N, T) over each segment's tokens."""
    idx = segments.index.flatten()
    inside = idx >= 0
    out = torch.zeros(segments.count, dtype=torch.float64, device=x.device)
    return out.index_add_(0, idx[inside], x.flatten()[inside].double())
