"""The engine's own forward (engine/decoder.py) against transformers' forward: the same greedy
tokens and the same logprobs on left-padded batches, prefill chunks and prefix-cache hits, for each
architecture it covers; its packed weights follow weight pushes and LoRA merges; a model it does
not cover runs on transformers'."""

from __future__ import annotations

import asyncio

import httpx
import pytest
import torch
from transformers import (
    AutoModelForCausalLM,
    DynamicCache,
    GPT2Config,
    GPT2LMHeadModel,
    LlamaConfig,
    LlamaForCausalLM,
    MistralConfig,
    MistralForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
)

from polar_pl.engine.backend import GenerationRequest, SamplingParams
from polar_pl.engine.decoder import FastDecoder, unsupported
from polar_pl.engine.embedded import EmbeddedEngine
from polar_pl.engine.kvcache import batch_cache, cache_kv, cat_left_padded, with_cache
from polar_pl.engine.transformers_backend import TransformersBackend

SMALL = {
    "hidden_size": 64,
    "intermediate_size": 96,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 300,
}


def compare(model, prompt_lens=(30, 50, 17), steps=24) -> tuple[float, float]:
    """Prefill each prompt alone, then decode the left-padded batch greedily, with both forwards
    side by side (each over its own cache). Asserts equal greedy tokens; returns the largest
    difference of the chosen tokens' logprobs and of any logprob."""
    fast = FastDecoder(model)
    gen = torch.Generator().manual_seed(0)
    chosen = full = 0.0

    def gap(ref: torch.Tensor, got: torch.Tensor) -> None:
        nonlocal chosen, full
        ref, got = ref.log_softmax(-1), got.log_softmax(-1)
        pick = ref.argmax(-1, keepdim=True)
        assert torch.equal(pick, got.argmax(-1, keepdim=True))
        chosen = max(chosen, float((ref.gather(1, pick) - got.gather(1, pick)).abs().max()))
        full = max(full, float((ref - got).abs().max()))

    with torch.inference_mode():
        kvs: tuple[list, list] = ([], [])
        for n in prompt_lens:
            prompt = torch.randint(3, model.config.vocab_size, (1, n), generator=gen)
            ref_cache, fast_cache = DynamicCache(), DynamicCache()
            ref = model(input_ids=prompt, **with_cache(model, ref_cache), use_cache=True).logits[:, -1]
            # two chunks, as the scheduler prefills a long prompt: the second attends to the first
            cut = n // 2
            fast(prompt[:, :cut], torch.arange(cut).unsqueeze(0), None, fast_cache)
            got = fast(prompt[:, cut:], torch.arange(cut, n).unsqueeze(0), None, fast_cache)
            gap(ref, got)
            kvs[0].append(cache_kv(ref_cache))
            kvs[1].append(cache_kv(fast_cache))
        t = max(prompt_lens)
        ref_cache, fast_cache = (
            batch_cache([(cat_left_padded([kv[i][0] for kv in rows], t), cat_left_padded([kv[i][1] for kv in rows], t))
                         for i in range(model.config.num_hidden_layers)])
            for rows in kvs
        )  # fmt: skip
        mask = cat_left_padded([torch.ones(1, n, dtype=torch.long) for n in prompt_lens], t)
        lengths = torch.tensor(prompt_lens)
        tokens = torch.tensor([[5], [6], [7]])
        for _ in range(steps):
            mask = torch.cat([mask, torch.ones(len(prompt_lens), 1, dtype=torch.long)], dim=1)
            positions = lengths.unsqueeze(1)
            ref = model(
                input_ids=tokens, attention_mask=mask, position_ids=positions,
                **with_cache(model, ref_cache), use_cache=True,
            ).logits[:, -1]  # fmt: skip
            got = fast(tokens, positions, mask, fast_cache)
            gap(ref, got)
            tokens, lengths = ref.argmax(-1, keepdim=True), lengths + 1
    return chosen, full


@pytest.mark.parametrize(
    "build",
    [
        lambda: LlamaForCausalLM(LlamaConfig(**SMALL)),
        lambda: Qwen2ForCausalLM(Qwen2Config(**SMALL)),  # biases on q, k, v
        lambda: MistralForCausalLM(MistralConfig(**SMALL, sliding_window=None)),
    ],
    ids=["llama", "qwen2", "mistral"],
)
def test_fast_forward_matches_transformers_for_each_architecture(build) -> None:
    torch.manual_seed(0)
    model = build().eval()
    chosen, full = compare(model)
    assert chosen < 1e-4 and full < 1e-4


def test_fast_forward_matches_transformers_on_the_tiny_model(tiny_model_dir) -> None:
    """Qwen3 (per-head q / k norms)."""
    model = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir), dtype=torch.float32).eval()
    chosen, full = compare(model)
    assert chosen < 1e-4 and full < 1e-4


def test_fast_forward_matches_transformers_on_the_real_model(smollm2_model_dir) -> None:
    """SmolLM2-135M in float32, 30 layers: the sampled tokens' logprobs agree within 1e-4 (oneDNN
    and MKL round their sums differently; the far tail of the vocabulary drifts up to ~5e-4)."""
    model = AutoModelForCausalLM.from_pretrained(str(smollm2_model_dir), dtype=torch.float32).eval()
    chosen, full = compare(model, steps=16)
    assert chosen < 1e-4 and full < 2e-3


