"""The scheduler's KV caches: in-place batch appends and prompt-prefix reuse give the same tokens
and logprobs as computing everything from scratch."""

from __future__ import annotations

import asyncio

import pytest
import torch
from transformers import AutoModelForCausalLM, DynamicCache

from polar_pl.engine.backend import GenerationRequest, SamplingParams
from polar_pl.engine.kvcache import PrefixCache, batch_cache, with_cache
from polar_pl.engine.transformers_backend import TransformersBackend


def test_growing_layer_decodes_like_dynamic_cache(tiny_model_dir):
    """Decode steps over the in-place cache (which replaced DynamicLayer's per-step torch.cat of
    the whole cache, 72% of a decode step on 20k-token harness prompts) give the same logits."""
    model = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir)).eval()
    torch.manual_seed(0)
    b, t = 3, 40
    prompt = torch.randint(10, 500, (b, t))
    with torch.inference_mode():
        pre = DynamicCache()
        model(input_ids=prompt, **with_cache(model, pre), use_cache=True)
        layers = [(layer.keys, layer.values) for layer in pre.layers]
        ref, grow = DynamicCache(ddp_cache_data=layers), batch_cache(layers)
        token = torch.full((b, 1), 7)
        for step in range(300):  # past the spare room: the buffers grow at least once
            pos = torch.full((b, 1), t + step)
            a = model(input_ids=token, position_ids=pos, **with_cache(model, ref), use_cache=True).logits
            g = model(input_ids=token, position_ids=pos, **with_cache(model, grow), use_cache=True).logits
            assert torch.allclose(a, g, atol=1e-5)
            token = a[:, -1].argmax(-1, keepdim=True)
    assert grow.get_seq_length() == t + 300


def test_the_cache_reaches_the_forward_under_either_keyword(tiny_model_dir):
    """A token decoded over the prompt's cache sees the prompt: its logits are the full forward's.
    transformers before 5.2x reads `past_key_values` and swallows `cache=` unread, and the engine
    sampled noise from a model that saw one token at a time; with_cache names what the forward reads."""
    model = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir)).eval()
    prompt = torch.randint(10, 500, (1, 24), generator=torch.Generator().manual_seed(1))
    with torch.inference_mode():
        full = model(input_ids=prompt).logits[:, -1]
        cache = DynamicCache()
        model(input_ids=prompt[:, :-1], **with_cache(model, cache), use_cache=True)
        step = model(input_ids=prompt[:, -1:], **with_cache(model, cache), use_cache=True).logits[:, -1]
        alone = model(input_ids=prompt[:, -1:]).logits[:, -1]
    assert torch.allclose(step, full, atol=1e-5)
    assert not torch.allclose(step, alone, atol=1e-3)  # the context changes the prediction

    class Before(torch.nn.Module):  # transformers 5.17's signature
        def forward(self, input_ids=None, past_key_values=None, use_cache=None, **kwargs): ...

    class Wrapper(torch.nn.Module):
        def forward(self, *args, **kwargs): ...

    assert with_cache(Before(), cache) == {"past_key_values": cache}
    with pytest.raises(TypeError, match="takes no KV cache"):
        with_cache(Wrapper(), cache)


def _generate(backend: TransformersBackend, prompt: list[int], n: int = 12):
    async def go():
        params = SamplingParams(max_tokens=n, temperature=0.0, logprobs=0, ignore_eos=True)
        ids, lps = [], []
        async for deltas in backend.generate(GenerationRequest(f"r{len(prompt)}", tuple(prompt), params)):
            for d in deltas:
                ids += d.token_ids
                lps += [lp.logprob for lp in d.logprobs]
        return ids, lps

    return asyncio.run(go())


def _admitted_together(backend: TransformersBackend, requests: list[tuple[list[int], SamplingParams]]):
    """Every request submitted to the backend before it starts, so its first turn admits them all;
    per request, {choice index: (token ids, logprobs)}. Closes the backend."""

    async def go():
        async def one(i: int, prompt: list[int], params: SamplingParams):
            out: dict[int, tuple[list[int], list[float]]] = {}
            async for deltas in backend.generate(GenerationRequest(f"t{i}", tuple(prompt), params)):
                for d in deltas:
                    ids, lps = out.setdefault(d.index, ([], []))
                    ids += d.token_ids
                    lps += [lp.logprob for lp in d.logprobs]
            return out

        tasks = [asyncio.create_task(one(i, *r)) for i, r in enumerate(requests)]
        while len(backend._scheduler._waiting) < len(requests):  # all submitted, none admitted
            await asyncio.sleep(0.01)
        backend.start()
        return await asyncio.gather(*tasks)

    try:
        return asyncio.run(go())
    finally:
        backend.close()


@pytest.fixture(scope="module")
def backends(tiny_model_dir):
    cached = TransformersBackend(tiny_model_dir, num_threads=1, prefill_chunk=16)
    plain = TransformersBackend(tiny_model_dir, num_threads=1, prefill_chunk=16, prefix_cache_mb=0)
    cached.start(), plain.start()
    yield cached, plain
    cached.close(), plain.close()


