"""Engine chat answers -> Responses objects and event streams, checked by grammar and SDK types."""

from __future__ import annotations

import json
from typing import Any

import pytest
from openai.types.responses import Response, ResponseStreamEvent
from pydantic import TypeAdapter
from test_openai_responses_grammar import check_stream, parse_sse

from polar_pl.gateway.providers import get_adapter

adapter = get_adapter("openai_responses")

EVENT = TypeAdapter(ResponseStreamEvent)
TOOLS = [{"type": "function", "name": "write", "parameters": {"type": "object"}}]
USAGE = {
    "prompt_tokens": 30,
    "completion_tokens": 12,
    "total_tokens": 42,
    "prompt_tokens_details": {"cached_tokens": 16},
}


def _request(stream: bool = True):
    return adapter.to_chat(
        {"model": "lab-model", "input": "hi", "tools": TOOLS, "stream": stream}, path="", query={}
    )


def _completion(message: dict[str, Any], finish: str = "stop") -> dict[str, Any]:
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "created": 1796000000,
        "model": "tiny",
        "choices": [{"index": 0, "message": {"role": "assistant", **message}, "finish_reason": finish}],
        "usage": USAGE,
        "prompt_token_ids": [1, 2, 3],
    }


def _chunk(delta: dict[str, Any] | None = None, finish: str | None = None, usage=None) -> dict[str, Any]:
    choices = (
        [] if delta is None else [{"index": 0, "delta": delta, "finish_reason": finish, "token_ids": [7]}]
    )
    chunk = {
        "id": "chatcmpl-1",
        "object": "chat.completion.chunk",
        "created": 1,
        "model": "tiny",
        "choices": choices,
    }
    if usage:
        chunk["usage"] = usage
    return chunk


def _run(chunks: list[dict[str, Any]], finish: str | None, usage=USAGE, error: tuple[int, str] | None = None):
    """Feed chunks through a fresh translator as the core does; return (events, translator)."""
    tr = adapter.stream(_request())
    raw = tr.start() + b"".join(tr.feed(c) for c in chunks)
    raw += tr.error(*error) if error else tr.finish(finish, usage)
    events = parse_sse(raw)
    for _, ev in events:
        if ev["type"] == "response.failed":
            # The SDK's enum lacks context_length_exceeded, which Codex reads to stop retrying.
            ev = {
                **ev,
                "response": {**ev["response"], "error": {**ev["response"]["error"], "code": "server_error"}},
            }
        EVENT.validate_python(ev)  # every event is a valid SDK stream event
    return events, tr


def _tool_call_chunks() -> list[dict[str, Any]]:
    """Two tool calls the way vLLM streams them: id+name first, then argument pieces."""
    chunks = [_chunk({"role": "assistant", "content": ""})]
    for index, (call_id, args) in enumerate(
        [("chatcmpl-tool-a", '{"path": "f.txt", "text": "hello"}'), ("chatcmpl-tool-b", '{"path": "g.txt"}')]
    ):
        head = {
            "index": index,
            "id": call_id,
            "type": "function",
            "function": {"name": "write", "arguments": ""},
        }
        chunks.append(_chunk({"tool_calls": [head]}))
        for i in range(0, len(args), 3):
            chunks.append(
                _chunk({"tool_calls": [{"index": index, "function": {"arguments": args[i : i + 3]}}]})
            )
    chunks.append(_chunk({}, finish="tool_calls"))
    chunks.append(_chunk(usage=USAGE))
    return chunks


# --- from_chat ----------------------------------------------------------------------------------


def test_from_chat_text():
    resp = adapter.from_chat(_completion({"content": "Hello there"}), _request(False))
    Response.model_validate(resp)
    assert resp["id"].startswith("resp_") and resp["object"] == "response" and resp["model"] == "lab-model"
    assert resp["status"] == "completed" and resp["incomplete_details"] is None and resp["error"] is None
    [item] = resp["output"]
    assert item["type"] == "message" and item["role"] == "assistant" and item["status"] == "completed"
    assert item["id"].startswith("msg_")
    assert item["content"] == [
        {"type": "output_text", "text": "Hello there", "annotations": [], "logprobs": []}
    ]
    assert resp["usage"] == {
        "input_tokens": 30,
        "input_tokens_details": {"cached_tokens": 16, "cache_write_tokens": 0},
        "output_tokens": 12,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": 42,
    }
    assert resp["tools"] == TOOLS and resp["created_at"] == 1796000000


