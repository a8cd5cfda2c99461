"""The engine's sampler (engine/sampling.py sample_batch): draws follow the processed distribution,
never a token filtered out, seeded rows repeat whatever else is in the batch, greedy rows take the
argmax, and the reported logprobs are the processed distribution's."""

from __future__ import annotations

import torch

from polar_pl.engine.backend import SamplingParams
from polar_pl.engine.sampling import processed_logits, sample_batch


def test_draws_follow_the_distribution_and_skip_filtered_tokens() -> None:
    """20k draws of a 6-token distribution with top_k=4: every frequency within 0.015 of its
    probability; the two tokens top-k removes (one of them the last, where a search that ran off
    the end would land) are never drawn."""
    logits = torch.tensor([[0.0, 1.0, 2.0, -1.0, 0.5, -3.0]])
    params = SamplingParams(max_tokens=1, temperature=0.8, top_k=4)
    probs = processed_logits(logits, torch.tensor([0.8]), torch.tensor([4]), torch.tensor([1.0])).softmax(-1)[
        0
    ]
    torch.manual_seed(0)
    rows = 200
    counts = torch.zeros(6)
    for _ in range(100):  # 100 batches of 200 unseeded rows
        ids, _ = sample_batch(logits.expand(rows, -1), [params] * rows, [None] * rows)
        counts += torch.bincount(torch.tensor(ids), minlength=6)
    freq = counts / counts.sum()
    assert counts[3] == 0 and counts[5] == 0
    assert float((freq - probs).abs().max()) < 0.015


def test_seeded_rows_do_not_depend_on_the_batch() -> None:
    torch.manual_seed(1)
    logits = torch.randn(4, 1000)
    seeded = SamplingParams(max_tokens=1, temperature=1.0, logprobs=0)
    other = SamplingParams(max_tokens=1, temperature=0.7, top_p=0.9)

    def seeded_row(batch: list[int]) -> int:
        params = [seeded if i == 2 else other for i in batch]
        gens = [torch.Generator().manual_seed(7) if i == 2 else None for i in batch]
        ids, _ = sample_batch(logits[batch], params, gens)
        return ids[batch.index(2)]

    assert len({seeded_row([2]), seeded_row([0, 2, 1]), seeded_row([3, 1, 0, 2])}) == 1


def test_greedy_rows_and_reported_logprobs() -> None:
    torch.manual_seed(2)
    logits = torch.randn(3, 50)
    params = [
        SamplingParams(max_tokens=1, temperature=0.0, logprobs=2),
        SamplingParams(max_tokens=1, temperature=0.5, top_p=0.8, logprobs=0),
        SamplingParams(max_tokens=1, temperature=1.0),
    ]
    ids, lps = sample_batch(logits, params, [None, None, None])
    assert ids[0] == int(logits[0].argmax())
    assert lps[0] is not None and lps[0].top[0] == (ids[0], lps[0].logprob)
    assert len(lps[0].top) == 2 and lps[2] is None
    want = processed_logits(logits[1], torch.tensor(0.5), torch.tensor(-1), torch.tensor(0.8)).log_softmax(-1)
    assert lps[1] is not None and abs(lps[1].logprob - float(want[ids[1]])) < 1e-6
