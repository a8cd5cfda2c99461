"""The engine's own forward pass for Llama-family decoders on the CPU (the fast path).

transformers' forward costs a decode step more than its arithmetic: per layer it runs ~40 Python
modules and dispatches, builds a 4-D attention mask per step, repeats the grouped KV heads, and its
`nn.Linear` goes to MKL's sgemm, which on AMD CPUs runs a slow code path (bench/engine.py's
profile on SmolLM2-135M, 32 rows, one thread: 70 % of the step in `aten::mm`). This forward runs
the same layers over the same parameters with:

- the linear weights packed for oneDNN (`torch.ops.mkldnn`, the GEMM library vLLM's CPU build
  uses), with q/k/v and gate/up each fused into one matrix: 2-4x faster GEMMs at 8-32 rows than
  `F.linear`, also with oneDNN held to AVX2;
- attention as two batched matmuls per KV head group over the real cache (no repeated heads);
- one additive mask per step, shared by every layer.

The packed weights are copies, so `refresh()` rebuilds them whenever the parameters change (the
scheduler calls it when the policy version moves: a weight push or a LoRA merge); the parameters
stay the model's, read by pushes, adapter merges and the transformers fallback. Costs the memory
of the linear weights once more.

`unsupported(model)` names why a model cannot take this path (another architecture, sliding
windows, biases in the MLP, a GPU); the scheduler then runs transformers' forward.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, cast

import torch
import torch.nn.functional as F
from transformers import DynamicCache

_ARCHITECTURES = ("llama", "mistral", "qwen2", "qwen3")


def unsupported(model: torch.nn.Module) -> str | None:
    """Why `model` cannot run on this forward, or None if it can."""
    c: Any = model.config
    if c.model_type not in _ARCHITECTURES:
        return f"model_type {c.model_type!r} (the fast path covers {', '.join(_ARCHITECTURES)})"
    if next(model.parameters()).device.type != "cpu":
        return "not on the CPU"
    if not torch.backends.mkldnn.is_available():
        return "torch without oneDNN"
    if getattr(c, "hidden_act", "silu") != "silu":
        return f"hidden_act {c.hidden_act!r}"
    if getattr(c, "sliding_window", None) and getattr(c, "use_sliding_window", True):
        return "sliding-window attention"
    if getattr(c, "mlp_bias", False) or getattr(c, "pretraining_tp", 1) != 1:
        return "mlp_bias / pretraining_tp"
    return None


@dataclass(frozen=True, slots=True)
class _Layer:
    """One decoder layer's weights: norms as the model's parameters, linears packed."""

    norm_in: torch.Tensor  # (d,)
    norm_post: torch.Tensor  # (d,)
    qkv: torch.Tensor  # packed ((H + 2 Hkv) D, d)
    qkv_bias: torch.Tensor | None
    o: torch.Tensor  # packed (d, H D)
    gate_up: torch.Tensor  # packed (2 I, d)
    down: torch.Tensor  # packed (d, I)
    q_norm: torch.Tensor | None  # (D,) Qwen3's per-head norms
    k_norm: torch.Tensor | None


def _pack(weight: torch.Tensor) -> torch.Tensor:
    """`weight` (out, in) in oneDNN's blocked layout, for `_linear`. The hint is a batch size
    (rows of the input): 32 chose the fastest layout for 1-64 rows on SmolLM2's shapes."""
    return torch.ops.mkldnn._reorder_linear_weight(weight.detach().contiguous(), 32)


