"""Anthropic stream grammar: the translator's SSE, checked event by event.

`check_stream` is a structural checker for the Messages SSE grammar (event order, block indices,
delta types matching their block, required fields). It is first validated on the streams real
CLIs accepted (fixtures) and on broken streams it must reject, then used on the translator fed
realistic vLLM chunk sequences.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from fixture_paths import CAPTURES

from polar_pl.gateway.providers import get_adapter
from polar_pl.gateway.providers.thinking_signature import decode_signature

adapter = get_adapter("anthropic")

ANTHROPIC_STREAMS = sorted(
    p
    for p in CAPTURES.glob("*/*.response-from-recorder.sse.txt")
    if json.loads(p.with_name(p.name.split(".response")[0] + ".request.record.json").read_text())[
        "path"
    ].startswith("/v1/messages")
)
STOP_REASONS = {"end_turn", "max_tokens", "stop_sequence", "tool_use", "pause_turn", "refusal"}
DELTA_FOR_BLOCK = {
    "text": {"text_delta"},
    "thinking": {"thinking_delta", "signature_delta"},
    "tool_use": {"input_json_delta"},
}


class GrammarError(AssertionError):
    pass


def parse_sse(raw: str) -> list[tuple[str, dict[str, Any]]]:
    """SSE text -> [(event name, data)]; every event must have both lines."""
    events = []
    for frame in raw.replace("\r\n", "\n").split("\n\n"):
        if not frame.strip():
            continue
        fields = dict(line.split(": ", 1) for line in frame.split("\n") if line)
        if set(fields) != {"event", "data"}:
            raise GrammarError(f"frame without event and data lines: {frame!r}")
        events.append((fields["event"], json.loads(fields["data"])))
    return events


def _need(cond: bool, msg: str) -> None:
    if not cond:
        raise GrammarError(msg)


def check_stream(raw: str) -> dict[str, Any]:
    """Assert the Anthropic Messages SSE grammar; returns the assembled message (or the error)."""
    events = parse_sse(raw)
    _need(bool(events), "empty stream")
    for name, data in events:
        _need(data.get("type") == name, f"event {name} carries data of type {data.get('type')}")
    if events[0][0] == "error":
        _check_error(events[0][1])
        _need(len(events) == 1, "events after error")
        return {"error": events[0][1]["error"]}
    name, data = events[0]
    _need(name == "message_start", f"first event is {name}")
    message = data["message"]
    for key, want in (("type", "message"), ("role", "assistant"), ("content", []), ("stop_reason", None)):
        _need(message.get(key) == want, f"message_start.message.{key} = {message.get(key)!r}")
    _need(isinstance(message.get("id"), str) and isinstance(message.get("model"), str), "message id/model")
    _need(isinstance(message["usage"].get("input_tokens"), int), "message_start usage.input_tokens")
    blocks: list[dict[str, Any]] = []
    open_index: int | None = None
    delta_seen = stopped = False
    for name, data in events[1:]:
        _need(not stopped, f"{name} after message_stop")
        if name == "ping":
            continue
        if name == "error":
            _check_error(data)
            return {**message, "content": blocks, "error": data["error"]}
        if name == "content_block_start":
            _need(open_index is None and not delta_seen, "block started while another is open")
            _need(data["index"] == len(blocks), f"block index {data['index']}, expected {len(blocks)}")
            block = dict(data["content_block"])
            _check_block_start(block)
            block["_json"] = ""
            blocks.append(block)
            open_index = data["index"]
        elif name == "content_block_delta":
            _need(
                open_index is not None and data["index"] == open_index,
                f"delta for closed block {data['index']}",
            )
            _apply_delta(blocks[open_index], data["delta"])
        elif name == "content_block_stop":
            _need(open_index is not None and data["index"] == open_index, f"stop for block {data['index']}")
            _finish_block(blocks[open_index])
            open_index = None
        elif name == "message_delta":
            _need(open_index is None, "message_delta with a block open")
            _need(not delta_seen, "second message_delta")
            _need(data["delta"]["stop_reason"] in STOP_REASONS, f"stop_reason {data['delta']['stop_reason']}")
            _need("stop_sequence" in data["delta"], "message_delta.delta.stop_sequence missing")
            _need(isinstance(data["usage"].get("output_tokens"), int), "message_delta usage.output_tokens")
            message = {**message, **data["delta"], "usage": {**message["usage"], **data["usage"]}}
            delta_seen = True
        elif name == "message_stop":
            _need(delta_seen, "message_stop before message_delta")
            stopped = True
        else:
            raise GrammarError(f"unknown event {name}")
    _need(stopped, "stream ended without message_stop")
    return {**message, "content": blocks}


def _check_error(data: dict[str, Any]) -> None:
    _need(isinstance(data.get("error", {}).get("type"), str), "error.type")
    _need(isinstance(data["error"].get("message"), str), "error.message")


def _check_block_start(block: dict[str, Any]) -> None:
    kind = block.get("type")
    _need(kind in DELTA_FOR_BLOCK, f"unknown block type {kind}")
    if kind == "text":
        _need(block.get("text") == "", "text block must start empty")
    elif kind == "thinking":
        _need(block.get("thinking") == "" and "signature" in block, "thinking block start fields")
    else:
        _need(isinstance(block.get("id"), str) and block["id"], "tool_use.id")
        _need(isinstance(block.get("name"), str) and block["name"], "tool_use.name")
        _need(block.get("input") == {}, "tool_use.input must start as {}")


def _apply_delta(block: dict[str, Any], delta: dict[str, Any]) -> None:
    kind = delta.get("type")
    _need(kind in DELTA_FOR_BLOCK[block["type"]], f"{kind} inside a {block['type']} block")
    if kind == "text_delta":
        block["text"] += delta["text"]
    elif kind == "thinking_delta":
        block["thinking"] += delta["thinking"]
    elif kind == "signature_delta":
        block["signature"] = delta["signature"]
    else:
        _need(isinstance(delta.get("partial_json"), str), "input_json_delta.partial_json")
        block["_json"] += delta["partial_json"]


def _finish_block(block: dict[str, Any]) -> None:
    raw = block.pop("_json")
    if block["type"] == "tool_use":
        block["input"] = json.loads(raw) if raw else {}
        _need(isinstance(block["input"], dict), "tool input is not an object")
    elif block["type"] == "thinking":
        _need(bool(block["signature"]), "thinking block closed without a signature")


# -- the checker itself ------------------------------------------------------------------------


def test_fixture_streams_found():
    assert len(ANTHROPIC_STREAMS) == 7


@pytest.mark.parametrize("path", ANTHROPIC_STREAMS, ids=lambda p: f"{p.parent.name}/{p.name[:30]}")
def test_checker_accepts_streams_real_clis_accepted(path: Path):
    message = check_stream(path.read_text())
    assert message["stop_reason"] in ("tool_use", "end_turn")
    assert message["content"], "every recorded answer has a block"


def _frames(*events: tuple[str, dict[str, Any]]) -> str:
    return "".join(f"event: {n}\ndata: {json.dumps(d)}\n\n" for n, d in events)


GOOD = [
    (
        "message_start",
        {
            "type": "message_start",
            "message": {
                "id": "m",
                "type": "message",
                "role": "assistant",
                "model": "x",
                "content": [],
                "stop_reason": None,
                "stop_sequence": None,
                "usage": {"input_tokens": 3, "output_tokens": 0},
            },
        },
    ),
    (
        "content_block_start",
        {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
    ),
    (
        "content_block_delta",
        {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "hi"}},
    ),
    ("content_block_stop", {"type": "content_block_stop", "index": 0}),
    (
        "message_delta",
        {
            "type": "message_delta",
            "delta": {"stop_reason": "end_turn", "stop_sequence": None},
            "usage": {"output_tokens": 1},
        },
    ),
    ("message_stop", {"type": "message_stop"}),
]


@pytest.mark.parametrize(
    "broken, why",
    [
        (GOOD[:-1], "without message_stop"),
        (GOOD[1:], "first event"),
        ([*GOOD[:2], (GOOD[2][0], {**GOOD[2][1], "index": 1}), *GOOD[3:]], "closed block"),
        ([*GOOD[:3], *GOOD[4:]], "block open"),
        (
            [
                *GOOD[:2],
                (GOOD[2][0], {**GOOD[2][1], "delta": {"type": "input_json_delta", "partial_json": "{"}}),
                *GOOD[3:],
            ],
            "inside a text block",
        ),
        (
            [
                *GOOD[:4],
                (GOOD[4][0], {**GOOD[4][1], "delta": {"stop_reason": "stop", "stop_sequence": None}}),
                GOOD[5],
            ],
            "stop_reason",
        ),
        ([*GOOD[:2], GOOD[1], *GOOD[2:]], "another is open"),
    ],
)
def test_checker_rejects_broken_streams(broken, why):
    assert check_stream(_frames(*GOOD))["content"][0]["text"] == "hi"
    with pytest.raises(GrammarError, match=why):
        check_stream(_frames(*broken))


# -- the translator --------------------------------------------------------------------------


def vllm_chunks(
    *,
    reasoning: list[str] = (),
    content: list[str] = (),
    tools: list[tuple[str, str, list[str]]] = (),
    finish: str = "stop",
    stop_reason: Any = None,
    prompt_len: int = 17,
) -> tuple[list[dict[str, Any]], dict[str, int]]:
    """Chunks shaped like vLLM's chat stream with return_token_ids: role chunk with prompt ids,
    reasoning pieces, content pieces, tool calls (name first, then argument pieces), a finish
    chunk, then the usage chunk with empty choices."""
    n = 0

    def chunk(delta: dict[str, Any], **choice: Any) -> dict[str, Any]:
        nonlocal n
        n += 1
        return {
            "id": "chatcmpl-1",
            "object": "chat.completion.chunk",
            "model": "tiny",
            "choices": [
                {
                    "index": 0,
                    "delta": delta,
                    "logprobs": None,
                    "finish_reason": None,
                    "token_ids": [n],
                    **choice,
                }
            ],
        }

    first = chunk({"role": "assistant", "content": ""})
    first["prompt_token_ids"] = list(range(prompt_len))
    chunks = [first]
    chunks += [chunk({"reasoning_content": r}) for r in reasoning]
    chunks += [chunk({"content": c}) for c in content]
    for i, (call_id, name, pieces) in enumerate(tools):
        head = {"index": i, "id": call_id, "type": "function", "function": {"name": name, "arguments": ""}}
        chunks.append(chunk({"tool_calls": [head]}))
        chunks += [chunk({"tool_calls": [{"index": i, "function": {"arguments": p}}]}) for p in pieces]
    chunks.append(chunk({}, finish_reason=finish, stop_reason=stop_reason))
    usage = {"prompt_tokens": prompt_len, "completion_tokens": n, "total_tokens": prompt_len + n}
    chunks.append({"id": "chatcmpl-1", "object": "chat.completion.chunk", "choices": [], "usage": usage})
    return chunks, usage


def run_stream(body: dict[str, Any], chunks: list[dict[str, Any]], usage: dict[str, int], finish: str) -> str:
    req = adapter.to_chat(body, path="/v1/messages", query={})
    translator = adapter.stream(req)
    out = translator.start() + b"".join(translator.feed(c) for c in chunks)
    return (out + translator.finish(finish, usage)).decode()


BODY = {
    "model": "claude-x",
    "max_tokens": 64,
    "stream": True,
    "messages": [{"role": "user", "content": "hi"}],
}


def test_text_stream():
    chunks, usage = vllm_chunks(content=["Hel", "lo", " world"])
    message = check_stream(run_stream(BODY, chunks, usage, "stop"))
    assert [b["type"] for b in message["content"]] == ["text"]
    assert message["content"][0]["text"] == "Hello world"
    assert message["stop_reason"] == "end_turn"
    assert (
        message["usage"]["input_tokens"] == 17
        and message["usage"]["output_tokens"] == usage["completion_tokens"]
    )
    assert message["model"] == "claude-x"


def test_message_start_carries_real_prompt_length_before_generation_ends():
    chunks, _ = vllm_chunks(content=["a"], prompt_len=123)
    translator = adapter.stream(adapter.to_chat(BODY, path="/v1/messages", query={}))
    first = (translator.start() + translator.feed(chunks[0])).decode()
    assert parse_sse(first)[0][1]["message"]["usage"]["input_tokens"] == 123


def test_thinking_then_text_then_tool_call_split_across_many_pieces():
    args = '{"command": "echo hello > f.txt", "description": "write f"}'
    pieces = [args[i : i + 3] for i in range(0, len(args), 3)]
    chunks, usage = vllm_chunks(
        reasoning=["I should ", "write the file."],
        content=["Writing it."],
        tools=[("call_a", "Bash", pieces)],
        finish="tool_calls",
    )
    message = check_stream(run_stream(BODY, chunks, usage, "tool_calls"))
    thinking, text, tool = message["content"]
    assert thinking["type"] == "thinking" and thinking["thinking"] == "I should write the file."
    assert decode_signature(thinking["signature"]) == thinking["thinking"]
    assert text == {"type": "text", "text": "Writing it."}
    assert tool["id"] == "call_a" and tool["name"] == "Bash"
    assert tool["input"] == {"command": "echo hello > f.txt", "description": "write f"}
    assert message["stop_reason"] == "tool_use"


def test_two_tool_calls_get_two_blocks_with_increasing_indices():
    a = '{"path": "a.txt"}'
    b = '{"command": "ls -la /tmp", "timeout": 5}'
    chunks, usage = vllm_chunks(
        tools=[
            ("c1", "Read", [a[:4], a[4:9], a[9:]]),
            ("c2", "Bash", [b[i : i + 2] for i in range(0, len(b), 2)]),
        ],
        finish="tool_calls",
    )
    raw = run_stream(BODY, chunks, usage, "tool_calls")
    message = check_stream(raw)
    assert [(blk["id"], blk["name"], blk["input"]) for blk in message["content"]] == [
        ("c1", "Read", {"path": "a.txt"}),
        ("c2", "Bash", {"command": "ls -la /tmp", "timeout": 5}),
    ]
    starts = [d["index"] for n, d in parse_sse(raw) if n == "content_block_start"]
    assert starts == [0, 1]


def test_deltas_are_forwarded_as_they_arrive():
    chunks, _ = vllm_chunks(content=["one", "two"])
    translator = adapter.stream(adapter.to_chat(BODY, path="/v1/messages", query={}))
    translator.start()
    outputs = [translator.feed(c).decode() for c in chunks]
    assert '"text":"one"' in outputs[1] and '"text":"two"' in outputs[2]


@pytest.mark.parametrize(
    "finish, stop_reason, expected",
    [
        ("length", None, ("max_tokens", None)),
        ("stop", "END", ("stop_sequence", "END")),
        ("stop", 151645, ("end_turn", None)),
    ],
)
def test_stop_reasons(finish, stop_reason, expected):
    body = {**BODY, "stop_sequences": ["END"]}
    chunks, usage = vllm_chunks(content=["x"], finish=finish, stop_reason=stop_reason)
    message = check_stream(run_stream(body, chunks, usage, finish))
    assert (message["stop_reason"], message["stop_sequence"]) == expected


def test_engine_failure_mid_stream_is_an_error_event():
    chunks, _ = vllm_chunks(content=["partial"])
    translator = adapter.stream(adapter.to_chat(BODY, path="/v1/messages", query={}))
    raw = (
        translator.start() + b"".join(translator.feed(c) for c in chunks[:2]) + translator.error(529, "busy")
    )
    message = check_stream(raw.decode())
    assert message["error"] == {"type": "overloaded_error", "message": "busy"}
    assert message["content"][0]["text"] == "partial"


def test_error_before_any_chunk_is_a_lone_error_event():
    translator = adapter.stream(adapter.to_chat(BODY, path="/v1/messages", query={}))
    raw = translator.start() + translator.error(502, "engine down")
    assert check_stream(raw.decode()) == {"error": {"type": "api_error", "message": "engine down"}}


def test_empty_generation_is_still_a_complete_message():
    chunks, usage = vllm_chunks()
    message = check_stream(run_stream(BODY, chunks, usage, "stop"))
    assert message["content"] == [] and message["stop_reason"] == "end_turn"


def test_display_omitted_sends_the_signature_only():
    """Claude Code asks for `thinking.display: "omitted"`: like Anthropic, the block carries no
    thinking text, and its signature holds the reasoning for the next request."""
    body = {**BODY, "thinking": {"type": "adaptive", "display": "omitted"}}
    chunks, usage = vllm_chunks(reasoning=["secret ", "plan"], content=["ok"])
    raw = run_stream(body, chunks, usage, "stop")
    assert "thinking_delta" not in raw
    thinking, text = check_stream(raw)["content"]
    assert thinking["thinking"] == "" and decode_signature(thinking["signature"]) == "secret plan"
    assert text["text"] == "ok"
