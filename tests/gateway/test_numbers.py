"""Numeric sampling fields of every API are checked before the gateway (the max_tokens cap) or the
engine does anything with them: a malformed one is a 400 in the provider's shape, recorded, with
or without a cap, and a well-formed one is served as before (gateway/providers/numbers.py)."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import openai
import pytest

from polar_pl.gateway.handle import Gateway
from polar_pl.gateway.providers import RequestError
from polar_pl.gateway.providers.numbers import check_numbers

USER = [{"role": "user", "content": "hi"}]
BODIES = {
    "anthropic": ("/v1/messages", {"model": "m", "max_tokens": 8, "messages": USER}),
    "openai_chat": ("/v1/chat/completions", {"model": "m", "messages": USER}),
    "openai_responses": ("/v1/responses", {"model": "m", "input": "hi"}),
    "google": (
        "/v1beta/models/m:generateContent",
        {"contents": [{"role": "user", "parts": [{"text": "hi"}]}]},
    ),
}
# (api, field path, a malformed value, what the message names)
MALFORMED = [
    ("openai_responses", ("max_output_tokens",), "16", "max_output_tokens"),
    ("openai_responses", ("max_output_tokens",), [16], "max_output_tokens"),
    ("openai_responses", ("max_output_tokens",), {"n": 16}, "max_output_tokens"),
    ("openai_responses", ("max_output_tokens",), True, "max_output_tokens"),
    ("openai_responses", ("max_output_tokens",), 16.5, "max_output_tokens"),
    ("openai_responses", ("temperature",), "hot", "temperature"),
    ("openai_responses", ("top_p",), 1.5, "top_p"),
    ("openai_chat", ("max_completion_tokens",), "16", "max_completion_tokens"),
    ("openai_chat", ("max_tokens",), 0, "max_tokens"),
    ("openai_chat", ("temperature",), [1], "temperature"),
    ("openai_chat", ("n",), True, "n"),
    ("openai_chat", ("seed",), 1.5, "seed"),
    ("openai_chat", ("presence_penalty",), 3, "presence_penalty"),
    ("openai_chat", ("top_k",), "5", "top_k"),
    ("anthropic", ("max_tokens",), "16", "max_tokens"),
    ("anthropic", ("max_tokens",), 1e30, "max_tokens"),
    ("anthropic", ("temperature",), 1.5, "temperature"),
    ("anthropic", ("top_k",), "x", "top_k"),
    ("anthropic", ("thinking", "budget_tokens"), "1024", "thinking.budget_tokens"),
    ("google", ("generationConfig", "maxOutputTokens"), "16", "generationConfig.maxOutputTokens"),
    ("google", ("generation_config", "max_output_tokens"), [16], "generation_config.max_output_tokens"),
    ("google", ("generationConfig", "temperature"), "hot", "generationConfig.temperature"),
    ("google", ("generationConfig", "topK"), "x", "generationConfig.topK"),
    ("google", ("generationConfig", "candidateCount"), {"n": 1}, "generationConfig.candidateCount"),
    ("google", ("generationConfig", "thinkingConfig", "thinkingBudget"), "-1", "thinkingBudget"),
]


def with_field(body: dict, path: tuple[str, ...], value) -> dict:
    body = {**body}
    parent = body
    for key in path[:-1]:
        parent[key] = parent = {**parent.get(key, {})}
    parent[path[-1]] = value
    return body


def shaped(api: str, data: dict) -> bool:
    err = data["error"]
    if api == "anthropic":
        return data["type"] == "error" and err["type"] == "invalid_request_error"
    if api == "google":
        return err["code"] == 400 and err["status"] == "INVALID_ARGUMENT"
    return err["type"] == "invalid_request_error"


@pytest.fixture(scope="module", params=[None, 64], ids=["no-cap", "cap-64"])
def capped(request, tiny_model_dir, tmp_path_factory) -> Iterator[Gateway]:
    from polar_pl.testing.scripted import Reply, serve_scripted

    with (
        serve_scripted(lambda chat: Reply("fine."), model_dir=tiny_model_dir) as eng,
        Gateway(
            [eng.url],
            tmp_path_factory.mktemp("numbers") / "t.db",
            tokenizer_dir=tiny_model_dir,
            token_faithful=False,
            max_tokens_cap=request.param,
        ) as gw,
    ):
        yield gw


@pytest.mark.parametrize("api, path, value, named", MALFORMED, ids=lambda v: repr(v)[:30])
def test_a_malformed_number_is_400_in_the_providers_shape(capped, api, path, value, named):
    """With a cap, `"max_output_tokens": "16"` was HTTP 500 "internal gateway error: TypeError"
    and a traceback (`min()` on a string); without one, the engine's own 400 came back."""
    s = capped.create_session()
    url, body = BODIES[api]
    r = httpx.post(f"{s.base_url}{url}", json=with_field(body, path, value), timeout=30)
    assert r.status_code == 400 and shaped(api, r.json()), r.text
    assert named in r.text
    (rec,) = capped.records(s.session_id)
    assert rec.status == "error" and named in rec.error


def test_the_openai_sdk_gets_a_bad_request_not_a_server_error(capped):
    s = capped.create_session()
    client = openai.OpenAI(base_url=f"{s.base_url}/v1", api_key="unused", max_retries=0)
    with pytest.raises(openai.BadRequestError, match="max_output_tokens"):
        client.responses.create(model="m", input="hi", max_output_tokens="16")
    answer = client.responses.create(model="m", input="hi", max_output_tokens=16, temperature=0.5, top_p=1)
    assert answer.output_text == "fine."


@pytest.mark.parametrize(
    "api, body",
    [
        ("anthropic", {"max_tokens": 1, "temperature": 0, "top_p": 1.0, "top_k": 0}),
        ("anthropic", {"thinking": {"type": "enabled", "budget_tokens": 31999}}),
        ("openai_chat", {"max_tokens": 2**64 - 1, "temperature": 2, "n": 1, "seed": -7, "top_k": -1}),
        ("openai_chat", {"frequency_penalty": -2.0, "top_logprobs": 20, "min_p": 0.0}),
        ("openai_responses", {"max_output_tokens": 16, "temperature": 0.0, "top_p": 0.95}),
        ("google", {"generationConfig": {"maxOutputTokens": 7, "topK": 40, "candidateCount": 1}}),
        ("google", {"generation_config": {"thinking_config": {"thinking_budget": -1}}}),
        ("google", {"generationConfig": "not an object: the adapter's to say"}),
    ],
)
def test_well_formed_numbers_pass(api, body):
    check_numbers(api, body)


def test_the_first_bad_field_is_named_with_its_value():
    with pytest.raises(RequestError, match=r"max_output_tokens: must be an integer, got a string \('16'\)"):
        check_numbers("openai_responses", {"max_output_tokens": "16"})
    with pytest.raises(RequestError, match=r"temperature: must be between 0 and 1, got 1.5"):
        check_numbers("anthropic", {"temperature": 1.5})
