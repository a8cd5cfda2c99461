"""Provider adapters: one package per API, each laid out the same way

    <api>/adapter.py    the ProviderAdapter class (thin: it only wires the three below)
    <api>/request.py    provider request -> the engine's chat body (NormalizedRequest)
    <api>/response.py   engine chat completion -> provider response; error shape; model list
    <api>/stream.py     engine chat chunks -> the provider's event grammar (per-stream state)

and found one way: `get_adapter(name)`, through the table below. Adapter modules are imported on
first use, so a missing or broken adapter affects only its own API. A request reaches its adapter
one way too, `normalize`: numeric sampling fields are checked first (numbers.py).
"""

from __future__ import annotations

import importlib
from typing import Any

from polar_pl.gateway.providers.base import NormalizedRequest, ProviderAdapter, RequestError
from polar_pl.gateway.providers.numbers import check_numbers

ADAPTERS: dict[str, str] = {
    "anthropic": "polar_pl.gateway.providers.anthropic.adapter:AnthropicAdapter",
    "openai_chat": "polar_pl.gateway.providers.openai_chat.adapter:OpenAIChatAdapter",
    "openai_responses": "polar_pl.gateway.providers.openai_responses.adapter:OpenAIResponsesAdapter",
    "google": "polar_pl.gateway.providers.google.adapter:GoogleAdapter",
}

_cache: dict[str, ProviderAdapter] = {}


class UnknownProvider(LookupError):
    pass


def get_adapter(name: str) -> ProviderAdapter:
    """The adapter for a provider name (one instance per process); raises UnknownProvider if it
    is not available."""
    adapter = _cache.get(name)
    if adapter is not None:
        return adapter
    where = ADAPTERS.get(name)
    if where is None:
        raise UnknownProvider(f"unknown provider {name!r}; known: {', '.join(ADAPTERS)}")
    module_name, _, class_name = where.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise UnknownProvider(f"provider {name!r} is not available: {exc}") from exc
    adapter = _cache[name] = getattr(module, class_name)()
    return adapter


def normalize(
    adapter: ProviderAdapter, body: dict[str, Any], *, path: str, query: dict[str, str]
) -> NormalizedRequest:
    """`adapter.to_chat` on a body whose numeric sampling fields were checked first, so neither
    the adapter nor the core (the max_tokens cap) ever computes with a string. Raises RequestError."""
    check_numbers(adapter.name, body)
    return adapter.to_chat(body, path=path, query=query)


__all__ = ["ADAPTERS", "ProviderAdapter", "RequestError", "UnknownProvider", "get_adapter", "normalize"]