def test_from_chat_reasoning_and_tool_calls():
    calls = [
        {"id": "chatcmpl-tool-1", "type": "function", "function": {"name": "write", "arguments": '{"a": 1}'}},
        {"id": "chatcmpl-tool-2", "type": "function", "function": {"name": "write", "arguments": "{}"}},
    ]
    resp = adapter.from_chat(
        _completion({"content": None, "reasoning_content": "think", "tool_calls": calls}, "tool_calls"),
        _request(False),
    )
    Response.model_validate(resp)
    assert [i["type"] for i in resp["output"]] == ["reasoning", "function_call", "function_call"]
    assert resp["output"][0]["summary"] == [{"type": "summary_text", "text": "think"}]
    assert [(i["call_id"], i["name"], i["arguments"], i["status"]) for i in resp["output"][1:]] == [
        ("chatcmpl-tool-1", "write", '{"a": 1}', "completed"),
        ("chatcmpl-tool-2", "write", "{}", "completed"),
    ]
    assert all(i["id"].startswith("fc_") for i in resp["output"][1:])


def test_from_chat_accepts_vllm_reasoning_key():
    resp = adapter.from_chat(_completion({"content": "x", "reasoning": "why"}), _request(False))
    assert resp["output"][0]["summary"][0]["text"] == "why"


def test_from_chat_length_is_incomplete():
    resp = adapter.from_chat(_completion({"content": "cut sh"}, "length"), _request(False))
    Response.model_validate(resp)
    assert resp["status"] == "incomplete"
    assert resp["incomplete_details"] == {"reason": "max_output_tokens"}
    assert resp["output"][0]["status"] == "incomplete"


def test_from_chat_empty_answer_is_an_empty_message():
    resp = adapter.from_chat(_completion({"content": None}), _request(False))
    assert resp["output"][0]["content"][0]["text"] == ""


def test_response_round_trips_into_the_next_request():
    """Output items sent back as input rebuild the assistant turn exactly (prefix identity)."""
    calls = [{"id": "c9", "type": "function", "function": {"name": "write", "arguments": '{"p": 1}'}}]
    resp = adapter.from_chat(
        _completion({"content": "text", "reasoning_content": "r\n\nmore", "tool_calls": calls}, "tool_calls"),
        _request(False),
    )
    items = [
        {"role": "user", "content": "hi"},
        *resp["output"],
        {"type": "function_call_output", "call_id": "c9", "output": "ok"},
    ]
    msgs = adapter.to_chat({"model": "m", "input": items}, path="", query={}).chat["messages"]
    assert msgs[1] == {
        "role": "assistant",
        "content": "text",
        "reasoning_content": "r\n\nmore",
        "tool_calls": calls,
    }


# --- streams ------------------------------------------------------------------------------------