def test_models_it_does_not_cover_are_named_and_run_on_transformers(tiny_model_dir) -> None:
    gpt2 = GPT2LMHeadModel(GPT2Config(n_embd=32, n_layer=1, n_head=2, vocab_size=100))
    assert "model_type 'gpt2'" in (unsupported(gpt2) or "")
    windowed = MistralForCausalLM(MistralConfig(**SMALL, sliding_window=16))
    assert unsupported(windowed) == "sliding-window attention"
    half = LlamaForCausalLM(LlamaConfig(**SMALL)).to(torch.bfloat16)
    assert "dtype torch.bfloat16" in (unsupported(half) or "")
    with pytest.raises(ValueError, match="does not cover"):
        FastDecoder(gpt2)
    backend = TransformersBackend(tiny_model_dir, num_threads=1, fast_decoder=False)
    assert backend.stats.extra["fast_decoder"] == "turned off"


def test_the_engine_process_can_be_told_to_run_transformers(tiny_model_dir) -> None:
    """engine.fast_decoder: false reaches a subprocess engine (`polar-pl engine --no-fast-decoder`)."""
    with EmbeddedEngine(tiny_model_dir, mode="subprocess", fast_decoder=False) as engine:
        assert httpx.get(f"{engine.url}/stats", timeout=10).json()["fast_decoder"] == "turned off"


def generate(backend: TransformersBackend, prompts: list[list[int]], n: int = 10):
    """Greedy generations of `prompts`, sent together; per prompt (token ids, logprobs)."""

    async def one(i: int, prompt: list[int]):
        params = SamplingParams(max_tokens=n, temperature=0.0, logprobs=0, ignore_eos=True)
        ids, lps = [], []
        async for deltas in backend.generate(GenerationRequest(f"g{i}", tuple(prompt), params)):
            for d in deltas:
                ids += d.token_ids
                lps += [lp.logprob for lp in d.logprobs]
        return ids, lps

    async def go():
        return await asyncio.gather(*(one(i, p) for i, p in enumerate(prompts)))

    return asyncio.run(go())


PROMPTS = [[(i * 13 + k) % 600 + 25 for i in range(length)] for k, length in enumerate((9, 40, 23))]


def assert_same(got, want) -> None:
    for (ids, lps), (ref_ids, ref_lps) in zip(got, want, strict=True):
        assert ids == ref_ids
        assert max(abs(a - b) for a, b in zip(lps, ref_lps, strict=True)) < 1e-4


@pytest.fixture(scope="module")
def pair(tiny_model_dir):
    """The engine on the fast forward and on transformers' (the reference)."""
    fast = TransformersBackend(tiny_model_dir, num_threads=1, prefill_chunk=16)
    ref = TransformersBackend(tiny_model_dir, num_threads=1, prefill_chunk=16, fast_decoder=False)
    assert fast.stats.extra["fast_decoder"] == "on"
    fast.start(), ref.start()
    yield fast, ref
    fast.close(), ref.close()


def test_the_engine_generates_as_on_transformers(pair) -> None:
    """Continuous batching, chunked prefill and prefix-cache hits (the second round finds the
    first's prompts cached) on the fast forward: the reference engine's tokens and logprobs."""
    fast, ref = pair
    for _ in range(2):
        assert_same(generate(fast, PROMPTS), generate(ref, PROMPTS))
    assert fast.stats.extra["prefix_cache_hits"] > 0


def test_pushed_weights_reach_the_fast_forward(pair) -> None:
    """The packed weights are copies: a push that left them as they were would keep sampling the
    old policy under the new version."""
    fast, ref = pair
    before = generate(fast, PROMPTS)
    gen = torch.Generator().manual_seed(5)
    state = {k: v + 0.05 * torch.randn(v.shape, generator=gen) for k, v in fast.model.state_dict().items()}
    fast.update_weights_from_state_dict(state)
    ref.update_weights_from_state_dict(state)
    after = generate(fast, PROMPTS)
    assert_same(after, generate(ref, PROMPTS))
    assert [ids for ids, _ in after] != [ids for ids, _ in before]


def adapter(model: torch.nn.Module, seed: int) -> dict[str, torch.Tensor]:
    """A random rank-4 LoRA adapter (PEFT names) on q, k, v, o, gate, up and down."""
    g = torch.Generator().manual_seed(seed)
    tensors = {}
    for name, p in model.named_parameters():
        if name.endswith("proj.weight"):
            module = f"base_model.model.{name.removesuffix('.weight')}"
            tensors[f"{module}.lora_A.weight"] = 0.1 * torch.randn(4, p.shape[1], generator=g)
            tensors[f"{module}.lora_B.weight"] = 0.1 * torch.randn(p.shape[0], 4, generator=g)
    return tensors


def test_merged_adapters_reach_the_fast_forward(pair) -> None:
    fast, ref = pair
    config = {"peft_type": "LORA", "r": 4, "lora_alpha": 8}
    for seed in (1, 2):
        tensors = adapter(fast.model, seed)
        fast.update_adapter(tensors, config)
        ref.update_adapter(tensors, config)
        assert_same(generate(fast, PROMPTS), generate(ref, PROMPTS))
