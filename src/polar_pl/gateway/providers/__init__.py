"""Provider adapters, one file per API, found by name.

Modules are imported on first use, so a missing or broken adapter affects only its own API. Each
module exposes a module-level `adapter` instance (a ProviderAdapter); a module that only defines
a `...Adapter` class is instantiated once.
"""

from __future__ import annotations

import importlib

from polar_pl.gateway.providers.base import ProviderAdapter, RequestError

PROVIDER_MODULES: dict[str, str] = {
    "anthropic": "polar_pl.gateway.providers.anthropic.adapter",
    "openai_chat": "polar_pl.gateway.providers.openai_chat.adapter",
    "openai_responses": "polar_pl.gateway.providers.openai_responses.adapter",
    "google": "polar_pl.gateway.providers.google.adapter",
}

_cache: dict[str, ProviderAdapter] = {}


class UnknownProvider(LookupError):
    pass


def get_adapter(name: str) -> ProviderAdapter:
    """The adapter for a provider name; raises UnknownProvider if it is not available."""
    adapter = _cache.get(name)
    if adapter is not None:
        return adapter
    module_name = PROVIDER_MODULES.get(name)
    if module_name is None:
        raise UnknownProvider(f"unknown provider {name!r}; known: {', '.join(PROVIDER_MODULES)}")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise UnknownProvider(f"provider {name!r} is not available: {exc}") from exc
    adapter = getattr(module, "adapter", None) or getattr(module, "ADAPTER", None)
    if adapter is None:
        classes = [
            v
            for k, v in vars(module).items()
            if k.endswith("Adapter") and isinstance(v, type) and v.__module__ == module.__name__
        ]
        if not classes:
            raise UnknownProvider(f"provider module {module_name} defines no adapter")
        adapter = classes[0]()
    _cache[name] = adapter
    return adapter


__all__ = ["PROVIDER_MODULES", "ProviderAdapter", "RequestError", "UnknownProvider", "get_adapter"]