def test_stream_text_only():
    pieces = ["Hel", "lo", ", wor", "ld"]
    chunks = [_chunk({"role": "assistant", "content": ""})] + [_chunk({"content": p}) for p in pieces]
    chunks += [_chunk({}, finish="stop"), _chunk(usage=USAGE)]
    events, _ = _run(chunks, "stop")
    result = check_stream(events)
    assert result.types[2:] == [
        "response.output_item.added",
        "response.content_part.added",
        *["response.output_text.delta"] * 4,
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert result.items[0]["content"][0]["text"] == "Hello, world"
    # The terminal response echoes the request's tools; the opening snapshots stay small.
    assert result.response["tools"] == TOOLS and events[0][1]["response"]["tools"] == []
    assert result.response["usage"]["input_tokens"] == 30 and result.response["usage"]["output_tokens"] == 12
    Response.model_validate(result.response)


def test_stream_reasoning_then_text():
    chunks = [_chunk({"role": "assistant", "content": ""})]
    chunks += [_chunk({"reasoning_content": p}) for p in ["Let me ", "think."]]
    chunks += [_chunk({"reasoning": "", "content": p}) for p in ["Ans", "wer"]]
    chunks += [_chunk({}, finish="stop")]
    events, _ = _run(chunks, "stop")
    result = check_stream(events)
    assert [i["type"] for i in result.items] == ["reasoning", "message"]
    assert result.items[0]["summary"] == [{"type": "summary_text", "text": "Let me think."}]
    assert result.items[1]["content"][0]["text"] == "Answer"
    assert "response.reasoning_summary_part.added" in result.types
    assert result.types.index("response.output_item.done") < result.types.index("response.content_part.added")


def test_stream_two_tool_calls_in_many_pieces():
    events, tr = _run(_tool_call_chunks(), "tool_calls", usage=None)
    result = check_stream(events)
    assert [(i["type"], i["call_id"], i["name"]) for i in result.items] == [
        ("function_call", "chatcmpl-tool-a", "write"),
        ("function_call", "chatcmpl-tool-b", "write"),
    ]
    assert [json.loads(i["arguments"]) for i in result.items] == [
        {"path": "f.txt", "text": "hello"},
        {"path": "g.txt"},
    ]
    assert result.types.count("response.function_call_arguments.delta") > 10
    assert result.response["usage"]["total_tokens"] == 42  # taken from the engine's usage chunk
    assert tr.anomalies == []


def test_stream_text_then_tool_call():
    chunks = [_chunk({"content": "I'll write it."})] + _tool_call_chunks()[1:4]
    events, _ = _run(chunks, "tool_calls")
    result = check_stream(events)
    assert [i["type"] for i in result.items] == ["message", "function_call"]


def test_stream_name_arriving_after_arguments_is_held():
    chunks = [
        _chunk({"tool_calls": [{"index": 0, "id": "c1", "function": {"arguments": '{"a"'}}]}),
        _chunk({"tool_calls": [{"index": 0, "function": {"name": "write", "arguments": ": 1}"}}]}),
    ]
    events, _ = _run(chunks, "tool_calls")
    result = check_stream(events)
    assert result.items[0]["arguments"] == '{"a": 1}' and result.items[0]["call_id"] == "c1"


def test_stream_length_ends_incomplete():
    events, _ = _run([_chunk({"content": "cut"})], "length")
    result = check_stream(events)
    assert result.types[-1] == "response.incomplete"
    assert result.response["incomplete_details"] == {"reason": "max_output_tokens"}
    assert result.items[0]["status"] == "incomplete"


def test_stream_empty_answer_still_has_a_message():
    events, _ = _run([_chunk({"role": "assistant", "content": ""})], "stop")
    result = check_stream(events)
    assert result.items[0]["content"][0]["text"] == ""


@pytest.mark.parametrize(("status", "code"), [(502, "server_error"), (400, "context_length_exceeded")])
def test_stream_engine_error_fails_the_response(status, code):
    message = "engine down" if status == 502 else "maximum context length exceeded"
    events, _ = _run([_chunk({"content": "partial"})], None, error=(status, message))
    result = check_stream(events)
    assert result.types[-1] == "response.failed"
    assert result.response["error"] == {"code": code, "message": message}
    assert result.items[0]["status"] == "incomplete"


def test_stream_calls_after_the_end_emit_nothing():
    """After finish, more chunks or a second finish emit nothing; error() may still replace the
    finish events (a call that could not be recorded ends failed), once."""
    tr = adapter.stream(_request())
    tr.start()
    tr.finish("stop", USAGE)
    assert tr.feed(_chunk({"content": "late"})) == b"" and tr.finish("stop", USAGE) == b""
    failed = parse_sse(tr.error(500, "x"))
    assert [e for e, _ in failed][-1] == "response.failed"
    assert tr.error(500, "x") == b"" and tr.feed(_chunk({"content": "late"})) == b""


def test_each_stream_has_its_own_state():
    a, b = adapter.stream(_request()), adapter.stream(_request())
    assert a is not b
    ra = parse_sse(a.start() + a.feed(_chunk({"content": "A"})) + a.finish("stop", USAGE))
    rb = parse_sse(b.start() + b.feed(_chunk({"content": "B"})) + b.finish("stop", USAGE))
    assert check_stream(ra).response["id"] != check_stream(rb).response["id"]
