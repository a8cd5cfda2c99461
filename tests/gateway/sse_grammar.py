"""Structural checks of each provider's stream grammar: collect the events, assert their order.

Used by the gateway replay tests; each check returns the assembled result (text and tool calls)
so a test can also assert on content.
"""

from __future__ import annotations

from typing import Any

import orjson


def parse_sse(text: str) -> list[tuple[str | None, Any]]:
    """SSE text -> [(event name or None, parsed data or "[DONE]")]."""
    events = []
    for block in text.replace("\r\n", "\n").split("\n\n"):
        if not block.strip():
            continue
        name, data = None, []
        for line in block.split("\n"):
            if line.startswith("event:"):
                name = line[6:].strip()
            elif line.startswith("data:"):
                data.append(line[5:].lstrip())
        assert data, f"SSE block without data: {block!r}"
        payload = "\n".join(data)
        events.append((name, payload if payload == "[DONE]" else orjson.loads(payload)))
    return events


def check_chat(events, include_usage: bool) -> dict[str, Any]:
    assert events[-1][1] == "[DONE]", "chat stream must end with [DONE]"
    chunks = [d for _, d in events[:-1]]
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    finishes = [ch["finish_reason"] for c in chunks for ch in c["choices"] if ch.get("finish_reason")]
    assert len(finishes) == 1, f"exactly one finish_reason expected, got {finishes}"
    usage = [c for c in chunks if not c["choices"]]
    if include_usage:
        assert len(usage) == 1 and usage[0]["usage"]["completion_tokens"] > 0 and usage[0] is chunks[-1]
    else:
        assert not usage
    text = "".join(ch["delta"].get("content") or "" for c in chunks for ch in c["choices"])
    tools = [
        tc["function"]["name"]
        for c in chunks
        for ch in c["choices"]
        for tc in ch["delta"].get("tool_calls") or ()
        if tc.get("function", {}).get("name")
    ]
    return {"text": text, "tools": tools, "finish": finishes[0]}


def check_anthropic(events) -> dict[str, Any]:
    events = [(n, d) for n, d in events if n != "ping"]
    for name, data in events:
        assert name == data["type"], f"event name {name} != data type {data['type']}"
    names = [n for n, _ in events]
    assert names[0] == "message_start" and names[-2:] == ["message_delta", "message_stop"], names
    text, tools, open_index, next_index = "", [], None, 0
    for name, data in events[1:-2]:
        if name == "content_block_start":
            assert open_index is None and data["index"] == next_index, "blocks open in order, one at a time"
            open_index = data["index"]
            if data["content_block"]["type"] == "tool_use":
                tools.append(data["content_block"]["name"])
        elif name == "content_block_delta":
            assert data["index"] == open_index
            text += data["delta"].get("text", "")
        elif name == "content_block_stop":
            assert data["index"] == open_index
            open_index, next_index = None, next_index + 1
        else:
            raise AssertionError(f"unexpected event {name} inside the message")
    assert open_index is None, "a content block was left open"
    stop = events[-2][1]["delta"]["stop_reason"]
    assert stop in {"end_turn", "tool_use", "max_tokens", "stop_sequence"}
    return {"text": text, "tools": tools, "finish": stop}


def check_responses(events) -> dict[str, Any]:
    types = [d["type"] for _, d in events]
    for name, data in events:
        assert name in (None, data["type"])
    assert types[0] == "response.created" and types[-1] == "response.completed", types
    seq = [d["sequence_number"] for _, d in events]
    assert seq == sorted(seq) and len(set(seq)) == len(seq)
    open_items: dict[int, dict] = {}
    done_items = []
    text, tools = "", []
    for _, d in events[1:-1]:
        t = d["type"]
        if t == "response.output_item.added":
            assert d["output_index"] not in open_items
            open_items[d["output_index"]] = d["item"]
        elif t == "response.output_item.done":
            assert d["output_index"] in open_items
            open_items.pop(d["output_index"])
            done_items.append(d["item"])
            if d["item"]["type"] == "function_call":
                tools.append(d["item"]["name"])
        elif t in (
            "response.output_text.delta",
            "response.function_call_arguments.delta",
            "response.content_part.added",
            "response.content_part.done",
            "response.output_text.done",
            "response.function_call_arguments.done",
            "response.reasoning_text.delta",
            "response.reasoning_text.done",
            "response.reasoning_summary_text.delta",
            "response.reasoning_summary_text.done",
            "response.reasoning_summary_part.added",
            "response.reasoning_summary_part.done",
        ):
            assert d["output_index"] in open_items, f"{t} outside its item"
            if t == "response.output_text.delta":
                text += d["delta"]
        else:
            assert t == "response.in_progress", f"unexpected event {t}"
    assert not open_items, "an output item was left open"
    final = events[-1][1]["response"]
    assert final["status"] == "completed" and final["output"] == done_items
    return {"text": text, "tools": tools, "finish": final["status"]}


def check_google(events) -> dict[str, Any]:
    assert all(n is None for n, _ in events)
    chunks = [d for _, d in events]
    assert chunks and all("candidates" in c for c in chunks)
    finishes = [
        c["candidates"][0].get("finishReason") for c in chunks if c["candidates"][0].get("finishReason")
    ]
    assert len(finishes) == 1 and chunks[-1]["candidates"][0].get("finishReason"), finishes
    assert "usageMetadata" in chunks[-1]
    parts = [p for c in chunks for p in c["candidates"][0].get("content", {}).get("parts", [])]
    text = "".join(p.get("text", "") for p in parts if not p.get("thought"))
    tools = [p["functionCall"]["name"] for p in parts if "functionCall" in p]
    return {"text": text, "tools": tools, "finish": finishes[0]}
