"""The engine's own forward pass for Llama-family decoders on the CPU (the fast path).

transformers' forward costs a decode step more than its arithmetic: per layer it runs ~40 Python
modules and dispatches, builds a 4-D attention mask per step, repeats the grouped KV heads, and its
`nn.Linear` goes to MKL's sgemm, which on AMD CPUs runs a slow code path (bench/engine.py's
profile on SmolLM2-135M, 32 rows, one thread: 70 % of the step in `aten::mm`). This forward runs
the same layers over the same parameters with:

- the linear weights packed for oneDNN (`torch.ops.mkldnn`, the GEMM library vLLM's CPU build
  uses), with q/k/v and gate/up each fused into one matrix: 2-4x faster GEMMs at 8-32 rows than
  `F.linear`, also with oneDNN held to AVX2;
- the RMSNorm weights folded into the packed columns of the linear after them and the attention
  scale into the query rows, the residual adds done by oneDNN as it writes the GEMM's output,
  rotary embeddings in three kernels: fewer, cheaper kernels per layer (a decode step costs
  ~40 kernel launches per layer in transformers, ~20 here);
- attention as two batched matmuls per KV head group over the real cache (no repeated heads),
  the padding bias added by the first; one bias per step, shared by every layer.

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
    weight = next(model.parameters())
    if weight.device.type != "cpu":
        return "not on the CPU"
    if weight.dtype != torch.float32:  # its norms would round where transformers' upcast
        return f"dtype {weight.dtype} (the fast path runs float32)"
    if not torch.backends.mkldnn.is_available():
        return "torch without oneDNN"
    if getattr(c, "hidden_act", "silu") != "silu":
        return f"hidden_act {c.hidden_act!r}"
    windowed = getattr(c, "sliding_window", None) and getattr(c, "use_sliding_window", True)
    if windowed or "sliding_attention" in (getattr(c, "layer_types", None) or ()):
        return "sliding-window attention"
    if getattr(c, "mlp_bias", False) or getattr(c, "pretraining_tp", 1) != 1:
        return "mlp_bias / pretraining_tp"
    return None


@dataclass(frozen=True, slots=True)
class _Layer:
    """One decoder layer's weights as this forward uses them: linears packed, the RMSNorm weights
    before a linear folded into its input columns, the attention scale into the queries."""

    qkv: torch.Tensor  # packed ((H + 2 Hkv) D, d): q rows scaled by 1/sqrt(D) unless qk_norm
    qkv_bias: torch.Tensor | None  # ((H + 2 Hkv) D,), q part scaled likewise
    o: torch.Tensor  # packed (d, H D)
    gate_up: torch.Tensor  # packed (2 I, d)
    down: torch.Tensor  # packed (d, I)
    qk_norm: torch.Tensor | None  # (H + Hkv, D) Qwen3's per-head q / k norms, q rows scaled


def _pack(weight: torch.Tensor) -> torch.Tensor:
    """`weight` (out, in) in oneDNN's blocked layout, for `_linear`. The hint is a batch size
    (rows of the input): 4-64 gave the same speed for 1-64 rows on SmolLM2's shapes."""
    return torch.ops.mkldnn._reorder_linear_weight(weight.contiguous(), 32)


