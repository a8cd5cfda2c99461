"""Responses request -> engine chat body: real CLI captures keep every part; each item kind maps."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from fixture_paths import CAPTURES

from polar_pl.gateway.providers import get_adapter
from polar_pl.gateway.providers.base import RequestError

adapter = get_adapter("openai_responses")

BODIES = sorted(CAPTURES.glob("*/*responses*.request.body.json"))


def to_chat(body: dict[str, Any]):
    return adapter.to_chat(body, path="/v1/responses", query={})


def _texts(content: Any) -> list[str]:
    if isinstance(content, str):
        return [content]
    return [p["text"] for p in content if p.get("type") in ("input_text", "output_text", "text")]


def test_all_responses_captures_found():
    assert len(BODIES) == 5, BODIES


@pytest.mark.parametrize("path", BODIES, ids=lambda p: f"{p.parent.name}/{p.name[:24]}")
def test_capture_keeps_every_message_call_output_and_system_part(path: Path):
    body = json.loads(path.read_text())
    req = to_chat(body)
    msgs = req.chat["messages"]
    items = body["input"]

    # System: instructions + every developer/system part, in order, in the leading system message.
    system_parts = [body["instructions"]] if body.get("instructions") else []
    leading = [it for it in items if it.get("role") in ("developer", "system")]
    for it in leading:
        system_parts += _texts(it["content"])
    system = [m for m in msgs if m["role"] == "system"]
    assert len(system) == 1 and msgs[0] is system[0]
    assert system[0]["content"] == "\n".join(system_parts)

    users = [it for it in items if it.get("role") == "user"]
    chat_users = [m for m in msgs if m["role"] == "user"]
    assert len(chat_users) == len(users)
    for it, m in zip(users, chat_users, strict=True):
        assert m["content"] == "\n".join(_texts(it["content"]))

    calls = [it for it in items if it.get("type") == "function_call"]
    chat_calls = [tc for m in msgs if m["role"] == "assistant" for tc in m.get("tool_calls", [])]
    assert [(c["call_id"], c["name"], c["arguments"]) for c in calls] == [
        (tc["id"], tc["function"]["name"], tc["function"]["arguments"]) for tc in chat_calls
    ]
    outputs = [it for it in items if it.get("type") == "function_call_output"]
    tools_msgs = [m for m in msgs if m["role"] == "tool"]
    assert [(o["call_id"], o["output"]) for o in outputs] == [
        (m["tool_call_id"], m["content"]) for m in tools_msgs
    ]
    assert len(msgs) == 1 + len(users) + (1 if calls else 0) + len(outputs)

    fn_tools = [t for t in body.get("tools", []) if t["type"] == "function"]
    assert [t["function"]["name"] for t in req.chat.get("tools", [])] == [t["name"] for t in fn_tools]
    assert all(
        t["function"]["parameters"] == s["parameters"]
        for t, s in zip(req.chat["tools"], fn_tools, strict=True)
    )
    others = [t for t in body.get("tools", []) if t["type"] != "function"]
    dropped = [n for n in req.notes if n.startswith("dropped non-function tools")]
    assert bool(dropped) == bool(others)
    assert req.stream is True and req.model == body["model"]
    if body.get("max_output_tokens"):
        assert req.chat["max_tokens"] == body["max_output_tokens"]


def test_codex_call2_exact_shape():
    body = json.loads(
        (CAPTURES / "codex/02-responses-call2-after-function_call_output.request.body.json").read_text()
    )
    req = to_chat(body)
    roles = [m["role"] for m in req.chat["messages"]]
    assert roles == ["system", "user", "user", "assistant", "tool"]
    assistant = req.chat["messages"][3]
    assert assistant["content"] is None
    assert assistant["tool_calls"] == [
        {
            "id": "call_lab_8170855b5e49",
            "type": "function",
            "function": {"name": "exec_command", "arguments": '{"cmd": "echo hello > f.txt"}'},
        }
    ]
    notes = "\n".join(req.notes)
    assert "namespace:multi_agent_v1(close_agent, resume_agent, send_input, spawn_agent, wait_agent)" in notes
    assert "web_search" in notes
    assert "merged 1 consecutive developer/system message(s)" in notes
    assert "reasoning.encrypted_content" in notes
    assert req.chat["tool_choice"] == "auto" and req.chat["parallel_tool_calls"] is True
    assert req.extra["echo"]["store"] is False


def _req(items: Any, **extra: Any):
    return to_chat({"model": "m", "input": items, **extra})


def test_string_input_and_instructions():
    req = _req("hi", instructions="be brief")
    assert req.chat["messages"] == [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "hi"},
    ]
    assert req.stream is False


def test_reasoning_message_and_calls_form_one_assistant_turn():
    items = [
        {"role": "user", "content": "go"},
        {"type": "reasoning", "id": "rs_1", "summary": [{"type": "summary_text", "text": "plan"}]},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "on it"}]},
        {"type": "function_call", "call_id": "c1", "name": "a", "arguments": '{"x":1}'},
        {"type": "function_call", "call_id": "c2", "name": "b", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c1", "output": "one"},
        {"type": "function_call_output", "call_id": "c2", "output": [{"type": "input_text", "text": "two"}]},
        {
            "type": "reasoning",
            "id": "rs_2",
            "summary": [],
            "content": [{"type": "reasoning_text", "text": "full"}],
        },
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "done"}]},
    ]
    msgs = _req(items).chat["messages"]
    assert msgs == [
        {"role": "user", "content": "go"},
        {
            "role": "assistant",
            "content": "on it",
            "reasoning_content": "plan",
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "a", "arguments": '{"x":1}'}},
                {"id": "c2", "type": "function", "function": {"name": "b", "arguments": "{}"}},
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "one"},
        {"role": "tool", "tool_call_id": "c2", "content": "two"},
        {"role": "assistant", "content": "done", "reasoning_content": "full"},
    ]


def test_calls_after_a_finished_turn_start_a_new_turn():
    items = [
        {"role": "user", "content": "go"},
        {"type": "function_call", "call_id": "c1", "name": "a", "arguments": "{}"},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "next"}]},
    ]
    msgs = _req(items).chat["messages"]
    assert [m["role"] for m in msgs] == ["user", "assistant", "assistant"]
    assert msgs[1]["content"] is None and msgs[2]["content"] == "next"


def test_encrypted_reasoning_is_noted():
    items = [
        {"role": "user", "content": "go"},
        {"type": "reasoning", "id": "rs", "summary": [], "encrypted_content": "gAAA"},
        {"role": "assistant", "content": "ok"},
    ]
    req = _req(items)
    assert req.chat["messages"][1] == {"role": "assistant", "content": "ok"}
    assert any("encrypted_content ignored" in n for n in req.notes)


def test_developer_messages_merge_only_when_consecutive():
    items = [
        {
            "role": "developer",
            "content": [{"type": "input_text", "text": "a"}, {"type": "input_text", "text": "b"}],
        },
        {"role": "system", "content": "c"},
        {"role": "user", "content": "u"},
        {"role": "developer", "content": "later"},
    ]
    msgs = _req(items, instructions="i").chat["messages"]
    assert msgs == [
        {"role": "system", "content": "i\na\nb\nc"},
        {"role": "user", "content": "u"},
        {"role": "system", "content": "later"},
    ]


def test_image_parts_keep_list_content():
    items = [
        {
            "role": "user",
            "content": [
                {"type": "input_text", "text": "see"},
                {"type": "input_image", "image_url": "data:image/png;base64,AAAA", "detail": "low"},
            ],
        }
    ]
    assert _req(items).chat["messages"][0]["content"] == [
        {"type": "text", "text": "see"},
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA", "detail": "low"}},
    ]


def test_client_side_tool_calls_are_converted_with_notes():
    items = [
        {"role": "user", "content": "go"},
        {"type": "custom_tool_call", "call_id": "p1", "name": "apply_patch", "input": "*** Begin Patch"},
        {"type": "custom_tool_call_output", "call_id": "p1", "output": "Done"},
        {
            "type": "local_shell_call",
            "id": "ls",
            "call_id": "s1",
            "status": "completed",
            "action": {"type": "exec", "command": ["ls"], "env": {}},
        },
        {"type": "local_shell_call_output", "id": "s1", "output": "a.txt"},
        {"type": "web_search_call", "id": "ws", "status": "completed", "action": {"type": "search"}},
    ]
    req = _req(items)
    msgs = req.chat["messages"]
    assert msgs[1]["tool_calls"][0]["function"] == {
        "name": "apply_patch",
        "arguments": '{"input": "*** Begin Patch"}',
    }
    assert msgs[2] == {"role": "tool", "tool_call_id": "p1", "content": "Done"}
    shell = msgs[3]["tool_calls"][0]
    assert shell["id"] == "s1" and shell["function"]["name"] == "local_shell"
    assert json.loads(shell["function"]["arguments"]) == {
        "action": {"type": "exec", "command": ["ls"], "env": {}}
    }
    assert msgs[4] == {"role": "tool", "tool_call_id": "s1", "content": "a.txt"}
    assert len(msgs) == 5
    notes = "\n".join(req.notes)
    assert "custom_tool_call converted" in notes and "web_search_call item dropped" in notes


def test_tools_choice_and_parameters():
    tools = [
        {
            "type": "function",
            "name": "f",
            "description": "d",
            "parameters": {"type": "object"},
            "strict": True,
        },
        {"type": "function", "name": "g"},
        {"type": "custom", "name": "apply_patch"},
        {"type": "image_generation"},
    ]
    req = _req(
        "x",
        tools=tools,
        tool_choice={"type": "function", "name": "g"},
        max_output_tokens=64,
        temperature=0.5,
        top_p=0.9,
        parallel_tool_calls=False,
        reasoning={"effort": "high", "summary": "auto"},
        text={"format": {"type": "json_schema", "name": "out", "schema": {"type": "object"}, "strict": True}},
        truncation="auto",
    )
    chat = req.chat
    assert chat["tools"] == [
        {"type": "function", "function": {"name": "f", "description": "d", "parameters": {"type": "object"}}},
        {"type": "function", "function": {"name": "g", "parameters": {"type": "object", "properties": {}}}},
    ]
    assert chat["tool_choice"] == {"type": "function", "function": {"name": "g"}}
    assert (chat["max_tokens"], chat["temperature"], chat["top_p"], chat["parallel_tool_calls"]) == (
        64,
        0.5,
        0.9,
        False,
    )
    assert chat["response_format"] == {
        "type": "json_schema",
        "json_schema": {"name": "out", "schema": {"type": "object"}, "strict": True},
    }
    notes = "\n".join(req.notes)
    for expected in (
        "custom:apply_patch",
        "image_generation",
        "strict schemas not enforced for: f",
        "effort",
        "truncation",
    ):
        assert expected in notes


@pytest.mark.parametrize("choice", ["auto", "none", "required"])
def test_string_tool_choice_passes(choice):
    req = _req("x", tools=[{"type": "function", "name": "f"}], tool_choice=choice)
    assert req.chat["tool_choice"] == choice


def test_tool_choice_without_function_tools_is_dropped():
    req = _req("x", tools=[{"type": "web_search"}], tool_choice="required")
    assert "tools" not in req.chat and "tool_choice" not in req.chat
    assert any("no function tools left" in n for n in req.notes)


@pytest.mark.parametrize(
    ("body", "fragment"),
    [
        ({"input": "x"}, "model"),
        ({"model": "m", "input": "x", "previous_response_id": "resp_1"}, "previous_response_id"),
        ({"model": "m", "input": [{"type": "item_reference", "id": "msg_1"}]}, "item_reference"),
        ({"model": "m", "input": [{"role": "tool", "content": "x"}]}, "role"),
        ({"model": "m", "input": [{"type": "mystery"}]}, "mystery"),
        (
            {"model": "m", "input": [{"role": "user", "content": [{"type": "input_file", "file_id": "f"}]}]},
            "input_file",
        ),
        ({"model": "m", "input": [{"type": "function_call", "name": "f"}]}, "call_id"),
        ({"model": "m", "input": []}, "empty"),
        ({"model": "m", "input": 5}, "input"),
        (
            {
                "model": "m",
                "input": "x",
                "tools": [{"type": "function", "name": "f"}],
                "tool_choice": {"type": "function", "name": "g"},
            },
            "unknown function",
        ),
        ({"model": "m", "input": "x", "instructions": ["x"]}, "instructions"),
    ],
)
def test_malformed_requests_raise_request_error(body, fragment):
    with pytest.raises(RequestError, match=fragment):
        to_chat(body)


def test_error_body_shape():
    body = adapter.error_body(401, "bad token")
    assert body == {
        "error": {
            "message": "bad token",
            "type": "invalid_request_error",
            "param": None,
            "code": "invalid_api_key",
        }
    }
    assert adapter.error_body(502, "engine down")["error"]["type"] == "server_error"
    assert (
        adapter.error_body(400, "maximum context length is 4096")["error"]["code"]
        == "context_length_exceeded"
    )