def _linear(x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    return torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")


class FastDecoder:
    """The model's forward, for `unsupported(model) is None`. See module docstring."""

    def __init__(self, model: torch.nn.Module) -> None:
        reason = unsupported(model)
        if reason is not None:
            raise ValueError(f"the fast decoder does not cover this model: {reason}")
        c: Any = model.config
        self.model: Any = cast(Any, model)  # a transformers *ForCausalLM: its parts are read by name
        self.heads = c.num_attention_heads
        self.kv_heads = getattr(c, "num_key_value_heads", None) or self.heads
        self.head_dim = getattr(c, "head_dim", None) or c.hidden_size // self.heads
        self.eps = c.rms_norm_eps
        self.scaling = self.model.model.layers[0].self_attn.scaling
        self.layers: list[_Layer] = []
        self.lm_head: torch.Tensor | None = None
        self.refresh()

    def refresh(self) -> None:
        """Pack the linear weights again from the model's parameters (after they changed)."""
        layers = []
        with torch.no_grad():
            for layer in self.model.model.layers:
                att, mlp = layer.self_attn, layer.mlp
                projs = (att.q_proj, att.k_proj, att.v_proj)
                bias = None
                if att.q_proj.bias is not None:
                    bias = torch.cat([p.bias for p in projs]).detach()
                layers.append(
                    _Layer(
                        norm_in=layer.input_layernorm.weight,
                        norm_post=layer.post_attention_layernorm.weight,
                        qkv=_pack(torch.cat([p.weight for p in projs])),
                        qkv_bias=bias,
                        o=_pack(att.o_proj.weight),
                        gate_up=_pack(torch.cat([mlp.gate_proj.weight, mlp.up_proj.weight])),
                        down=_pack(mlp.down_proj.weight),
                        q_norm=att.q_norm.weight if hasattr(att, "q_norm") else None,
                        k_norm=att.k_norm.weight if hasattr(att, "k_norm") else None,
                    )
                )
            self.layers = layers
            self.lm_head = _pack(self.model.lm_head.weight)

    def __call__(
        self, input_ids: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor | None, cache: DynamicCache
    ) -> torch.Tensor:
        """Logits (B, V) of each row's last position.

        input_ids, positions: (B, S) long; mask: (B, T) 1 for real tokens, 0 for left padding, over
        the cache's T - S positions and the S new ones (None: every position is real); cache: the
        rows' KV, appended to per layer (`cache.update`).
        """
        b, s = input_ids.shape
        h, d, hd = self.heads, self.kv_heads, self.head_dim
        x = F.embedding(input_ids.reshape(-1), self.model.model.embed_tokens.weight)  # (N, d), N = B S
        cos, sin = self.model.model.rotary_emb(x, positions)  # (B, S, D)
        cos, sin = cos.unsqueeze(2), sin.unsqueeze(2)  # (B, S, 1, D): broadcast over heads
        bias = None
        for i, layer in enumerate(self.layers):
            y = F.rms_norm(x, x.shape[-1:], layer.norm_in, self.eps)
            qkv = _linear(y, layer.qkv, layer.qkv_bias)
            q, k, v = qkv.view(b, s, h + 2 * d, hd).split([h, d, d], dim=2)  # (B, S, heads, D)
            if layer.q_norm is not None and layer.k_norm is not None:
                q = F.rms_norm(q, (hd,), layer.q_norm, self.eps)
                k = F.rms_norm(k, (hd,), layer.k_norm, self.eps)
            q, k = _rope(q, cos, sin), _rope(k, cos, sin)
            keys, values = cache.update(k.transpose(1, 2), v.transpose(1, 2), i)  # (B, Hkv, T, D)
            if bias is None:
                bias = _attention_bias(mask, b, s, keys.shape[2], x.dtype)
            att = _attention(q, keys, values, bias, self.scaling)  # (B, S, H D)
            x = x + _linear(att.reshape(b * s, h * hd), layer.o)
            y = F.rms_norm(x, x.shape[-1:], layer.norm_post, self.eps)
            gate, up = _linear(y, layer.gate_up).chunk(2, dim=-1)
            x = x + _linear(F.silu(gate) * up, layer.down)
        last = x.view(b, s, -1)[:, -1]
        last = F.rms_norm(last, last.shape[-1:], self.model.model.norm.weight, self.eps)
        assert self.lm_head is not None  # packed by refresh in __init__
        return _linear(last, self.lm_head)


def _rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary embedding of x (B, S, heads, D), transformers' rotate-half convention."""
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos + torch.cat((-x2, x1), dim=-1) * sin


def _attention_bias(mask: torch.Tensor | None, b: int, s: int, t: int, dtype: torch.dtype) -> torch.Tensor:
    """(B, 1, S, T) additive bias: -inf on left padding and on keys after each query (causal over
    the S new positions, which are the last S of T)."""
    allowed = torch.ones(b, 1, s, t, dtype=torch.bool)
    if s > 1:
        allowed &= torch.ones(s, t, dtype=torch.bool).tril(diagonal=t - s)
    if mask is not None:
        allowed &= mask.bool().view(b, 1, 1, t)
    return torch.zeros(allowed.shape, dtype=dtype).masked_fill_(~allowed, float("-inf"))


def _attention(
    q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, bias: torch.Tensor, scaling: float
) -> torch.Tensor:
    """Grouped-query attention: q (B, S, H, D), keys / values (B, Hkv, T, D), bias (B, 1, S, T).
    Returns (B, S, H, D). A decode step (S = 1) lets each KV head serve its group of G = H / Hkv
    query heads in one batched matmul, so the keys are never repeated (faster than SDPA's kernel
    for one query); a prefill chunk goes to SDPA's flash kernel (the scores would not fit)."""
    b, s, h, dim = q.shape
    if s > 1:
        out = F.scaled_dot_product_attention(
            q.transpose(1, 2), keys, values, attn_mask=bias, scale=scaling, enable_gqa=True
        )
        return out.transpose(1, 2)
    kv = keys.shape[1]
    g = h // kv
    q = q.view(b, s, kv, g, dim).permute(0, 2, 3, 1, 4).reshape(b, kv, g * s, dim)  # (B, Hkv, G S, D)
    scores = torch.matmul(q, keys.transpose(2, 3)) * scaling  # (B, Hkv, G S, T)
    scores = (scores.view(b, kv, g, s, -1) + bias.unsqueeze(1)).softmax(dim=-1)
    out = torch.matmul(scores.view(b, kv, g * s, -1), values)  # (B, Hkv, G S, D)
    return out.view(b, kv, g, s, dim).permute(0, 3, 1, 2, 4)  # (B, S, Hkv, G, D) = (B, S, H, D)
