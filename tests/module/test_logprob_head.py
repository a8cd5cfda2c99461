"""How token_logprobs runs the LM head (its memory contract): only on the needed columns, in chunks
of chunk_tokens tokens, checkpointed (non-reentrant) only when there are several chunks under grad;
a causal LM whose base model is itself falls back to its logits; defaults of the call."""

from __future__ import annotations

import pytest
import torch
from small_model import VOCAB, small_model
from transformers import Qwen3Config, Qwen3ForCausalLM

from polar_pl.module.logprobs import token_logprobs


def inputs(n: int = 2, t: int = 9):
    ids = torch.randint(0, VOCAB, (n, t), generator=torch.Generator().manual_seed(0))
    return ids, torch.arange(t).repeat(n, 1)


def head_calls(model) -> list[tuple[int, ...]]:
    """Shapes of the hidden states each LM-head call gets (forward and checkpoint recompute)."""
    calls: list[tuple[int, ...]] = []
    model.lm_head.register_forward_hook(lambda _m, args, _out: calls.append(tuple(args[0].shape)))
    return calls


def test_the_head_runs_only_on_needed_columns() -> None:
    model = small_model()
    calls = head_calls(model)
    ids, pos = inputs()
    need = torch.zeros_like(ids)
    need[0, 3], need[1, 6] = 1, 1
    with torch.no_grad():
        token_logprobs(model, ids, pos, need=need)
    assert calls == [(2, 2, 16)]


@pytest.mark.parametrize(("n", "chunk", "cols"), [(2, 4, 2), (2, 2, 1), (2, 1, 1), (1, 4, 4)])
def test_chunks_hold_chunk_tokens_tokens(n, chunk, cols) -> None:
    model = small_model()
    calls = head_calls(model)
    ids, pos = inputs(n)
    with torch.no_grad():
        token_logprobs(model, ids, pos, chunk_tokens=chunk)
    widths = [c[1] for c in calls]
    assert sum(widths) == 8 and widths[0] == cols and all(w <= cols for w in widths)


@pytest.mark.parametrize(("chunk", "forwards"), [(None, 1), (16, 1), (8, 2 + 2)])
def test_checkpointing_only_with_several_chunks(chunk, forwards) -> None:
    """One chunk (the whole batch, or chunk_tokens covering every column exactly) keeps its
    logits; several chunks recompute each in the backward."""
    model = small_model()
    calls = head_calls(model)
    ids, pos = inputs()
    lp, _ = token_logprobs(model, ids, pos, chunk_tokens=chunk)
    lp.sum().backward()
    assert len(calls) == forwards


def test_chunked_head_gets_gradients_when_only_the_head_trains() -> None:
    """A reentrant checkpoint would drop them: no input of the chunk (the frozen decoder's hidden
    states) needs grad."""
    torch.manual_seed(0)
    cfg = Qwen3Config(
        vocab_size=VOCAB, hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
        num_key_value_heads=1, head_dim=8, tie_word_embeddings=False,
    )  # fmt: skip
    model = Qwen3ForCausalLM(cfg).float()
    model.model.requires_grad_(False)
    ids, pos = inputs()
    grads = []
    for chunk in (None, 4):
        model.lm_head.weight.grad = None
        token_logprobs(model, ids, pos, chunk_tokens=chunk)[0].sum().backward()
        grads.append(model.lm_head.weight.grad)
    assert grads[1] is not None and torch.allclose(grads[1], grads[0], atol=1e-6)


def test_a_causal_lm_that_is_its_own_base_model_falls_back_to_its_logits() -> None:
    model = small_model()
    model.base_model_prefix = "not_an_attribute"  # transformers' base_model is then the model itself
    assert model.base_model is model and model.get_output_embeddings() is not None
    ids, pos = inputs()
    with torch.no_grad():
        lp, _ = token_logprobs(model, ids, pos)
        logits = model(input_ids=ids, position_ids=pos).logits
    expected = torch.log_softmax(logits[:, :-1], -1).gather(-1, ids[:, 1:, None])[..., 0]
    assert torch.allclose(lp[:, 1:], expected, atol=1e-5)


def test_call_defaults_no_entropy_and_the_given_temperature() -> None:
    model = small_model()
    ids, pos = inputs()
    with torch.no_grad():
        lp, ent = token_logprobs(model, ids, pos, temperature=0.5)
        logits = model(input_ids=ids, position_ids=pos).logits / 0.5
    assert ent is None
    expected = torch.log_softmax(logits[:, :-1], -1).gather(-1, ids[:, 1:, None])[..., 0]
    assert torch.allclose(lp[:, 1:], expected, atol=1e-4)


def test_under_autocast_the_head_runs_in_its_weights_dtype() -> None:
    """bf16 mixed precision: the decoder's matmuls run in bf16, the LM head in fp32 (its weights'
    dtype), so logits are not rounded to bf16 before the log-softmax; gradients still reach every parameter."""
    model = small_model()
    seen: list[tuple[torch.dtype, torch.dtype]] = []
    model.lm_head.register_forward_hook(lambda _m, args, out: seen.append((args[0].dtype, out.dtype)))
    ids, pos = inputs()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        lp, _ = token_logprobs(model, ids, pos)
        assert model.lm_head(torch.ones(1, 16)).dtype == torch.bfloat16  # what autocast would do
    assert seen[0] == (torch.float32, torch.float32)
    lp.sum().backward()
    assert all(p.grad is not None for p in model.parameters())
    ref, _ = token_logprobs(small_model(), ids, pos)
    assert torch.allclose(lp.detach(), ref, atol=0.1)
