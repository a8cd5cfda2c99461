"""What GRPO needs to know about a batch before any forward pass: its statistics units, call
segments, per-token sampling settings, and which sampled tokens may enter the loss.

Pure bookkeeping over the collated tensors and each row's metadata; no model is involved.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from polar_pl.datamodule.collate import TrainBatch
from polar_pl.module.logprobs import Sampling, scorable
from polar_pl.module.rollouts import Rollouts, rollouts
from polar_pl.module.segments import Segments, call_info, call_segments, per_token, sampling_of

OVERLONG = (None, "call", "rollout")


@dataclass(frozen=True, slots=True)
class Prepared:
    """units: the statistics units (rollouts.py); segments / calls: call segments and each one's
    recorded info; sampling: per-token settings; token_unit: (N, T) long unit of each token (-1:
    padding or a row left out); sampled: (N, T) float, sampled tokens with a trainer logprob;
    eligible: (N, T) float, those allowed in the loss before group filtering (overlong masking
    applied); truncated_calls: calls cut by the length limit."""

    units: Rollouts
    segments: Segments
    calls: list[dict[str, Any]]
    sampling: Sampling
    token_unit: torch.Tensor
    sampled: torch.Tensor
    eligible: torch.Tensor
    truncated_calls: int


def prepare(
    batch: TrainBatch, *, side_rows: str = "own", overlong: str | None = None, temperature: float = 1.0
) -> Prepared:
    """See `Prepared`. overlong: None keeps calls cut by the length limit; "call" drops their
    tokens from the loss; "rollout" drops every token of a unit with such a call (DAPO's overlong
    filtering: a cut-off answer's reward says little about its tokens). temperature: the setting
    for calls that record no sampling parameters."""
    if overlong not in OVERLONG:
        raise ValueError(f"module.overlong={overlong!r}: allowed null, call, rollout")
    units = rollouts(batch, side_rows)
    segments = call_segments(batch.loss_mask, batch.row_index, batch.position_ids, batch.row_meta)
    calls = call_info(segments, batch.row_meta)
    device = batch.input_ids.device
    in_row = batch.row_index >= 0
    token_unit = torch.where(in_row, units.row[batch.row_index.clamp(min=0)], -1)
    sampled = batch.loss_mask * scorable(batch.position_ids) * in_row
    eligible = sampled * (token_unit >= 0)
    cut = torch.tensor([c.get("finish_reason") == "length" for c in calls], dtype=torch.bool, device=device)
    if overlong == "call":
        eligible = eligible * ~per_token(segments, cut, False)
    elif overlong == "rollout" and cut.any():
        cut_units = units.row[segments.row[cut]].unique()
        eligible = eligible * ~torch.isin(token_unit, cut_units)
    return Prepared(
        units=units,
        segments=segments,
        calls=calls,
        sampling=sampling_of(segments, calls, temperature).to(device),
        token_unit=token_unit,
        sampled=sampled,
        eligible=eligible,
        truncated_calls=int(cut.sum()),
    )


def unit_sums(
    values: torch.Tensor, mask: torch.Tensor, token_unit: torch.Tensor, num_units: int
) -> torch.Tensor:
    """(K,) float64 sum of values (N, T) over each unit's tokens where mask > 0."""
    sel = (mask > 0) & (token_unit >= 0)
    out = torch.zeros(num_units, dtype=torch.float64, device=values.device)
    return out.index_add_(0, token_unit[sel], values[sel].double())
