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
    keep: torch.Tensor | None = None,
) -> torch.Tensor:
    """(N, T, V) logits, or (N, K, V) at the K column indices `keep` (HF `logits_to_keep`: the
    LM head, the largest matrix of a small model, runs only there); attention_mask only in "pad"
    mode (packed rows rely on position_ids)."""
    extra = {} if keep is None else {"logits_to_keep": keep}
    out = model(
        input_ids=input_ids, position_ids=position_ids, attention_mask=attention_mask, use_cache=False, **extra
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
    need: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Logprob of each token under the model, and optionally the entropy of each prediction.

    input_ids, position_ids: (N, T) long; attention_mask: (N, T) or None.
    need: (N, T) bool/0-1, the tokens whose logprob is wanted (the sampled ones), or None for all.
    Only the columns where some row needs a logprob go through the LM head: an agent's rows are
    mostly prompt (system prompt, tool schemas), and the (N, T, V) logits of those columns were
    most of the work. Columns not computed read 0, like column 0.
    Returns (logp (N, T) float32, entropy (N, T) float32 or None), aligned with input_ids:
    logp[:, t] = log p(input_ids[:, t] | tokens before t in its row), 0 in column 0.
    temperature divides the logits first, matching an engine that sampled with it.
    """
    n, t = input_ids.shape
    if need is None:
        cols = torch.arange(1, t, device=input_ids.device)
        logits = forward_logits(model, input_ids, position_ids, attention_mask)[:, :-1]
    else:
        cols = torch.nonzero(need[:, 1:].bool().any(0)).squeeze(-1) + 1  # token columns, (K,)
        logits = forward_logits(model, input_ids, position_ids, attention_mask, keep=cols - 1)
    logits = logits.float()
    if temperature != 1.0:
        logits = logits / temperature
    logz = torch.logsumexp(logits, dim=-1)  # (N, K)
    target = input_ids[:, cols].unsqueeze(-1)
    logp = logits.gather(-1, target).squeeze(-1) - logz
    out = logp.new_zeros(n, t).index_copy(1, cols, logp)
    ent = None
    if with_entropy:
        with torch.no_grad():
            probs = torch.softmax(logits, dim=-1)
            ent = logp.new_zeros(n, t).index_copy(1, cols, logz - (probs * logits).sum(-1))
    return out, ent
