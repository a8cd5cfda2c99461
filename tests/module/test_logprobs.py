"""Trainer logprobs: the engine's processed distribution (temperature, top-k, top-p) per token,
chunked exactly as unchunked (values and gradients), entropies, and the sampled token never
filtered to -inf."""

from __future__ import annotations

import pytest
import torch
from small_model import VOCAB, small_model

from polar_pl.engine.sampling import processed_logits, sampling_filter
from polar_pl.module.logprobs import Sampling, forward_inputs, scorable, token_logprobs


def batch(n: int = 2, t: int = 12, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, VOCAB, (n, t), generator=g)
    pos = torch.arange(t).repeat(n, 1)
    if t > 8:
        pos[0, 7:] = torch.arange(t - 7)  # two packed rows in sequence 0
    return ids, pos


def mixed_sampling(ids: torch.Tensor) -> Sampling:
    s = Sampling.uniform(ids)
    s.temperature[:, 3:] = 0.7
    s.top_p[:, 5:] = 0.5
    s.top_k[1, :] = 4
    s.temperature[1, 9:] = 0.0  # greedy: raw logprobs, nothing filtered
    return s


def by_hand(model, ids, pos, s: Sampling) -> torch.Tensor:
    """Per row and token, the processed distribution written out with plain loops."""
    with torch.no_grad():
        logits = model(input_ids=ids, position_ids=pos, use_cache=False).logits.float()
    out = torch.zeros(ids.shape)
    for i in range(ids.shape[0]):
        for t in range(1, ids.shape[1]):
            z, temp = logits[i, t - 1], float(s.temperature[i, t])
            k, p = int(s.top_k[i, t]), float(s.top_p[i, t])
            if temp < 1e-5:
                out[i, t] = torch.log_softmax(z, -1)[ids[i, t]]
                continue
            z = z / temp
            order = torch.argsort(z, descending=True)
            keep = torch.zeros(VOCAB, dtype=torch.bool)
            kept_k = order[:k] if 0 < k < VOCAB else order
            kth = z[kept_k[-1]]
            keep[z >= kth] = True  # ties with the k-th value stay
            probs = torch.softmax(z.masked_fill(~keep, -torch.inf), -1)
            mass = 0.0
            nucleus = torch.zeros_like(keep)
            for j in torch.argsort(probs, descending=True).tolist():
                if mass >= p or probs[j] == 0:
                    break
                nucleus[j] = True
                mass += float(probs[j])
            nucleus[ids[i, t]] = True  # the sampled token is never filtered out
            out[i, t] = torch.log_softmax(z.masked_fill(~nucleus, -torch.inf), -1)[ids[i, t]]
    return out


def test_processed_logprobs_by_hand() -> None:
    model = small_model()
    ids, pos = batch()
    s = mixed_sampling(ids)
    with torch.no_grad():
        lp, _ = token_logprobs(model, ids, pos, sampling=s)
        plain, _ = token_logprobs(model, ids, pos)
    ref = by_hand(model, ids, pos, s)
    cols = pos > 0
    assert lp[cols].tolist() == pytest.approx(ref[cols].tolist(), abs=1e-5)
    assert (lp[:, 0] == 0).all()
    assert not torch.allclose(lp[:, 5:], plain[:, 5:])  # the transform did something


def test_sampling_filter_follows_vllm_rules() -> None:
    # probs 0.5, 0.25, 0.125, 0.125: top_p 0.6 keeps the two best (0.5 alone is < 0.6)
    z = torch.log(torch.tensor([[0.125, 0.5, 0.125, 0.25]]))
    drop = sampling_filter(z, torch.tensor([-1]), torch.tensor([0.6]))
    assert drop.tolist() == [[True, False, True, False]]
    # top_k 3 keeps both tokens tied with the third value
    drop = sampling_filter(z, torch.tensor([3]), torch.tensor([1.0]))
    assert drop.tolist() == [[False, False, False, False]]
    assert sampling_filter(z, torch.tensor([0]), torch.tensor([1.0])) is None
    out = processed_logits(
        z, torch.tensor([0.5]), torch.tensor([2]), torch.tensor([1.0]), keep=torch.tensor([0])
    )
    assert torch.isfinite(out).tolist() == [[True, True, False, True]]  # token 0 kept though filtered


