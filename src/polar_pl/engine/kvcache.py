"""KV caches for the scheduler: a batch cache that appends in place, and a prefix cache.

`GrowingLayer` replaces transformers' `DynamicLayer` in the running batch. DynamicLayer appends a
decode step's keys with `torch.cat`, copying the whole (B, H, T, D) cache every step: with eight
20k-token harness prompts that copy was 72% of a 290 ms decode step. GrowingLayer keeps spare
capacity and writes the new positions in place (amortised O(new tokens) per step).

`PrefixCache` keeps the prompt KV of recent requests (vLLM's automatic prefix caching, by whole
prompts instead of blocks). Harness calls repeat their whole history every turn and the sessions
of a group share the system prompt and tool list (~20k tokens for Claude Code), so a new prompt
usually starts with a cached one and only its tail is prefilled. Entries hold batch-1 tensors
(H, T, D per layer); the budget is in bytes; new weights make every entry stale (`clear`).
"""

from __future__ import annotations

import inspect
from collections import OrderedDict
from typing import Any

import torch
from transformers import DynamicCache, PreTrainedModel
from transformers.cache_utils import DynamicLayer

KV = list[tuple[torch.Tensor, torch.Tensor]]  # per layer: keys, values (B, H, T, D)


class GrowingLayer(DynamicLayer):
    """A DynamicLayer whose keys / values are views into buffers with spare room along T."""

    def __init__(self, keys: torch.Tensor, values: torch.Tensor, spare: int = 256) -> None:
        super().__init__()
        self.device = keys.device
        self.is_initialized = True
        self._spare = spare
        self._len = keys.shape[-2]
        self._k = self._alloc(keys, self._len + spare)
        self._v = self._alloc(values, self._len + spare)
        self._k[:, :, : self._len] = keys
        self._v[:, :, : self._len] = values
        self._views()

    @staticmethod
    def _alloc(like: torch.Tensor, t: int) -> torch.Tensor:
        b, h, _, d = like.shape
        return torch.empty(b, h, t, d, dtype=like.dtype, device=like.device)

    def _views(self) -> None:
        self.keys = self._k[:, :, : self._len]
        self.values = self._v[:, :, : self._len]

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        n = key_states.shape[-2]
        if self._len + n > self._k.shape[-2]:
            grow = max(n, self._len // 2, self._spare)  # geometric growth: amortised O(1) per token
            for name in ("_k", "_v"):
                old = getattr(self, name)
                new = self._alloc(old, self._len + grow)
                new[:, :, : self._len] = old[:, :, : self._len]
                setattr(self, name, new)
        self._k[:, :, self._len : self._len + n] = key_states
        self._v[:, :, self._len : self._len + n] = value_states
        self._len += n
        self._views()
        return self.keys, self.values

    def get_seq_length(self) -> int:
        return self._len


def with_cache(model: torch.nn.Module, cache: DynamicCache | None) -> dict[str, Any]:
    """The keyword argument that hands `cache` to `model`'s forward. transformers 5.2x renamed
    `past_key_values` to `cache` (the old name still maps, with a warning, until 5.40); before it,
    `cache=` falls into the forward's **kwargs unread, and every step is computed without its
    context: the engine then samples noise ("1-----------------" for "What is 17 + 25?")."""
    cls = type(model)
    if cls not in _CACHE_KEYWORD:
        params = inspect.signature(model.forward).parameters
        names = [name for name in ("cache", "past_key_values") if name in params]
        if not names:
            raise TypeError(
                f"{cls.__name__}.forward takes no KV cache (neither `cache` nor `past_key_values`)"
            )
        _CACHE_KEYWORD[cls] = names[0]
    return {_CACHE_KEYWORD[cls]: cache}


_CACHE_KEYWORD: dict[type, str] = {}  # per model class: the name its forward reads the cache by


def batch_cache(layers: KV) -> DynamicCache:
    """A cache over the given per-layer (B, H, T, D) tensors that appends in place."""
    cache = DynamicCache()
    cache.layers = [GrowingLayer(k, v) for k, v in layers]
    return cache


def empty_kv(model: PreTrainedModel) -> KV:
    """Per layer, keys and values of no positions (1, H, 0, D): a one-token prompt's context."""
    c = model.config
    heads = getattr(c, "num_key_value_heads", None) or c.num_attention_heads
    dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    none = torch.empty(1, heads, 0, dim, dtype=model.dtype, device=model.device)
    return [(none, none) for _ in range(c.num_hidden_layers)]


def cache_kv(cache: DynamicCache) -> KV:
    """The per-layer keys, values of a filled cache of dynamic layers (the inverse of batch_cache)."""
    # transformers types a layer as any kind (linear attention has no keys) and its keys as Optional
    return [(layer.keys, layer.values) for layer in cache.layers]  # type: ignore[union-attr, misc]


class PrefixCache:
    """Most-recently-used prompt KVs, bounded by `max_bytes` (0 disables it)."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._entries: OrderedDict[int, tuple[torch.Tensor, KV, int]] = OrderedDict()
        self._bytes = 0
        self._next = 0
        self.hits = 0
        self.hit_tokens = 0
        self.lookups = 0
        self.query_tokens = 0  # prompt tokens looked up (vLLM's prefix_cache_queries)

    def __len__(self) -> int:
        return len(self._entries)

    def lookup(self, prompt: list[int]) -> tuple[int, KV | None]:
        """The longest cached prefix of `prompt` (at most len(prompt) - 1 tokens, so the caller
        always computes the last position's logits) and its KV, batch 1, (1, H, L, D) views."""
        self.lookups += 1
        self.query_tokens += len(prompt)
        if not self._entries or len(prompt) < 2:
            return 0, None
        ids = torch.tensor(prompt)
        best, best_key = 0, None
        for key, (cached, _, _) in self._entries.items():
            n = min(len(cached), len(ids) - 1)
            if n <= best:
                continue
            diff = (cached[:n] != ids[:n]).nonzero()
            common = int(diff[0]) if len(diff) else n
            if common > best:
                best, best_key = common, key
        if best_key is None:
            return 0, None
        self._entries.move_to_end(best_key)
        self.hits += 1
        self.hit_tokens += best
        _, kv, _ = self._entries[best_key]
        return best, [(k[:, :, :best], v[:, :, :best]) for k, v in kv]

    def insert(self, prompt: list[int], kv: KV) -> None:
        """Keep the prompt's KV (batch 1, exactly len(prompt) positions); evicts least recent."""
        if self.max_bytes <= 0:
            return
        size = sum(k.nbytes + v.nbytes for k, v in kv)
        if size > self.max_bytes:
            return
        ids = torch.tensor(prompt)
        for key in [k for k, (c, _, _) in self._entries.items() if _is_prefix(c, ids)]:
            self._bytes -= self._entries.pop(key)[2]  # the new entry covers it
        while self._bytes + size > self.max_bytes and self._entries:
            _, (_, _, old) = self._entries.popitem(last=False)
            self._bytes -= old
        self._entries[self._next] = (ids, kv, size)
        self._next += 1
        self._bytes += size

    def clear(self) -> None:
        self._entries.clear()
        self._bytes = 0

    def stats(self) -> dict[str, int]:
        return {
            "prefix_cache_entries": len(self._entries),
            "prefix_cache_bytes": self._bytes,
            "prefix_cache_hits": self.hits,
            "prefix_cache_hit_tokens": self.hit_tokens,
            "prefix_cache_lookups": self.lookups,
            "prefix_cache_query_tokens": self.query_tokens,
        }


def _is_prefix(a: torch.Tensor, b: torch.Tensor) -> bool:
    return len(a) <= len(b) and bool(torch.equal(a, b[: len(a)]))


def cat_left_padded(parts: list[torch.Tensor], t: int) -> torch.Tensor:
    """Rows of caches (B, H, T, D) or masks (B, T), each left-padded with zeros to length t along
    T, stacked along B."""
    dim = 2 if parts[0].dim() == 4 else 1
    padded = []
    for x in parts:
        missing = t - x.shape[dim]
        if missing:
            shape = list(x.shape)
            shape[dim] = missing
            x = torch.cat([torch.zeros(shape, dtype=x.dtype, device=x.device), x], dim=dim)
        padded.append(x)
    return torch.cat(padded, dim=0)
