"""Trainer logprobs of the tokens of a packed (or padded) batch, from one causal-LM forward.

The logprob of token t comes from the logits at t - 1, so column 0 of every sequence, and the
first token of every packed row (its "previous" position belongs to the row before it), has no
logprob: those columns are 0 and `scorable` excludes them. The first token of a row is always
prompt, so no sampled token is lost.

Packed rows are kept apart by the position ids alone (see datamodule/collate.py): the forward runs
with `position_ids`, no attention mask and `use_cache=False`, and transformers builds a
block-diagonal causal mask from the restarts.
"""

from __future__ import annotations

import torch
from torch import nn


def scorable(position_ids: torch.Tensor) -> torch.Tensor:
    """(N, T) bool: tokens that have a logprob (not the first token of a row or of a sequence)."""
    return position_ids > 0


def forward_logits(
    model: nn.Module,
    input_ids: torch.Tensor,
    position_ids: torch.Tensor,
    attention_mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """(N, T, V) logits; attention_mask only in "pad" mode (packed rows rely on position_ids)."""
    out = model(
        input_ids=input_ids, position_ids=position_ids, attention_mask=attention_mask, use_cache=False
    )
    return out.logits


def token_logprobs(
    model: nn.Module,
    input_ids: torch.Tensor,
    position_ids: torch.Tensor,
    attention_mask: torch.Tensor | None = None,
    *,
    temperature: float = 1.0,
    with_entropy: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Logprob of each token under the model, and optionally the entropy of each prediction.

    input_ids, position_ids: (N, T) long; attention_mask: (N, T) or None.
    Returns (logp (N, T) float32, entropy (N, T) float32 or None), aligned with input_ids:
    logp[:, t] = log p(input_ids[:, t] | tokens before t in its row), 0 in column 0.
    temperature divides the logits first, matching an engine that sampled with it.
    """
    logits = forward_logits(model, input_ids, position_ids, attention_mask)[:, :-1].float()
    if temperature != 1.0:
        logits = logits / temperature
    logz = torch.logsumexp(logits, dim=-1)  # (N, T-1)
    target = input_ids[:, 1:].unsqueeze(-1)
    logp = logits.gather(-1, target).squeeze(-1) - logz
    ent = None
    if with_entropy:
        with torch.no_grad():
            probs = torch.softmax(logits, dim=-1)
            ent = logz - (probs * logits).sum(-1)
        ent = nn.functional.pad(ent, (1, 0))
    return nn.functional.pad(logp, (1, 0)), ent
