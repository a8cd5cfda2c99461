"""Pure request-side pieces: the OpenAI Chat adapter's normalization, volatile-content removal,
side-call rules, provider detection and token extraction."""

from __future__ import annotations

import json

import httpx
import orjson
import pytest
from fixture_paths import CAPTURES

from polar_pl.gateway.call.sidecalls import DEFAULT_SIDE_RULES, SideCallRule, classify
from polar_pl.gateway.call.volatile import strip_volatile
from polar_pl.gateway.http.detect import detect_provider, find_token, split_session_path
from polar_pl.gateway.providers import RequestError, get_adapter, normalize
from polar_pl.gateway.providers.base import NormalizedRequest

chat_adapter = get_adapter("openai_chat")


def test_chat_adapter_normalizes_without_touching_the_raw_request():
    raw = {
        "model": "m",
        "n": 1,
        "max_completion_tokens": 64,
        "stop": ["\n\n"],
        "temperature": 0.2,
        "store": False,
        "messages": [
            {"role": "developer", "content": "rules"},
            {"role": "user", "content": [{"type": "text", "text": "hi"}, {"type": "input_audio"}]},
            {
                "role": "assistant",
                "content": None,
                "reasoning": "think",
                "tool_calls": [
                    {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
                ],
            },
            {"role": "tool", "tool_call_id": "c1", "content": "ok"},
        ],
        "tools": [
            {"type": "function", "function": {"name": "f", "parameters": {}}},
            {"type": "custom", "name": "apply_patch"},
        ],
        "tool_choice": {"type": "function", "function": {"name": "f"}},
        "stream": True,
        "stream_options": {"include_usage": True},
        "frobnicate": 1,
    }
    before = json.dumps(raw, sort_keys=True)
    norm = chat_adapter.to_chat(raw, path="/v1/chat/completions", query={})
    assert json.dumps(raw, sort_keys=True) == before
    chat = norm.chat
    assert chat["messages"][0] == {"role": "system", "content": "rules"}
    assert chat["messages"][1]["content"] == [{"type": "text", "text": "hi"}]
    assert chat["messages"][2]["reasoning_content"] == "think"
    assert [t["function"]["name"] for t in chat["tools"]] == ["f"]
    assert chat["tool_choice"] == {"type": "function", "function": {"name": "f"}}
    assert (chat["max_tokens"], chat["stop"], chat["temperature"]) == (64, ["\n\n"], 0.2)
    assert norm.stream and norm.extra["include_usage"] and norm.model == "m"
    notes = " | ".join(norm.notes)
    for expected in (
        "developer role",
        "dropped input_audio",
        "dropped tool apply_patch",
        "ignored field frobnicate",
    ):
        assert expected in notes


@pytest.mark.parametrize(
    "body, message",
    [
        ({"messages": []}, "messages"),
        ({"messages": [{"role": "robot", "content": "x"}]}, "role"),
        ({"messages": [{"role": "user", "content": "x"}], "n": 3}, "n=3"),
        ({"messages": [{"role": "tool", "content": "x"}]}, "tool_call_id"),
        (
            {"messages": [{"role": "user", "content": "x"}], "max_completion_tokens": 0},
            "max_completion_tokens",
        ),
    ],
)
def test_chat_adapter_rejects_malformed(body, message):
    """Through `normalize`, the one way a request reaches its adapter (numbers are checked there)."""
    with pytest.raises(RequestError, match=message):
        normalize(chat_adapter, body, path="", query={})


def test_chat_legacy_functions_become_tools():
    norm = chat_adapter.to_chat(
        {
            "messages": [{"role": "user", "content": "x"}],
            "functions": [{"name": "g", "parameters": {}}],
            "function_call": {"name": "g"},
        },
        path="",
        query={},
    )
    assert norm.chat["tools"][0]["function"]["name"] == "g"
    assert norm.chat["tool_choice"] == {"type": "function", "function": {"name": "g"}}


def test_chat_stream_translator_hides_engine_fields_and_usage_unless_asked():
    req = NormalizedRequest(chat={}, stream=True, model="harness-model", extra={"include_usage": False})
    tr = chat_adapter.stream(req)
    chunk = {
        "id": "c",
        "created": 1,
        "model": "served",
        "prompt_token_ids": [1, 2],
        "choices": [
            {
                "index": 0,
                "delta": {"content": "a"},
                "token_ids": [5],
                "logprobs": {"content": [{"logprob": -1}]},
            }
        ],
    }
    out = orjson.loads(tr.feed(chunk)[6:])
    assert out["model"] == "harness-model" and "prompt_token_ids" not in out
    assert out["choices"][0] == {"index": 0, "delta": {"content": "a"}, "logprobs": None}
    assert tr.feed({"id": "c", "choices": [], "usage": {"prompt_tokens": 2}}) == b""
    assert tr.finish("stop", {"prompt_tokens": 2}) == b"data: [DONE]\n\n"


def test_billing_header_stripped_from_string_and_parts_and_noted():
    raw_parts = [
        {"type": "text", "text": "x-anthropic-billing-header: cc_version=1.2.abc;"},
        {"type": "text", "text": "You are Claude."},
    ]
    chat = {
        "messages": [
            {"role": "system", "content": "x-anthropic-billing-header: cc=1;\nYou are Claude."},
            {"role": "system", "content": raw_parts},
            {"role": "user", "content": "x-anthropic-billing-header: in a user turn stays"},
        ]
    }
    original_parts = list(raw_parts)
    notes = strip_volatile(chat)
    assert chat["messages"][0]["content"] == "You are Claude."
    assert chat["messages"][1]["content"] == [{"type": "text", "text": "You are Claude."}]
    assert chat["messages"][2]["content"].startswith("x-anthropic-billing-header")
    assert raw_parts == original_parts  # the caller's objects are not mutated
    assert len(notes) == 2 and all("billing header" in n for n in notes)


def test_claude_code_billing_header_fixture_prefix_is_stable():
    """The header's hash differs between calls 1 and 2; after stripping, the system prompts match."""
    anth = get_adapter("anthropic")
    systems = []
    for name in ("01-anthropic-call1-tool_use-turn", "02-anthropic-call2-after-tool_result"):
        body = json.loads((CAPTURES / "claude-code-2.1.332" / f"{name}.request.body.json").read_text())
        chat = dict(anth.to_chat(body, path="/v1/messages", query={}).chat)
        strip_volatile(chat)
        systems.append(chat["messages"][0]["content"])
    assert systems[0] == systems[1] and "billing-header" not in systems[0]


def test_side_rules_are_configurable_data():
    rule = SideCallRule.from_dict(
        {"name": "summarizer", "tools": "none", "system_contains": "Summarize", "model_regex": "mini$"}
    )
    chat = {"messages": [{"role": "system", "content": "Summarize the chat."}]}
    assert classify([rule], provider="openai_chat", model="gpt-mini", chat=chat) == "summarizer"
    assert classify([rule], provider="openai_chat", model="gpt-large", chat=chat) is None
    assert classify([rule], provider="openai_chat", model="gpt-mini", chat={**chat, "tools": [{}]}) is None
    with pytest.raises(ValueError, match="tools"):
        SideCallRule(name="x", tools="some")
    opencode = {
        "messages": [
            {
                "role": "system",
                "content": "You are a title generator. You output ONLY a thread title. Nothing else.",
            },
            {"role": "user", "content": "Generate a title for this conversation: hi"},
        ]
    }
    assert classify(DEFAULT_SIDE_RULES, provider="openai_chat", model="m", chat=opencode) == "opencode_title"


def test_detection_and_tokens():
    assert split_session_path("/s/tok/v1/messages") == ("tok", "/v1/messages")
    assert split_session_path("/v1/messages") == (None, "/v1/messages")
    assert detect_provider("/v1/messages", {}) == "anthropic"
    assert detect_provider("/chat/completions", {}) == "openai_chat"
    assert detect_provider("/v1/responses", {}) == "openai_responses"
    assert detect_provider("/v1beta/models/g:streamGenerateContent", {}) == "google"
    assert detect_provider("/x", {"anthropic-version": "2023-06-01"}) == "anthropic"
    assert detect_provider("/x", {}, {"contents": []}) == "google"
    assert detect_provider("/x", {}, {"input": "hi"}) == "openai_responses"
    assert detect_provider("/x", {}, {"messages": [], "system": "s"}) == "anthropic"
    assert detect_provider("/x", {}, {"messages": []}) == "openai_chat"
    assert find_token("p", {"x-api-key": "k"}, {}) == "p"
    assert find_token(None, {"authorization": "Bearer b"}, {}) == "b"
    assert find_token(None, {"x-goog-api-key": "g"}, {}) == "g"
    assert find_token(None, {}, {"key": "q"}) == "q"
    assert find_token(None, {}, {}) is None


def test_count_tokens_is_the_engine_prompt_length(gateway):
    s = gateway.create_session()
    body = {"model": "claude-x", "system": "Be brief.", "messages": [{"role": "user", "content": "say hi"}]}
    n = httpx.post(f"{s.base_url}/v1/messages/count_tokens", json=body).json()["input_tokens"]
    httpx.post(f"{s.base_url}/v1/messages", json={**body, "max_tokens": 8}).raise_for_status()
    (rec,) = gateway.records(s.session_id)  # count_tokens is not a model call: not recorded
    assert n == len(rec.prompt_ids)
