"""Next-token sampling for a batch of sequences with per-sequence settings (vLLM semantics).

Logprobs are those of the distribution actually sampled from: after temperature, top-k and top-p
(vLLM's `--logprobs-mode processed_logprobs`, which polar_pl's vLLM launcher sets), so the
behaviour logprobs a trace records describe the sampling policy and the trainer can rebuild it
(module/logprobs.py calls `processed_logits` too). Temperature < 1e-5 means greedy; greedy rows
report the raw distribution, as vLLM does. A tool-call grammar masks the logits before any of
this (engine/scheduler.py), as vLLM's structured outputs do.
"""

from __future__ import annotations

import torch

from polar_pl.engine.backend import SamplingParams, TokenLogprob

_GREEDY_EPS = 1e-5


@torch.no_grad()
def sampling_filter(scaled: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor | None:
    """(..., V) bool: tokens top-k then top-p remove from temperature-scaled logits, or None if
    neither is on anywhere.

    scaled: (..., V) float32 logits already divided by the temperature; top_k: (...) long (<= 0 or
    >= V: off); top_p: (...) float in (0, 1]. vLLM's rules (`apply_top_k_top_p`): top-k keeps every
    token tied with the k-th largest; top-p then renormalises over the survivors, sorts ascending
    and drops the tokens whose cumulative mass is <= 1 - p, always keeping the most likely one.
    """
    vocab = scaled.shape[-1]
    k_on = (top_k > 0) & (top_k < vocab)
    p_on = top_p < 1.0
    if not bool(k_on.any()) and not bool(p_on.any()):
        return None
    ordered, order = scaled.sort(dim=-1)  # ascending, as vLLM
    k = torch.where(k_on, top_k, vocab).clamp(max=vocab)
    kth = ordered.gather(-1, (vocab - k).unsqueeze(-1))
    drop = ordered < kth
    if bool(p_on.any()):
        cum = ordered.masked_fill(drop, float("-inf")).softmax(dim=-1).cumsum(dim=-1)
        drop |= cum <= (1.0 - top_p).unsqueeze(-1)
        drop[..., -1] = False
    return torch.empty_like(drop).scatter_(-1, order, drop)


def processed_logits(
    logits: torch.Tensor,
    temperature: torch.Tensor,
    top_k: torch.Tensor,
    top_p: torch.Tensor,
    keep: torch.Tensor | None = None,
) -> torch.Tensor:
    """The logits of the distribution actually sampled (vLLM's `processed_logprobs` mode).

    logits: (..., V) float; temperature, top_p: (...) float; top_k: (...) long; keep: (...) long
    token ids never filtered out, or None. Returns (..., V) float32: logits / temperature with the
    `sampling_filter` tokens at -inf. Greedy positions (temperature < 1e-5) come back unscaled and
    unfiltered: vLLM reports their raw logprobs. Differentiable in `logits` (the filter is a
    constant). The trainer passes the sampled token as `keep`: a token sampled from the engine's
    nucleus must not become -inf because the trainer's numerics put it just outside.
    """
    greedy = temperature < _GREEDY_EPS
    temp = torch.where(greedy, 1.0, temperature).to(torch.float32)
    scaled = logits.float() / temp.unsqueeze(-1)
    drop = sampling_filter(
        scaled.detach(), torch.where(greedy, -1, top_k), torch.where(greedy, 1.0, top_p).to(torch.float32)
    )
    if drop is None:
        return scaled
    if keep is not None:
        drop = drop.scatter(-1, keep.unsqueeze(-1), False)
    return scaled.masked_fill(drop, float("-inf"))


def make_generator(params: SamplingParams, index: int, device: torch.device) -> torch.Generator | None:
    """A seeded generator per choice (seed + choice index), None for unseeded or greedy sampling."""
    if params.seed is None or params.temperature < _GREEDY_EPS:
        return None
    gen = torch.Generator(device=device)
    gen.manual_seed(params.seed + index)
    return gen


def sample_batch(
    logits: torch.Tensor,
    params: list[SamplingParams],
    generators: list[torch.Generator | None],
) -> tuple[list[int], list[TokenLogprob | None]]:
    """Sample one token per row.

    logits: (B, V) last-position logits, any float dtype.
    Returns the token ids (B,) and, for rows that asked for logprobs, the sampled token's logprob
    with the top-k alternatives.

    Sampling inverts each row's cumulative distribution at one uniform draw (what
    `torch.multinomial` does, batched): one random number per row instead of one per vocabulary
    entry, and three passes over (B, V) (exp, cumsum, search) where an exponential race takes
    six, which was a fifth of a 32-row decode step of SmolLM2 (49k tokens). Seeded rows draw
    from their own generator, so their samples do not depend on what else is in the batch. A
    token of probability 0 (filtered out) is never drawn: its cumulative sum equals its
    predecessor's, so the search never stops on it.
    """
    logits = logits.float()
    dev = logits.device
    temps = torch.tensor([p.temperature for p in params], device=dev)
    top_k = torch.tensor([p.top_k for p in params], device=dev)
    top_p = torch.tensor([p.top_p for p in params], device=dev)
    processed = processed_logits(logits, temps, top_k, top_p)  # (B, V); greedy rows: raw
    logprobs = torch.log_softmax(processed, dim=-1)  # reported, as vLLM's processed_logprobs
    random_rows = [i for i, p in enumerate(params) if p.temperature >= _GREEDY_EPS]
    if len(random_rows) < len(params):
        tokens = torch.argmax(logits, dim=-1)  # (B,) the greedy rows' tokens
    else:
        tokens = torch.empty(len(params), dtype=torch.long, device=dev)
    if random_rows:
        idx = torch.tensor(random_rows, device=dev)
        rows = logprobs if len(random_rows) == len(params) else logprobs.index_select(0, idx)
        cdf = rows.exp().cumsum(dim=-1)  # (R, V); CPU cumsum accumulates in double
        u = torch.empty(len(random_rows), device=dev)
        unseeded = [j for j, i in enumerate(random_rows) if generators[i] is None]
        if unseeded:
            u[unseeded] = torch.rand(len(unseeded), device=dev)
        for j, i in enumerate(random_rows):
            if generators[i] is not None:
                u[j] = torch.rand(1, generator=generators[i], device=dev)[0]
        # u < 1 keeps the target below the total, so the search stays inside the vocabulary
        target = (u * cdf[:, -1]).unsqueeze(-1)  # (R, 1)
        tokens[idx] = torch.searchsorted(cdf, target, right=True).squeeze(-1)
    ids: list[int] = tokens.tolist()
    k_max = max((p.logprobs or 0 for p in params if p.logprobs is not None), default=-1)
    if k_max < 0:
        return ids, [None] * len(ids)
    top_v, top_i = torch.topk(logprobs, max(k_max, 1), dim=-1) if k_max > 0 else (None, None)
    chosen = logprobs.gather(1, tokens.unsqueeze(1)).squeeze(1)
    chosen_l = chosen.tolist()
    top_vl = top_v.tolist() if top_v is not None else None
    top_il = top_i.tolist() if top_i is not None else None
    out: list[TokenLogprob | None] = []
    for row, p in enumerate(params):
        if p.logprobs is None:
            out.append(None)
            continue
        k = p.logprobs
        top = tuple(zip(top_il[row][:k], top_vl[row][:k], strict=True)) if k and top_il and top_vl else ()
        out.append(TokenLogprob(ids[row], chosen_l[row], top))
    return ids, out
