"""Hermes tool-call parsing (shared by the engine and the gateway's token-in mode), checked against
the behaviour of vLLM's hermes parser on literal model outputs."""

from __future__ import annotations

import json

from polar_pl.chat.toolparse import HermesStreamParser, parse_tool_calls, render_tool_call

CALL = '<tool_call>\n{"name": "run", "arguments": {"cmd": "ls -la", "n": 2}}\n</tool_call>'


def test_plain_text_is_content():
    parsed = parse_tool_calls("just text")
    assert not parsed.tools_called and parsed.content == "just text" and parsed.tool_calls == ()


def test_content_then_two_calls():
    text = "Let me look.\n" + CALL + "\n" + render_tool_call("read", {"path": "é.txt"})
    parsed = parse_tool_calls(text)
    assert parsed.tools_called and parsed.content == "Let me look.\n"
    assert [c["function"]["name"] for c in parsed.tool_calls] == ["run", "read"]
    # arguments are re-serialized like vLLM: json.dumps(..., ensure_ascii=False)
    assert parsed.tool_calls[0]["function"]["arguments"] == '{"cmd": "ls -la", "n": 2}'
    assert parsed.tool_calls[1]["function"]["arguments"] == '{"path": "é.txt"}'
    assert all(c["id"].startswith("chatcmpl-tool-") and c["type"] == "function" for c in parsed.tool_calls)


def test_unterminated_last_call_still_counts():
    parsed = parse_tool_calls('<tool_call>\n{"name": "run", "arguments": {}}')
    assert parsed.tools_called and parsed.content is None
    assert parsed.tool_calls[0]["function"]["arguments"] == "{}"


def test_malformed_call_leaves_everything_as_content():
    text = 'ok <tool_call>\n{"name": "run", "arguments": {oops}}\n</tool_call>'
    parsed = parse_tool_calls(text)
    assert not parsed.tools_called and parsed.content == text


def stream(text: str, step: int) -> list[dict]:
    parser = HermesStreamParser()
    deltas = []
    for end in range(step, len(text) + step, step):
        if (d := parser.feed(text[:end])) is not None:
            deltas.append(d)
    return deltas


def test_streaming_holds_back_partial_tags_and_streams_raw_arguments():
    text = "Sure.\n" + CALL
    for step in (1, 3, 7, len(text)):
        deltas = stream(text, step)
        content = "".join(d.get("content") or "" for d in deltas)
        assert content == "Sure.\n", step  # never a piece of "<tool_call>"
        calls = [c for d in deltas for c in d.get("tool_calls", [])]
        assert [c["function"]["name"] for c in calls if "name" in c["function"]] == ["run"]
        args = "".join(c["function"].get("arguments", "") for c in calls)
        assert args == '{"cmd": "ls -la", "n": 2}'  # the generated JSON text, verbatim
        assert {c["index"] for c in calls} == {0}


def test_streaming_two_calls_get_their_own_index():
    text = CALL + "\n" + render_tool_call("read", {"path": "a"})
    calls = [c for d in stream(text, 2) for c in d.get("tool_calls", [])]
    by_index: dict[int, str] = {}
    for c in calls:
        by_index[c["index"]] = by_index.get(c["index"], "") + c["function"].get("arguments", "")
    assert {i: json.loads(a) for i, a in by_index.items()} == {0: {"cmd": "ls -la", "n": 2}, 1: {"path": "a"}}
