"""Anthropic non-streaming responses and error shapes, and the tool-use round trip: what the
gateway answers, sent back by the harness, becomes the same chat turn the engine produced."""

from __future__ import annotations

import pytest

from polar_pl.gateway.providers import get_adapter

adapter = get_adapter("anthropic")

BODY = {"model": "claude-x", "max_tokens": 64, "messages": [{"role": "user", "content": "make f.txt"}]}


def completion(message: dict, finish: str = "stop", stop_reason=None, prompt_tokens: int = 31) -> dict:
    """A vLLM-shaped chat completion (token ids and logprobs included, as the engine returns them)."""
    return {
        "id": "chatcmpl-9",
        "object": "chat.completion",
        "model": "tiny",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", **message},
                "finish_reason": finish,
                "stop_reason": stop_reason,
                "logprobs": None,
                "token_ids": [5, 6, 7],
            }
        ],
        "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": 3, "total_tokens": prompt_tokens + 3},
        "prompt_token_ids": list(range(prompt_tokens)),
    }


def test_message_with_thinking_text_and_tool_use():
    req = adapter.to_chat(BODY, path="/v1/messages", query={})
    engine = completion(
        {
            "content": "I'll write it.",
            "reasoning_content": "need a file",
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "Bash", "arguments": '{"command": "echo hi > f.txt"}'},
                },
            ],
        },
        finish="tool_calls",
    )
    out = adapter.from_chat(engine, req)
    assert out["type"] == "message" and out["role"] == "assistant" and out["model"] == "claude-x"
    assert out["id"].startswith("msg_")
    thinking, text, tool = out["content"]
    assert thinking["type"] == "thinking" and thinking["thinking"] == "need a file" and thinking["signature"]
    assert text == {"type": "text", "text": "I'll write it."}
    assert tool == {
        "type": "tool_use",
        "id": "call_1",
        "name": "Bash",
        "input": {"command": "echo hi > f.txt"},
    }
    assert (out["stop_reason"], out["stop_sequence"]) == ("tool_use", None)
    assert out["usage"]["input_tokens"] == 31 and out["usage"]["output_tokens"] == 3


@pytest.mark.parametrize(
    "finish, stop_reason, expected",
    [
        ("stop", None, ("end_turn", None)),
        ("length", None, ("max_tokens", None)),
        ("stop", "STOP!", ("stop_sequence", "STOP!")),
        ("content_filter", None, ("refusal", None)),
    ],
)
def test_stop_reason_map(finish, stop_reason, expected):
    req = adapter.to_chat({**BODY, "stop_sequences": ["STOP!"]}, path="/v1/messages", query={})
    out = adapter.from_chat(completion({"content": "x"}, finish=finish, stop_reason=stop_reason), req)
    assert (out["stop_reason"], out["stop_sequence"]) == expected


def test_unparseable_tool_arguments_become_empty_input():
    req = adapter.to_chat(BODY, path="/v1/messages", query={})
    engine = completion(
        {
            "content": None,
            "tool_calls": [{"id": "c", "type": "function", "function": {"name": "f", "arguments": "{oops"}}],
        },
        finish="tool_calls",
    )
    assert adapter.from_chat(engine, req)["content"] == [
        {"type": "tool_use", "id": "c", "name": "f", "input": {}}
    ]


def test_round_trip_reproduces_the_engine_turn():
    """The assistant turn the harness sends back must convert to exactly the chat message the
    engine produced (same reasoning, text, call id, name and argument text), or the next
    prompt would not extend the previous one token for token."""
    req = adapter.to_chat(BODY, path="/v1/messages", query={})
    engine_message = {
        "content": "Writing.",
        "reasoning_content": "plan: echo",
        "tool_calls": [
            {
                "id": "call_7",
                "type": "function",
                "function": {"name": "Bash", "arguments": '{"command": "echo hello > f.txt", "timeout": 5}'},
            },
        ],
    }
    out = adapter.from_chat(completion(engine_message, finish="tool_calls"), req)
    # The harness sends the answer back with the tool result (thinking text omitted, as Claude
    # Code does with display "omitted": only the signature comes back).
    content = [{**b, "thinking": ""} if b["type"] == "thinking" else b for b in out["content"]]
    follow_up = {
        **BODY,
        "messages": [
            *BODY["messages"],
            {"role": "assistant", "content": content},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "call_7", "content": "ok"}]},
        ],
    }
    messages = adapter.to_chat(follow_up, path="/v1/messages", query={}).chat["messages"]
    # vLLM's renderer reads `reasoning`; the deprecated `reasoning_content` rides along.
    assert messages[1] == {"role": "assistant", **engine_message, "reasoning": "plan: echo"}
    assert messages[2] == {"role": "tool", "tool_call_id": "call_7", "content": "ok"}


@pytest.mark.parametrize(
    "status, kind",
    [
        (400, "invalid_request_error"),
        (401, "authentication_error"),
        (404, "not_found_error"),
        (429, "rate_limit_error"),
        (500, "api_error"),
        (502, "api_error"),
        (504, "api_error"),
        (529, "overloaded_error"),
        (422, "invalid_request_error"),
    ],
)
def test_error_body(status, kind):
    assert adapter.error_body(status, "why") == {"type": "error", "error": {"type": kind, "message": "why"}}


def test_display_omitted_leaves_thinking_text_out_of_the_message():
    body = {**BODY, "thinking": {"type": "adaptive", "display": "omitted"}}
    req = adapter.to_chat(body, path="/v1/messages", query={})
    out = adapter.from_chat(completion({"content": "hi", "reasoning_content": "hidden"}), req)
    assert out["content"][0]["thinking"] == "" and out["content"][0]["signature"]
    back = {**BODY, "messages": [*BODY["messages"], {"role": "assistant", "content": out["content"]}]}
    assert adapter.to_chat(back, path="/v1/messages", query={}).chat["messages"][1]["reasoning"] == "hidden"
