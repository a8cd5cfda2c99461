"""Adapters are found one way (`get_adapter`) and each implements the whole ProviderAdapter
contract, so the gateway core never has to branch on a provider name."""

from __future__ import annotations

import pytest

from polar_pl.gateway.providers import ADAPTERS, UnknownProvider, get_adapter
from polar_pl.gateway.providers.base import ProviderAdapter

METHODS = [
    name for name, value in vars(ProviderAdapter).items() if callable(value) and not name.startswith("_")
]


@pytest.mark.parametrize("name", sorted(ADAPTERS))
def test_every_adapter_implements_the_contract(name):
    adapter = get_adapter(name)
    assert adapter.name == name
    assert get_adapter(name) is adapter  # one instance per process
    missing = [m for m in METHODS if not callable(getattr(adapter, m, None))]
    assert not missing, f"{name} lacks {missing}"


def test_model_lists_and_count_answers_in_each_api_shape():
    assert get_adapter("google").models_body("m")["models"][0]["name"] == "models/m"
    assert get_adapter("anthropic").models_body("m")["data"][0]["type"] == "model"
    assert get_adapter("openai_chat").models_body("m")["object"] == "list"
    assert get_adapter("openai_responses").models_body("m") == get_adapter("openai_chat").models_body("m")
    assert get_adapter("google").count_tokens_answer(3) == {"totalTokens": 3}
    assert get_adapter("anthropic").count_tokens_answer(3) == {"input_tokens": 3}
    assert get_adapter("anthropic").retryable_status(502) == 529
    assert get_adapter("openai_chat").retryable_status(503) == 503


def test_unknown_provider():
    with pytest.raises(UnknownProvider, match="known: anthropic"):
        get_adapter("cohere")