def test_prefix_cache_reuses_a_shared_prompt_exactly(backends):
    """A prompt that starts with an earlier one (the next turn of a harness session, or a sibling
    session with the same system prompt) prefills only its tail, with the same greedy tokens and
    logprobs as a full prefill. A prompt's last token is computed in the batch's decode step, so
    what is cached of it is all but that token."""
    cached, plain = backends
    base = [(i * 37) % 700 + 20 for i in range(90)]
    turn2 = base + [5, 6, 7, 8, 9, 10]
    sibling = base[:70] + [11, 12, 13]
    _generate(cached, base)
    hits = cached.stats.extra["prefix_cache_hit_tokens"]
    for prompt, reused in ((turn2, len(base) - 1), (sibling, 70)):
        ids, lps = _generate(cached, prompt)
        ref_ids, ref_lps = _generate(plain, prompt)
        assert ids == ref_ids
        assert max(abs(a - b) for a, b in zip(lps, ref_lps, strict=True)) < 1e-4
        assert cached.stats.extra["prefix_cache_hit_tokens"] - hits == reused
        hits = cached.stats.extra["prefix_cache_hit_tokens"]
    assert plain.stats.extra["prefix_cache_hits"] == 0


def test_prefix_cache_is_cleared_by_new_weights(backends):
    """KV computed by the old weights is never reused after a weight update."""
    cached, _ = backends
    prompt = [(i * 11) % 500 + 30 for i in range(40)]
    _generate(cached, prompt)
    assert cached.stats.extra["prefix_cache_entries"] >= 1
    cached.update_weights_from_state_dict(dict(cached.model.state_dict()))
    hits = cached.stats.extra["prefix_cache_hits"]
    _generate(cached, prompt + [3])
    assert cached.stats.extra["prefix_cache_hits"] == hits


def test_prefix_cache_budget_and_covered_entries():
    """The byte budget evicts least recently used entries; an entry that is a prefix of a new one
    is dropped (the new one covers it)."""

    def kv(t):  # 16 bytes per token
        return [(torch.zeros(1, 1, t, 2), torch.zeros(1, 1, t, 2))]

    cache = PrefixCache(max_bytes=16 * 24)
    cache.insert([1, 2, 3], kv(3))
    cache.insert([1, 2, 3, 4, 5], kv(5))
    assert len(cache) == 1
    cache.insert([9] * 10, kv(10))
    cache.insert([8] * 10, kv(10))  # evicts [1..5]
    assert cache.lookup([1, 2, 3, 4, 5, 6]) == (0, None)
    assert cache.lookup([9] * 12)[0] == 10


def test_requests_admitted_together_join_the_batch_in_one_merge_and_decode_as_alone(backends, tiny_model_dir):
    """Requests waiting when the scheduler turns are all admitted in that turn and their rows are
    merged into the batch cache with one copy (prompts of different lengths, n=2 among them):
    each decodes the same greedy tokens and logprobs as alone."""
    _, plain = backends
    prompts = [[(i * 13) % 600 + 25 for i in range(k)] for k in (9, 40, 23)]
    alone = [_generate(plain, p, n=10) for p in prompts]
    together = TransformersBackend(tiny_model_dir, num_threads=1, prefill_chunk=16, prefix_cache_mb=0)
    results = _admitted_together(
        together,
        [
            (p, SamplingParams(max_tokens=10, temperature=0.0, logprobs=0, ignore_eos=True, n=1 + (i == 1)))
            for i, p in enumerate(prompts)
        ],
    )
    assert together.stats.max_batch_size == 4  # 1 + 2 + 1 rows in one batch from the first step
    for out, (ref_ids, ref_lps) in zip(results, alone, strict=True):
        for ids, lps in out.values():
            assert ids == ref_ids
            assert max(abs(a - b) for a, b in zip(lps, ref_lps, strict=True)) < 1e-4


def test_a_cached_prompts_first_token_needs_no_forward_pass_of_its_own(backends, tiny_model_dir):
    """A group's attempts share their prompt. The first prefills all of it but the last token and
    caches that; the others find it all cached and cost no forward pass before the batch's: every
    row's first token is sampled in the decode step with everyone else's. Five requests of one
    30-token prompt admitted together (16-token chunks, 6 tokens each): 2 prefill chunks and 6
    decode steps in all (it was 2 + 4 + 5), each row decoding as alone."""
    _, plain = backends
    prompt = [(i * 29) % 650 + 21 for i in range(30)]
    ref_ids, ref_lps = _generate(plain, prompt, n=6)
    backend = TransformersBackend(tiny_model_dir, num_threads=1, prefill_chunk=16)
    params = SamplingParams(max_tokens=6, temperature=0.0, logprobs=0, ignore_eos=True)
    results = _admitted_together(backend, [(prompt, params)] * 5)
    assert backend.stats.extra["prefill_forwards"] == 2 and backend.stats.steps == 6
    assert backend.stats.max_batch_size == 5
    for out in results:
        ids, lps = out[0]
        assert ids == ref_ids
        assert max(abs(a - b) for a, b in zip(lps, ref_lps, strict=True)) < 1e-4


def test_a_one_token_prompt_decodes_as_the_model_without_a_cache(backends):
    """A one-token prompt has no context to prefill: its row joins the batch with an empty KV."""
    _, plain = backends
    ids, lps = _generate(plain, [42], n=5)
    context = [42]
    with torch.inference_mode():
        for tok, lp in zip(ids, lps, strict=True):
            logits = plain.model(input_ids=torch.tensor([context])).logits[0, -1].float()
            assert tok == int(logits.argmax())
            assert abs(float(torch.log_softmax(logits, -1)[tok]) - lp) < 1e-4
            context.append(tok)
