"""The tiny model loads with AutoModelForCausalLM, stops on both ChatML ends and takes 32k contexts."""

from __future__ import annotations

import json

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig


def test_config_and_generation_config(tiny_model_dir):
    config = json.loads((tiny_model_dir / "config.json").read_text())
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    assert config["model_type"] == "qwen3" and config["architectures"] == ["Qwen3ForCausalLM"]
    assert config["tie_word_embeddings"] is True
    assert config["max_position_embeddings"] >= 32768
    assert config["vocab_size"] == len(tok)
    gen = GenerationConfig.from_pretrained(tiny_model_dir)
    assert gen.eos_token_id == [
        tok.convert_tokens_to_ids("<|im_end|>"),
        tok.convert_tokens_to_ids("<|endoftext|>"),
    ]
    assert gen.pad_token_id == tok.pad_token_id
    assert (tiny_model_dir / "model.safetensors").exists()


def test_parameter_budget(tiny_model_dir):
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    non_embedding = sum(p.numel() for n, p in model.named_parameters() if "embed_tokens" not in n)
    assert 200_000 <= non_embedding <= 1_000_000
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()  # tied


def test_chat_generation_stops_or_runs_to_limit(tiny_model_dir):
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    ids = tok.apply_chat_template(
        [{"role": "user", "content": "Hi"}], add_generation_prompt=True, return_tensors="pt"
    )
    out = model.generate(**ids, max_new_tokens=8, do_sample=False)
    generated = out[0, ids["input_ids"].shape[1] :].tolist()
    assert len(generated) == 8 or generated[-1] in model.generation_config.eos_token_id


def test_forward_on_32k_tokens(tiny_model_dir):
    """Real harness prompts reach ~30k tokens; one full-length forward must run (rope + sdpa)."""
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    ids = torch.randint(0, model.config.vocab_size, (1, 32768), generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        full = model(ids, use_cache=False, logits_to_keep=1).logits
        short = model(ids[:, :64], use_cache=False, logits_to_keep=1).logits
        # Causality: the last position of a 64-token prefix matches the same prefix run alone.
        prefix = model(ids[:, :65], use_cache=False, logits_to_keep=2).logits[:, :1]
    assert full.shape == (1, 1, model.config.vocab_size)
    assert torch.isfinite(full).all()
    torch.testing.assert_close(prefix, short, atol=1e-4, rtol=1e-4)
