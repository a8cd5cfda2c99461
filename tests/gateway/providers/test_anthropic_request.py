"""Anthropic Messages -> chat translation: real CLI captures keep every part, and each concept
(system, images, tool use / results, thinking, tools, tool choice, sampling) converts as documented."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest
from fixture_paths import CAPTURES

from polar_pl.gateway.call.volatile import strip_volatile
from polar_pl.gateway.providers import get_adapter
from polar_pl.gateway.providers.base import RequestError
from polar_pl.gateway.providers.thinking_signature import decode_signature, encode_signature

adapter = get_adapter("anthropic")

RECORDS = sorted(
    p
    for p in CAPTURES.glob("*/*.request.record.json")
    if json.loads(p.read_text())["path"].startswith("/v1/messages")
)


def to_chat(body: dict[str, Any]):
    return adapter.to_chat(body, path="/v1/messages", query={"beta": "true"})


def _blocks(content: Any) -> list[dict[str, Any]]:
    return [{"type": "text", "text": content}] if isinstance(content, str) else content


def test_all_anthropic_captures_found():
    assert len(RECORDS) == 7  # claude code x4, pi x2, qwen code x1


@pytest.mark.parametrize("record", RECORDS, ids=lambda p: f"{p.parent.name}/{p.name[:32]}")
def test_capture_keeps_every_message_tool_and_system_part(record: Path):
    body = json.loads(record.with_name(record.name.replace(".record.", ".body.")).read_text())
    req = to_chat(body)
    chat = req.chat
    messages = list(chat["messages"])

    # System: every top-level block's text is in the leading system message, in order.
    system_blocks = _blocks(body.get("system") or [])
    if system_blocks:
        first = messages.pop(0)
        assert first["role"] == "system"
        pos = 0
        for block in system_blocks:
            pos = first["content"].index(block["text"], pos)

    # Messages: user turns -> tool messages (one per tool_result) + one user message for the rest;
    # assistant turns -> one message; in-conversation system messages stay in place.
    expected_roles: list[str] = []
    for m in body["messages"]:
        blocks = _blocks(m["content"])
        if m["role"] == "user":
            results = [b for b in blocks if b["type"] == "tool_result"]
            expected_roles += ["tool"] * len(results)
            if len(results) < len(blocks) or not results:
                expected_roles.append("user")
        else:
            expected_roles.append(m["role"])
    assert [m["role"] for m in messages] == expected_roles

    # Every text, tool_use and tool_result survives with its content.
    flat = iter(messages)
    for m in body["messages"]:
        blocks = _blocks(m["content"])
        results = [b for b in blocks if b["type"] == "tool_result"]
        for result in results:
            tool = next(flat)
            assert tool["tool_call_id"] == result["tool_use_id"]
            assert tool["content"].endswith(result["content"] if isinstance(result["content"], str) else "")
        if m["role"] == "user" and results and len(results) == len(blocks):
            continue
        out = next(flat)
        for block in blocks:
            if block["type"] == "text":
                assert block["text"] in out["content"]
        uses = [b for b in blocks if b["type"] == "tool_use"]
        calls = out.get("tool_calls", [])
        assert [(c["id"], c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls] == [
            (u["id"], u["name"], u["input"]) for u in uses
        ]

    # Tools: every custom tool, in order, with its schema.
    assert [t["function"]["name"] for t in chat.get("tools", [])] == [
        t["name"] for t in body.get("tools", [])
    ]
    for tool, given in zip(chat.get("tools", []), body.get("tools", []), strict=True):
        assert tool["function"]["parameters"] == given["input_schema"]
    assert chat["max_tokens"] == body["max_tokens"]
    assert req.stream is True and req.model == body["model"]


def test_claude_code_billing_header_is_left_for_the_core_to_strip():
    body = json.loads(
        (CAPTURES / "claude-code-2.1.332/01-anthropic-call1-tool_use-turn.request.body.json").read_text()
    )
    chat = to_chat(body).chat
    notes = strip_volatile(chat)
    assert notes and "billing header" in notes[0]
    assert chat["messages"][0]["content"].startswith("You are a Claude agent")


def test_claude_code_system_message_is_the_same_as_blocks_or_string():
    """Claude Code sends its in-conversation system message as blocks on call 1 and a string on
    call 2; both must render identically or the second prompt stops extending the first."""
    d = CAPTURES / "claude-code-2.1.332"
    one = to_chat(json.loads((d / "01-anthropic-call1-tool_use-turn.request.body.json").read_text())).chat
    two = to_chat(json.loads((d / "02-anthropic-call2-after-tool_result.request.body.json").read_text())).chat
    assert one["messages"][:3] == two["messages"][:3]


def test_claude_code_extras_are_noted():
    body = json.loads(
        (CAPTURES / "claude-code-2.1.332/01-anthropic-call1-tool_use-turn.request.body.json").read_text()
    )
    notes = " | ".join(to_chat(body).notes)
    for field in ("thinking", "context_management", "output_config"):
        assert f"accepted {field}" in notes


def test_title_request_json_format_becomes_response_format():
    body = json.loads(
        (CAPTURES / "claude-code-2.1.332/04-interactive-title-side-request.request.body.json").read_text()
    )
    chat = to_chat(body).chat
    assert chat["response_format"]["type"] == "json_schema"
    assert chat["response_format"]["json_schema"]["schema"]["required"] == ["title"]
    assert "tools" not in chat


def test_tool_use_and_multi_part_error_result():
    body = {
        "model": "m",
        "max_tokens": 10,
        "messages": [
            {"role": "user", "content": "go"},
            {
                "role": "assistant",
                "content": [
                    {"type": "text", "text": "Running both."},
                    {"type": "tool_use", "id": "t1", "name": "Bash", "input": {"command": "ls"}},
                    {"type": "tool_use", "id": "t2", "name": "Read", "input": {"path": "ü.txt"}},
                ],
            },
            {
                "role": "user",
                "content": [
                    {
                        "type": "tool_result",
                        "tool_use_id": "t1",
                        "content": [{"type": "text", "text": "a.txt"}, {"type": "text", "text": "b.txt"}],
                    },
                    {"type": "tool_result", "tool_use_id": "t2", "is_error": True, "content": "no such file"},
                    {"type": "text", "text": "<system-reminder>keep going</system-reminder>"},
                ],
            },
        ],
    }
    messages = to_chat(body).chat["messages"]
    assert messages[1] == {
        "role": "assistant",
        "content": "Running both.",
        "tool_calls": [
            {"id": "t1", "type": "function", "function": {"name": "Bash", "arguments": '{"command": "ls"}'}},
            {"id": "t2", "type": "function", "function": {"name": "Read", "arguments": '{"path": "ü.txt"}'}},
        ],
    }
    assert messages[2] == {"role": "tool", "tool_call_id": "t1", "content": "a.txt\nb.txt"}
    assert messages[3] == {"role": "tool", "tool_call_id": "t2", "content": "Error: no such file"}
    assert messages[4] == {"role": "user", "content": "<system-reminder>keep going</system-reminder>"}


def test_thinking_blocks_become_reasoning_content_even_when_text_was_omitted():
    sig = encode_signature("private plan")
    body = {
        "model": "m",
        "max_tokens": 10,
        "messages": [
            {"role": "user", "content": "go"},
            {
                "role": "assistant",
                "content": [
                    {"type": "thinking", "thinking": "", "signature": sig},
                    {"type": "text", "text": "done"},
                ],
            },
            {
                "role": "assistant",
                "content": [
                    {"type": "redacted_thinking", "data": encode_signature("hidden")},
                    {"type": "thinking", "thinking": "shown", "signature": "sig-from-elsewhere"},
                ],
            },
            {
                "role": "assistant",
                "content": [{"type": "redacted_thinking", "data": "opaque-real-anthropic-data"}],
            },
        ],
    }
    req = to_chat(body)
    a1, a2, a3 = req.chat["messages"][1:]
    assert a1 == {
        "role": "assistant",
        "content": "done",
        "reasoning": "private plan",
        "reasoning_content": "private plan",
    }
    assert a2["reasoning_content"] == "hidden\nshown"
    assert "reasoning" not in a3 and "reasoning_content" not in a3
    assert any("redacted_thinking" in n for n in req.notes)
    assert decode_signature("not-ours") is None and decode_signature("!!!") is None


def test_images_become_image_url_parts():
    body = {
        "model": "m",
        "max_tokens": 10,
        "messages": [
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "what is this"},
                    {
                        "type": "image",
                        "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="},
                    },
                    {"type": "image", "source": {"type": "url", "url": "https://example.invalid/cat.jpg"}},
                    {"type": "image", "source": {"type": "file", "file_id": "file_1"}},
                ],
            }
        ],
    }
    req = to_chat(body)
    assert req.chat["messages"][0]["content"] == [
        {"type": "text", "text": "what is this"},
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}},
        {"type": "image_url", "image_url": {"url": "https://example.invalid/cat.jpg"}},
    ]
    assert any("dropped image with source type 'file'" in n for n in req.notes)


def test_server_tools_dropped_and_noted_tool_choice_and_sampling():
    body = {
        "model": "m",
        "max_tokens": 50,
        "temperature": 0.7,
        "top_p": 0.9,
        "top_k": 20,
        "stop_sequences": ["</answer>"],
        "metadata": {"user_id": "u"},
        "messages": [{"role": "user", "content": "hi"}],
        "tools": [
            {"name": "get_weather", "description": "Weather", "input_schema": {"type": "object"}},
            {"type": "web_search_20250305", "name": "web_search", "max_uses": 3},
            {"type": "bash_20250124", "name": "bash"},
            {"type": "custom", "name": "calc", "input_schema": {"type": "object", "properties": {}}},
        ],
        "tool_choice": {"type": "any", "disable_parallel_tool_use": True},
    }
    req = to_chat(body)
    chat = req.chat
    assert [t["function"]["name"] for t in chat["tools"]] == ["get_weather", "calc"]
    assert chat["tools"][0] == {
        "type": "function",
        "function": {"name": "get_weather", "description": "Weather", "parameters": {"type": "object"}},
    }
    assert chat["tool_choice"] == "required" and chat["parallel_tool_calls"] is False
    assert (chat["max_tokens"], chat["temperature"], chat["top_p"], chat["stop"]) == (
        50,
        0.7,
        0.9,
        ["</answer>"],
    )
    assert "top_k" not in chat
    notes = " | ".join(req.notes)
    assert "dropped server tool web_search (web_search_20250305)" in notes
    assert "dropped server tool bash (bash_20250124)" in notes
    assert "dropped top_k=20" in notes
    assert "metadata" not in notes


@pytest.mark.parametrize(
    "choice, expected",
    [
        ({"type": "auto"}, "auto"),
        ({"type": "none"}, "none"),
        ({"type": "tool", "name": "f"}, {"type": "function", "function": {"name": "f"}}),
    ],
)
def test_tool_choice(choice, expected):
    body = {
        "model": "m",
        "max_tokens": 5,
        "messages": [{"role": "user", "content": "x"}],
        "tools": [{"name": "f", "input_schema": {"type": "object"}}],
        "tool_choice": choice,
    }
    assert to_chat(body).chat["tool_choice"] == expected


@pytest.mark.parametrize(
    "patch, message",
    [
        ({"messages": "hi"}, "messages"),
        ({"messages": [{"role": "robot", "content": "x"}]}, "role"),
        ({"messages": [{"role": "user", "content": 5}]}, "content"),
        ({"messages": [{"role": "user", "content": [{"text": "no type"}]}]}, "type"),
        (
            {"messages": [{"role": "assistant", "content": [{"type": "tool_use", "id": "t", "input": {}}]}]},
            "name",
        ),
        (
            {"messages": [{"role": "user", "content": [{"type": "tool_result", "content": "x"}]}]},
            "tool_use_id",
        ),
        ({"system": 5}, "system"),
        ({"tools": [{"name": "f"}]}, "input_schema"),
        ({"tools": [{"type": "quantum_20990101", "name": "q"}]}, "unsupported tool type"),
        (
            {"tools": [{"name": "f", "input_schema": {}}], "tool_choice": {"type": "tool", "name": "g"}},
            "not one of",
        ),
        ({"stream": "yes"}, "stream"),
        ({"stop_sequences": "END"}, "stop_sequences"),
    ],
)
def test_malformed_requests_raise_request_error(patch, message):
    body = {"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "x"}], **patch}
    with pytest.raises(RequestError, match=message):
        to_chat(body)


def test_count_tokens_body_without_max_tokens_is_accepted():
    req = to_chat({"model": "m", "messages": [{"role": "user", "content": "count me"}]})
    assert "max_tokens" not in req.chat and req.stream is False


def test_final_assistant_text_is_a_prefill_the_engine_continues():
    body = {
        "model": "m",
        "max_tokens": 5,
        "messages": [{"role": "user", "content": "JSON please"}, {"role": "assistant", "content": "{"}],
    }
    req = to_chat(body)
    assert req.chat["messages"][-1] == {"role": "assistant", "content": "{"}
    assert req.chat["continue_final_message"] is True and req.chat["add_generation_prompt"] is False
    assert "continue_final_message" not in to_chat({**body, "messages": body["messages"][:1]}).chat


JUNK = [None, 0, -3, 2.5, True, "", "x", [], {}, [1], {"a": 1}, [{"type": "text"}], {"type": "zzz"}, [None]]


def mutations(body: dict[str, Any], n: int, seed: int):
    """Copies of `body` with 1-3 values replaced by junk of another JSON type."""
    rnd = random.Random(seed)

    def paths(node, pre=()):
        yield pre
        items = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
        for k, v in items:
            yield from paths(v, (*pre, k))

    for _ in range(n):
        b = json.loads(json.dumps(body))
        where = list(paths(b))[1:]
        for _ in range(rnd.randint(1, 3)):
            node, path = b, rnd.choice(where)
            try:
                for k in path[:-1]:
                    node = node[k]
                node[path[-1]] = json.loads(json.dumps(rnd.choice(JUNK)))
            except (KeyError, IndexError, TypeError):
                pass  # an earlier replacement removed this path
        yield b


def test_malformed_bodies_only_ever_raise_request_error():
    """Any JSON a client sends gets a 400 in Anthropic's shape, never a 500 with a traceback."""
    rich = {
        "model": "m",
        "max_tokens": 5,
        "system": [{"type": "text", "text": "s"}],
        "stop_sequences": ["a"],
        "tools": [{"name": "n", "input_schema": {}}],
        "tool_choice": {"type": "tool", "name": "n"},
        "output_config": {"format": {"type": "json_schema", "schema": {}}},
        "messages": [
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "a"},
                    {"type": "image", "source": {"type": "base64", "media_type": "i", "data": "x"}},
                ],
            },
            {
                "role": "assistant",
                "content": [
                    {"type": "thinking", "thinking": "t", "signature": "s"},
                    {"type": "tool_use", "id": "i", "name": "n", "input": {}},
                ],
            },
            {
                "role": "user",
                "content": [
                    {
                        "type": "tool_result",
                        "tool_use_id": "i",
                        "is_error": True,
                        "content": [{"type": "text", "text": "r"}],
                    }
                ],
            },
        ],
    }
    claude = json.loads(
        (CAPTURES / "claude-code-2.1.332/02-anthropic-call2-after-tool_result.request.body.json").read_text()
    )
    for base, seed in ((rich, 1), (claude, 2)):
        for body in mutations(base, 1500, seed):
            try:
                to_chat(body)
            except RequestError:
                pass
