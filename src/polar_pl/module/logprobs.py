"""Trainer logprobs (and entropies) of the tokens of a packed or padded batch, in bounded memory.

The logprob of token t comes from the logits at t - 1, so column 0 of every sequence, and the
first token of every packed row (its "previous" position belongs to the row before it), has no
logprob: those columns are 0 and `scorable` excludes them. The first token of a row is always
prompt, so no sampled token is lost.

Packed rows are kept apart by the position ids alone (see datamodule/collate.py): the forward runs
with `position_ids`, no attention mask and `use_cache=False`, and transformers builds a
block-diagonal causal mask from the restarts.

A tree batch (collate mode "tree": a group's shared prefix laid out once, its rows' suffixes after
it) runs with the mask of its suffixes (module/tree_attention.py), and the token at t is predicted
from its parent, which for the first token of a suffix is the prefix's last token, not t - 1: the
trainer passes per-token `parents`. Without them t - 1 is assumed (ordinary packing).

Memory: the (N, T, V) float logits of a long row dwarf everything else (a 32k-token row over a
150k vocabulary is 20 GB), so the decoder runs once to hidden states and the LM head, the sampling
transform and the log-softmax run over `chunk_tokens` tokens at a time; with grad, each chunk is
checkpointed (its logits are recomputed in the backward instead of kept).

Logprobs are those of the distribution the engine sampled from (vLLM's `processed_logprobs`):
temperature, then top-k and top-p, per token (`Sampling`), by the engine's own function.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from polar_pl.datamodule.tree import attention_tail, has_branches, parents
from polar_pl.engine.sampling import processed_logits
from polar_pl.module.sharding import run_sharded
from polar_pl.module.tree_attention import check_tree_attention


@dataclass(frozen=True, slots=True)
class Sampling:
    """Per-token sampling settings, (N, T) each, aligned with input_ids: column t holds the
    settings token t was sampled under (they act on the logits at t - 1).

    temperature, top_p: float32; top_k: long (<= 0: off). Prompt tokens carry the defaults.
    """

    temperature: torch.Tensor
    top_k: torch.Tensor
    top_p: torch.Tensor

    @classmethod
    def uniform(cls, like: torch.Tensor, temperature: float = 1.0) -> Sampling:
        return cls(
            torch.full(like.shape, float(temperature), device=like.device),
            torch.full(like.shape, -1, dtype=torch.long, device=like.device),
            torch.ones(like.shape, device=like.device),
        )

    def __getitem__(self, idx: torch.Tensor) -> Sampling:
        """The settings of sequences `idx` ((K,) long), (K, T) each."""
        return Sampling(self.temperature[idx], self.top_k[idx], self.top_p[idx])

    def to(self, device: torch.device | str) -> Sampling:
        return Sampling(self.temperature.to(device), self.top_k.to(device), self.top_p.to(device))


def scorable(position_ids: torch.Tensor) -> torch.Tensor:
    """(N, T) bool: tokens that have a logprob (not the first token of a row or of a sequence)."""
    return position_ids > 0


def forward_inputs(
    position_ids: torch.Tensor, row_index: torch.Tensor, attention_mask: torch.Tensor | None
) -> dict[str, torch.Tensor | None]:
    """`position_ids`, `attention_mask` and `parents` to run a micro-batch with (token_logprobs'
    keywords). A tree (some token opens a branch) gets its suffixes' attention mask (see
    datamodule/tree.py) and per-token parents. When every sequence holds a single row from
    column 0 (then padding), causal attention alone keeps the row apart (padding only follows
    it), so the positions continue through the padding and the mask is dropped: transformers then
    builds no (T, T) block mask (1 GB of bools at 32k tokens) and takes the causal kernel.
    Otherwise the inputs come back unchanged."""
    if has_branches(position_ids):
        return {
            "position_ids": position_ids,
            "attention_mask": attention_tail(position_ids),
            "parents": parents(position_ids),
        }
    first = row_index[:, :1]
    single = bool(((first >= 0) & ((row_index == first) | (row_index < 0))).all())
    if single:
        t = position_ids.shape[1]
        position_ids = torch.arange(t, device=position_ids.device).expand_as(position_ids)
        attention_mask = None
    return {"position_ids": position_ids, "attention_mask": attention_mask, "parents": None}


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


def _hidden_and_head(
    model: nn.Module, input_ids: torch.Tensor, position_ids: torch.Tensor, attention_mask: torch.Tensor | None
) -> tuple[torch.Tensor, nn.Module]:
    """(N, T, H) final hidden states and the LM head of a HF causal LM whose logits are
    head(hidden); any other model: its (N, T, V) logits and an identity head."""
    base = getattr(model, "base_model", None)
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None  # type: ignore[operator]  # HF method; torch types it Tensor | Module
    if base is None or base is model or head is None:
        return forward_logits(model, input_ids, position_ids, attention_mask), nn.Identity()
    out = base(input_ids=input_ids, position_ids=position_ids, attention_mask=attention_mask, use_cache=False)
    return out.last_hidden_state, head


def _head_logits(head: nn.Module, hidden: torch.Tensor) -> torch.Tensor:
    """head(hidden), outside autocast: under mixed precision the LM head runs in its weights' own
    dtype (fp32 master weights), so the logits the logprobs come from are not rounded to bf16.
    Measured on SmolLM2 (bf16-mixed on CPU, 8 sampled answers): mean |trainer - fp32| logprob
    0.027 with a bf16 head, 0.019 with this."""
    weight = getattr(head, "weight", None)
    if weight is None or not torch.is_autocast_enabled(hidden.device.type):
        return head(hidden)
    with torch.autocast(hidden.device.type, enabled=False):
        return head(hidden.to(weight.dtype))


def _chunk_logprobs(
    head: nn.Module,
    hidden: torch.Tensor,
    targets: torch.Tensor,
    temperature: torch.Tensor,
    top_k: torch.Tensor,
    top_p: torch.Tensor,
    with_entropy: bool,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(logp (N, c), entropy (N, c) or None) of `targets` under the processed distribution of
    head(hidden)."""
    z = processed_logits(_head_logits(head, hidden), temperature, top_k, top_p, keep=targets)  # (N, c, V)
    logz = torch.logsumexp(z, dim=-1, keepdim=True)
    logp = (z.gather(-1, targets.unsqueeze(-1)) - logz).squeeze(-1)
    if not with_entropy:
        return logp, None
    # Filtered tokens have p = 0 and logp = -inf: their term (and its gradient) must be 0, not nan.
    logp_all = z - logz
    ent = -(logp_all.exp() * torch.nan_to_num(logp_all, neginf=0.0)).sum(-1)
    return logp, ent


