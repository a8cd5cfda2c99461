"""A Qwen3-architecture model small enough for property tests (built from a config, seeded)."""

from __future__ import annotations

import torch
from transformers import Qwen3Config, Qwen3ForCausalLM

VOCAB = 48


def small_model(seed: int = 0) -> Qwen3ForCausalLM:
    torch.manual_seed(seed)
    cfg = Qwen3Config(
        vocab_size=VOCAB, hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
        num_key_value_heads=1, head_dim=8, max_position_embeddings=256, tie_word_embeddings=True,
    )  # fmt: skip
    model = Qwen3ForCausalLM(cfg)
    with torch.no_grad():  # a peaked, uneven distribution: top-k / top-p cut real mass
        model.lm_head.weight.mul_(40.0)
    return model.float().train()