def _linear(x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    return torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")


def _linear_add(x: torch.Tensor, packed: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
    """residual + x @ W^T, the add done by oneDNN as the GEMM writes its output."""
    return torch.ops.mkldnn._linear_pointwise.binary(x, residual, packed, None, "add")


def _normalize(x: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm without its weight (folded into the next linear): x / sqrt(mean(x^2) + eps)."""
    return x * x.pow(2).mean(-1, keepdim=True).add_(eps).rsqrt_()


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
        self.layers: list[_Layer] = []
        self.lm_head = torch.empty(0)
        self.refresh()

    def refresh(self) -> None:
        """Pack the linear weights again from the model's parameters (after they changed)."""
        h, hd = self.heads, self.head_dim
        self.layers, self.lm_head = [], torch.empty(0)  # the old copy goes first: one copy at a time
        layers = []
        with torch.no_grad():
            for layer in self.model.model.layers:
                att, mlp = layer.self_attn, layer.mlp
                projs = (att.q_proj, att.k_proj, att.v_proj)
                qkv = torch.cat([p.weight for p in projs]) * layer.input_layernorm.weight
                bias = torch.cat([p.bias for p in projs]) if att.q_proj.bias is not None else None
                qk_norm = None
                if hasattr(att, "q_norm"):  # the scale goes after the norm, which would undo it
                    q_norm = att.q_norm.weight.expand(h, hd) * att.scaling
                    qk_norm = torch.cat([q_norm, att.k_norm.weight.expand(self.kv_heads, hd)])
                else:
                    qkv[: h * hd] *= att.scaling
                    if bias is not None:
                        bias[: h * hd] *= att.scaling
                gate_up = (
                    torch.cat([mlp.gate_proj.weight, mlp.up_proj.weight])
                    * layer.post_attention_layernorm.weight
                )
                layers.append(
                    _Layer(
                        qkv=_pack(qkv),
                        qkv_bias=bias,
                        o=_pack(att.o_proj.weight),
                        gate_up=_pack(gate_up),
                        down=_pack(mlp.down_proj.weight),
                        qk_norm=qk_norm,
                    )
                )
            self.layers = layers
            self.lm_head = _pack(self.model.lm_head.weight * self.model.model.norm.weight)

    def __call__(
        self, input_ids: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor | None, cache: DynamicCache
    ) -> torch.Tensor:
        """Logits (B, V) of each row's last position.

        input_ids, positions: (B, S) long; mask: (B, T) 1 for real tokens, 0 for left padding, over
        the cache's T - S positions and the S new ones (None: every position is real); cache: the
        rows' KV, appended to per layer (`cache.update`).
        """
        b, s = input_ids.shape
        h, kv, hd = self.heads, self.kv_heads, self.head_dim
        x = F.embedding(input_ids.reshape(-1), self.model.model.embed_tokens.weight)  # (N, d), N = B S
        cos, sin = self.model.model.rotary_emb(x, positions)  # (B, S, D)
        cos, sin = cos.unsqueeze(2), _signed_sin(sin).unsqueeze(2)  # (B, S, 1, D): over heads
        bias = None
        for i, layer in enumerate(self.layers):
            qkv = _linear(_normalize(x, self.eps), layer.qkv, layer.qkv_bias).view(b, s, h + 2 * kv, hd)
            qk, v = qkv[:, :, : h + kv], qkv[:, :, h + kv :]
            if layer.qk_norm is not None:
                qk = _normalize(qk, self.eps) * layer.qk_norm
            qk = _rope(qk, cos, sin)  # (B, S, H + Hkv, D), q scaled by 1/sqrt(D)
            keys, values = cache.update(qk[:, :, h:].transpose(1, 2), v.transpose(1, 2), i)  # (B, Hkv, T, D)
            if i == 0:  # the cache's length is known once the first layer has appended
                bias = _attention_bias(mask, b, s, keys.shape[2], kv, x.dtype)
            att = _attention(qk[:, :, :h], keys, values, bias)  # (B, S, H, D)
            x = _linear_add(att.reshape(b * s, h * hd), layer.o, x)
            gate, up = _linear(_normalize(x, self.eps), layer.gate_up).chunk(2, dim=-1)
            x = _linear_add(F.silu(gate).mul_(up), layer.down, x)
        last = x.view(b, s, -1)[:, -1]
        return _linear(_normalize(last, self.eps), self.lm_head)


def _signed_sin(sin: torch.Tensor) -> torch.Tensor:
    """sin with its first half negated, so that rotate_half(x) * sin = swap_halves(x) * signed."""
    half = sin.shape[-1] // 2
    return torch.cat([-sin[..., :half], sin[..., half:]], dim=-1)


def _rope(x: torch.Tensor, cos: torch.Tensor, signed_sin: torch.Tensor) -> torch.Tensor:
    """Rotary embedding of x (B, S, heads, D), transformers' rotate-half convention, in three
    kernels: x * cos + swap_halves(x) * signed_sin."""
    return torch.addcmul(x * cos, x.roll(x.shape[-1] // 2, dims=-1), signed_sin)


def _attention_bias(
    mask: torch.Tensor | None, b: int, s: int, t: int, kv: int, dtype: torch.dtype
) -> torch.Tensor | None:
    """Additive bias, -inf on left padding and on keys after each query (causal over the S new
    positions, which are the last S of T). A decode step's is (B Hkv, 1, T), as `torch.baddbmm`
    takes it; a prefill chunk's (B, 1, S, T), for SDPA. None for a chunk with no cache before it
    and no padding: SDPA's own causal mask then skips the blocks above the diagonal (half the
    work; a 1500-token prompt's attention took 93 ms a layer with the bias, 50 ms without)."""
    if s > 1 and s == t and mask is None:
        return None
    allowed = torch.ones(b, 1, s, t, dtype=torch.bool)
    if s > 1:
        allowed &= torch.ones(s, t, dtype=torch.bool).tril(diagonal=t - s)
    if mask is not None:
        allowed &= mask.bool().view(b, 1, 1, t)
    bias = torch.zeros(allowed.shape, dtype=dtype).masked_fill_(~allowed, float("-inf"))
    return bias if s > 1 else bias.expand(b, kv, 1, t).reshape(b * kv, 1, t)


def _attention(
    q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, bias: torch.Tensor | None
) -> torch.Tensor:
    """Grouped-query attention: q (B, S, H, D) already scaled, keys / values (B, Hkv, T, D), bias
    from `_attention_bias`. Returns (B, S, H, D). A decode step (S = 1) lets each KV head serve its
    group of G = H / Hkv query heads in one batched matmul (the keys are never repeated; the bias
    is added by the same call), faster than SDPA's kernel for one query; a prefill chunk goes to
    SDPA's flash kernel (its scores would not fit)."""
    b, s, h, dim = q.shape
    kv = keys.shape[1]
    if s > 1:
        out = F.scaled_dot_product_attention(
            q.transpose(1, 2),
            keys,
            values,
            attn_mask=bias,
            is_causal=bias is None,
            scale=1.0,
            enable_gqa=True,
        )
        return out.transpose(1, 2)
    assert bias is not None  # a decode step's bias
    q = q.reshape(b * kv, h // kv, dim)  # (B Hkv, G, D): S = 1, heads grouped by their KV head
    scores = torch.baddbmm(bias, q, keys.reshape(b * kv, -1, dim).transpose(1, 2)).softmax(dim=-1)
    return torch.bmm(scores, values.reshape(b * kv, -1, dim)).view(b, 1, h, dim)
