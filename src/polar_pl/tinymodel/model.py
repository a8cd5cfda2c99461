"""The tiny Qwen3 causal LM: config, seeded initialization, save with its generation config."""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import GenerationConfig, PreTrainedModel, Qwen3Config, Qwen3ForCausalLM

# Real harness prompts are 5-80 KB, i.e. up to ~30k tokens with the small vocabulary; Qwen3 ships 40960.
MAX_POSITIONS = 40960


def tiny_config(vocab_size: int, eos_id: int, pad_id: int) -> Qwen3Config:
    """About 0.4M parameters outside the (tied) embedding: 2 layers, hidden 128, GQA 4/2 heads."""
    return Qwen3Config(
        vocab_size=vocab_size,
        hidden_size=128,
        intermediate_size=384,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        max_position_embeddings=MAX_POSITIONS,
        rope_parameters={"rope_type": "default", "rope_theta": 1_000_000.0},
        rms_norm_eps=1e-6,
        tie_word_embeddings=True,
        bos_token_id=None,
        eos_token_id=eos_id,
        pad_token_id=pad_id,
        dtype="float32",
        architectures=["Qwen3ForCausalLM"],
    )


def init_model(config: Qwen3Config, seed: int) -> Qwen3ForCausalLM:
    """A freshly initialized model; the seed alone decides every weight."""
    generator_state = torch.random.get_rng_state()
    try:
        torch.manual_seed(seed)
        model = Qwen3ForCausalLM(config)
    finally:
        torch.random.set_rng_state(generator_state)  # do not disturb the caller's RNG stream
    return model.eval()


def save_model(model: PreTrainedModel, out_dir: Path, eos_ids: list[int], pad_id: int) -> None:
    """Write config.json, model.safetensors and generation_config.json (both ChatML stops as eos)."""
    model.generation_config = GenerationConfig(eos_token_id=eos_ids, pad_token_id=pad_id)
    model.save_pretrained(out_dir)