@pytest.mark.parametrize("chunk", [1, 5, 7, 1000])
def test_chunked_equals_whole_with_gradients(chunk) -> None:
    ids, pos = batch()
    s = mixed_sampling(ids)
    grads, values = [], []
    for c in (None, chunk):
        model = small_model()
        lp, ent = token_logprobs(model, ids, pos, sampling=s, with_entropy=True, chunk_tokens=c)
        (lp.sum() + 0.3 * ent.sum()).backward()
        values.append((lp.detach(), ent.detach()))
        grads.append(torch.cat([p.grad.flatten() for p in model.parameters()]))
    assert torch.allclose(values[0][0], values[1][0], atol=1e-5)
    assert torch.allclose(values[0][1], values[1][1], atol=1e-5)
    assert torch.allclose(grads[0], grads[1], atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("chunk", [None, 3])
def test_needed_columns_only_equal_the_whole_pass(chunk) -> None:
    """`need` (the sampled tokens) runs the LM head on those columns only: their logprobs,
    entropies and gradients equal the whole pass; every other column reads 0."""
    ids, pos = batch()
    s = mixed_sampling(ids)
    need = torch.zeros(ids.shape, dtype=torch.bool)
    need[0, [3, 4, 10]] = True
    need[1, [4, 11]] = True
    out = []
    for kw in ({}, {"need": need}):
        model = small_model()
        lp, ent = token_logprobs(model, ids, pos, sampling=s, with_entropy=True, chunk_tokens=chunk, **kw)
        ((lp + 0.3 * ent) * need).sum().backward()
        out.append((lp.detach(), ent.detach(), torch.cat([p.grad.flatten() for p in model.parameters()])))
    (lp_all, ent_all, g_all), (lp_need, ent_need, g_need) = out
    cols = need.any(0)
    assert torch.allclose(lp_need[:, cols], lp_all[:, cols], atol=1e-5)
    assert torch.allclose(ent_need[:, cols], ent_all[:, cols], atol=1e-5)
    assert (lp_need[:, ~cols] == 0).all() and (ent_need[:, ~cols] == 0).all()
    assert torch.allclose(g_need, g_all, atol=1e-5, rtol=1e-4)


def test_entropy_of_the_processed_distribution() -> None:
    model = small_model()
    ids, pos = batch(n=1, t=4)
    s = Sampling.uniform(ids, temperature=0.7)
    s.top_k[:] = 3
    with torch.no_grad():
        _, ent = token_logprobs(model, ids, pos, sampling=s, with_entropy=True)
        logits = model(input_ids=ids, position_ids=pos, use_cache=False).logits[0, :-1] / 0.7
    for t in range(1, 4):
        p = torch.softmax(logits[t - 1].topk(3).values, -1)
        assert float(ent[0, t]) == pytest.approx(float(-(p * p.log()).sum()), abs=1e-5)


def test_plain_module_without_lm_head_falls_back_to_logits() -> None:
    """Any nn.Module with a HF causal-LM forward (no base_model / LM head split) still works."""
    hf = small_model()

    class Wrapper(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.inner = hf

        def forward(self, **kw):
            return self.inner(**kw)

    ids, pos = batch()
    with torch.no_grad():
        a, _ = token_logprobs(Wrapper(), ids, pos, chunk_tokens=4)
        b, _ = token_logprobs(hf, ids, pos)
    assert torch.allclose(a, b, atol=1e-6)


def test_single_row_sequences_run_causal_without_a_block_mask() -> None:
    """A sequence holding one row then padding needs no (T, T) block mask: its positions continue
    through the padding and the logprobs of the row are unchanged."""
    model = small_model()
    ids, _ = batch(n=2, t=10)
    pos = torch.tensor([list(range(7)) + [0, 1, 2], list(range(10))])  # row of 7 + padding; full row
    rows = torch.tensor([[0] * 7 + [-1] * 3, [1] * 10])
    inputs = forward_inputs(pos, rows, None)
    new_pos = inputs["position_ids"]
    assert new_pos.tolist() == [list(range(10))] * 2 and inputs["attention_mask"] is None
    with torch.no_grad():
        a, _ = token_logprobs(model, ids, pos)
        b, _ = token_logprobs(model, ids, new_pos)
    assert torch.allclose(a[rows >= 0], b[rows >= 0], atol=1e-5)
    packed = torch.tensor([[0] * 4 + [1] * 6, [2] * 10])
    # two rows in a sequence: the mask is needed
    assert forward_inputs(pos, packed, None)["position_ids"] is pos


def test_no_needed_column_gives_zeros() -> None:
    """A micro-batch whose sequences hold no trainable token (excluded side rows, say) asked the
    LM head for nothing: it crashed with 'range() arg 3 must not be zero'."""
    ids, pos = batch()
    lp, ent = token_logprobs(small_model(), ids, pos, need=torch.zeros_like(ids), with_entropy=True)
    assert lp.shape == ent.shape == ids.shape and (lp == 0).all() and (ent == 0).all()


def test_the_first_token_of_each_packed_row_is_not_scorable() -> None:
    """Two rows packed in one sequence (positions restart at 0): neither first token has a logprob."""
    assert scorable(torch.tensor([[0, 1, 2, 0, 1]])).tolist() == [[False, True, True, False, True]]