def token_logprobs(
    model: nn.Module,
    input_ids: torch.Tensor,
    position_ids: torch.Tensor,
    attention_mask: torch.Tensor | None = None,
    *,
    parents: torch.Tensor | None = None,
    sampling: Sampling | None = None,
    temperature: float = 1.0,
    with_entropy: bool = False,
    chunk_tokens: int | None = None,
    need: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Logprob of each token under the model's processed distribution, and optionally the entropy
    of that distribution at each prediction.

    input_ids, position_ids: (N, T) long; attention_mask: (N, T), a tree's (N, 1, T - c, T) tail
    mask (`forward_inputs`), or None.
    parents: (N, T) long, the column whose hidden state predicts each token (-1: none), for a
    tree; None: t - 1 (ordinary packing and padding).
    sampling: per-token settings (`Sampling`); None: `temperature` everywhere, no top-k / top-p.
    chunk_tokens: tokens (N x columns) per LM-head chunk; None: the whole batch at once.
    need: (N, T) bool/0-1, the tokens whose logprob is wanted (the sampled ones), or None for all.
    Only the columns where some row needs a logprob go through the LM head: an agent's rows are
    mostly prompt (system prompt, tool schemas), and the logits of those columns were most of the
    work. Columns not computed read 0, like column 0 and a tree's roots.
    Returns (logp (N, T) float32, entropy (N, T) float32 or None), aligned with input_ids:
    logp[:, t] = log p(input_ids[:, t] | the tokens t attends to), 0 in column 0. Both carry
    grad when grad is enabled (the entropy bonus trains on it).
    A sharded model (module/sharding.py) runs all of it inside its root's forward: the decoder,
    then the LM head chunk by chunk, with the root's weights gathered.
    """
    if sampling is None:
        sampling = Sampling.uniform(input_ids, temperature)
    if parents is not None:
        check_tree_attention(model)
    return run_sharded(
        model,
        _token_logprobs,
        model,
        input_ids,
        position_ids,
        attention_mask,
        parents,
        sampling,
        with_entropy,
        chunk_tokens,
        need,
    )


def _token_logprobs(
    model: nn.Module,
    input_ids: torch.Tensor,
    position_ids: torch.Tensor,
    attention_mask: torch.Tensor | None,
    parents: torch.Tensor | None,
    sampling: Sampling,
    with_entropy: bool,
    chunk_tokens: int | None,
    need: torch.Tensor | None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    n, t = input_ids.shape
    hidden, head = _hidden_and_head(model, input_ids, position_ids, attention_mask)
    cols = _scored_columns(need, parents, t)
    hidden, targets = _predictions(hidden, input_ids, cols, parents)
    params: tuple[torch.Tensor, ...] = (sampling.temperature, sampling.top_k, sampling.top_p)
    params = tuple(p[:, 1:] if cols is None else p[:, cols] for p in params)
    k = targets.shape[1]
    step = max(k, 1) if chunk_tokens is None else max(1, chunk_tokens // max(n, 1))  # k = 0: nothing needed
    grad = torch.is_grad_enabled()
    logps, ents = [], []
    for c0 in range(0, k, step):
        sl = slice(c0, c0 + step)
        args: tuple = (head, hidden[:, sl], targets[:, sl], *(p[:, sl] for p in params), with_entropy)
        if grad and step < k:
            lp, ent = checkpoint(_chunk_logprobs, *args, use_reentrant=False)
        else:
            lp, ent = _chunk_logprobs(*args)
        logps.append(lp)
        ents.append(ent)
    roots = None if parents is None else parents < 0  # a tree's roots have no logprob
    logp = _place(logps, cols, n, t, input_ids.device, roots)
    if not with_entropy:
        return logp, None
    return logp, _place(ents, cols, n, t, input_ids.device, roots)


def _scored_columns(need: torch.Tensor | None, parents: torch.Tensor | None, t: int) -> torch.Tensor | None:
    """(K,) the columns whose tokens get a logprob: those some row needs, or every column; None for
    every column from 1 under ordinary packing (sliced, not gathered)."""
    if need is None:
        return None if parents is None else torch.arange(t, device=parents.device)
    cols = torch.nonzero(need.bool().any(0)).squeeze(-1)
    return cols if parents is not None else cols[cols > 0]


def _predictions(
    hidden: torch.Tensor, input_ids: torch.Tensor, cols: torch.Tensor | None, parents: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """(hidden state predicting each scored token (N, K, H), the tokens (N, K)). Ordinary packing:
    the state at t - 1; a tree: the state at the token's parent (a root reads column 0; its
    logprob is dropped)."""
    if cols is None:
        return hidden[:, :-1], input_ids[:, 1:]
    if parents is None:
        return hidden[:, cols - 1], input_ids[:, cols]
    src = parents[:, cols].clamp(min=0)  # (N, K)
    return hidden.gather(1, src[..., None].expand(-1, -1, hidden.shape[-1])), input_ids[:, cols]


def _place(
    chunks: list[torch.Tensor],
    cols: torch.Tensor | None,
    n: int,
    t: int,
    device: torch.device,
    roots: torch.Tensor | None,
) -> torch.Tensor:
    """(N, T): the computed columns (concatenated chunks, at `cols`, or at 1..T-1 when None) put
    back in place, 0 in every column not computed and at a tree's `roots` ((N, T) bool)."""
    if not chunks:
        return torch.zeros(n, t, device=device)
    vals = torch.cat(chunks, dim=1)
    full = nn.functional.pad(vals, (1, 0)) if cols is None else vals.new_zeros(n, t).index_copy(1, cols, vals)
    return full if roots is None else full.masked_fill(roots, 0.0)
