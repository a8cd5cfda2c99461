"""Tree attention: transformers' sdpa, with a token tree's leading prefix run causally, unmasked.

A tree batch (datamodule/tree.py) starts each sequence with a chain, the group's shared prefix,
whose queries attend causally; only the queries after it (the suffixes, and any later tree) need an
explicit mask. `attention_tail` gives that mask for the queries from column c on, shape
(N, 1, T - c, T). This attention runs queries [0, c) through sdpa's causal kernel over keys
[0, c) and queries [c, T) through sdpa with the mask over every key. A whole (T, T) mask would
cost T^2 bytes (275 MB at a 15k prefix with 8 suffixes of 200 tokens) and have the kernel score
every (query, key) pair, twice the work of the causal prefix plus the masked suffixes there.

Every other mask (None, a 2-D padding mask, transformers' own 4-D masks, whose query dimension is
the query length) goes to transformers' sdpa unchanged, so a model switched to this attention
computes exactly what sdpa computes. It is registered under `NAME` with transformers'
AttentionInterface (and sdpa's mask builder), the library's extension point for attention.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

NAME = "sdpa_tree"


def tree_sdpa_forward(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """query (N, H, T, d), key / value (N, H_kv, T, d) -> ((N, T, H, d), None), as sdpa. A 4-D
    mask with fewer query rows than T is a tree's tail mask: its rows are the last queries."""
    t = query.shape[2]
    if attention_mask is None or attention_mask.dim() != 4 or attention_mask.shape[-2] == t:
        return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)
    c = t - attention_mask.shape[-2]
    head, _ = sdpa_attention_forward(module, query[:, :, :c], key[:, :, :c], value[:, :, :c], None, **kwargs)
    tail, _ = sdpa_attention_forward(module, query[:, :, c:], key, value, attention_mask, **kwargs)
    return torch.cat([head, tail], dim=1), None


def enable_tree_attention(model: nn.Module) -> None:
    """Switch a HF model running transformers' sdpa to this attention (exactly sdpa on every input
    that is not a tree). Models on other implementations are left alone: `check_tree_attention`
    refuses them a tree batch."""
    config = getattr(model, "config", None)
    if getattr(config, "_attn_implementation", None) != "sdpa":
        return
    AttentionInterface.register(NAME, tree_sdpa_forward)
    AttentionMaskInterface.register(NAME, sdpa_mask)
    model.set_attn_implementation(NAME)  # type: ignore[operator]  # HF method; torch types it Tensor | Module


def check_tree_attention(model: nn.Module) -> None:
    """ValueError unless `model` runs this attention (a tree batch needs it)."""
    impl = getattr(getattr(model, "config", None), "_attn_implementation", None)
    if impl != NAME:
        raise ValueError(
            f"datamodule.collate_mode=tree needs module.attn_implementation=sdpa (the trainer then runs "
            f"its tree attention); the model runs {impl!r}"
        )
