"""Next-token sampling for a batch of sequences with per-sequence settings (vLLM semantics).

Logprobs are those of the raw model distribution (vLLM's default `raw_logprobs`), not of the
temperature/top-p adjusted one; temperature < 1e-5 means greedy.
"""

from __future__ import annotations

import torch

from polar_pl.engine.backend import SamplingParams, TokenLogprob

_GREEDY_EPS = 1e-5


def make_generator(params: SamplingParams, index: int, device: torch.device) -> torch.Generator | None:
    """A seeded generator per choice (seed + choice index), None for unseeded or greedy sampling."""
    if params.seed is None or params.temperature < _GREEDY_EPS:
        return None
    gen = torch.Generator(device=device)
    gen.manual_seed(params.seed + index)
    return gen


def _filtered_probs(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """(V,) float32 logits -> (V,) probabilities after temperature, top-k and top-p."""
    logits = logits / params.temperature
    if params.top_k > 0 and params.top_k < logits.numel():
        kth = torch.topk(logits, params.top_k).values[-1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if params.top_p < 1.0:
        sorted_logits, order = torch.sort(logits, descending=True)
        cum = torch.softmax(sorted_logits, dim=-1).cumsum(dim=-1)
        # Keep the smallest prefix whose mass reaches top_p (always at least one token).
        drop = cum - torch.softmax(sorted_logits, dim=-1) >= params.top_p
        sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
        logits = torch.empty_like(logits).scatter_(0, order, sorted_logits)
    return torch.softmax(logits, dim=-1)


def sample_batch(
    logits: torch.Tensor,
    params: list[SamplingParams],
    generators: list[torch.Generator | None],
) -> tuple[list[int], list[TokenLogprob | None]]:
    """Sample one token per row.

    logits: (B, V) last-position logits, any float dtype.
    Returns the token ids (B,) and, for rows that asked for logprobs, the sampled token's logprob
    with the top-k alternatives.
    """
    logits = logits.float()
    logprobs = torch.log_softmax(logits, dim=-1)  # (B, V)
    greedy = torch.argmax(logits, dim=-1)  # (B,)
    tokens: list[int] = []
    for row, (p, gen) in enumerate(zip(params, generators, strict=True)):
        if p.temperature < _GREEDY_EPS:
            tokens.append(int(greedy[row]))
            continue
        probs = _filtered_probs(logits[row], p)
        tokens.append(int(torch.multinomial(probs, 1, generator=gen)))
    k_max = max((p.logprobs or 0 for p in params if p.logprobs is not None), default=-1)
    if k_max < 0:
        return tokens, [None] * len(tokens)
    top_v, top_i = torch.topk(logprobs, max(k_max, 1), dim=-1) if k_max > 0 else (None, None)
    chosen = logprobs.gather(1, torch.tensor(tokens, device=logits.device).unsqueeze(1)).squeeze(1)
    chosen_l = chosen.tolist()
    top_vl = top_v.tolist() if top_v is not None else None
    top_il = top_i.tolist() if top_i is not None else None
    out: list[TokenLogprob | None] = []
    for row, p in enumerate(params):
        if p.logprobs is None:
            out.append(None)
            continue
        k = p.logprobs
        top = tuple(zip(top_il[row][:k], top_vl[row][:k], strict=True)) if k and top_il else ()
        out.append(TokenLogprob(tokens[row], chosen_l[row], top))
    return tokens, out
