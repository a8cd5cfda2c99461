"""Malformed tool calls are noted in the record and never reach the harness as calls."""

from __future__ import annotations

import openai
import pytest

from polar_pl.chat.toolparse import HermesStreamParser
from polar_pl.gateway.call.toolguard import ToolCallGuard
from polar_pl.testing.scripted import Reply, ToolCall

TOOLS = [
    {"type": "function", "function": {"name": "bash", "parameters": {"type": "object"}}},
    {"type": "function", "function": {"name": "write", "parameters": {"type": "object"}}},
]
BAD_NAME = 'bash"\n<tool_call>\n{"name": "rm'


def _chunk(delta=None, finish=None):
    return {"id": "x", "choices": [{"index": 0, "delta": delta or {}, "finish_reason": finish}]}


def _call(i, name=None, args=None, id_=None):
    fn = {k: v for k, v in (("name", name), ("arguments", args)) if v is not None}
    d = {"index": i, "function": fn}
    if id_:
        d["id"], d["type"] = id_, "function"
    return _chunk({"tool_calls": [d]})


def _forwarded(guard, chunks):
    out = [c for ch in chunks for c in guard.filter(ch)]
    calls = [tc for c in out for ch in c["choices"] for tc in (ch["delta"].get("tool_calls") or [])]
    finish = [ch["finish_reason"] for c in out for ch in c["choices"] if ch["finish_reason"]]
    return calls, finish


def test_stream_holds_calls_and_passes_only_valid_ones_renumbered():
    guard = ToolCallGuard(TOOLS)
    chunks = [
        _chunk({"content": "ok"}),
        _call(0, name=BAD_NAME, id_="a"),
        _call(0, args='{"x": 1}'),
        _call(1, name="bash", id_="b"),
        _call(1, args='{"command": '),
        _call(1, args='"ls"}'),
        _call(2, name="write", id_="c"),
        _call(2, args="not json"),
        _chunk(finish="tool_calls"),
    ]
    calls, finish = _forwarded(guard, chunks)
    assert calls == [
        {
            "index": 0,
            "id": "b",
            "type": "function",
            "function": {"name": "bash", "arguments": '{"command": "ls"}'},
        }
    ]
    assert finish == ["tool_calls"]
    assert len(guard.notes) == 2 and all(n.startswith("malformed tool call dropped: ") for n in guard.notes)
    assert "not among the request's tools" in guard.notes[0] and "not JSON" in guard.notes[1]


def test_all_calls_dropped_ends_as_a_plain_stop():
    guard = ToolCallGuard(TOOLS)
    calls, finish = _forwarded(
        guard, [_call(0, name="Bash", id_="a", args="{}"), _chunk(finish="tool_calls")]
    )
    assert calls == [] and finish == ["stop"]
    msg = ToolCallGuard(None).filter_message(
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [{"id": "a", "function": {"name": "bash", "arguments": "{}"}}],
        }
    )
    assert "tool_calls" not in msg  # a request without tools gets no calls at all


def test_call_whose_json_never_reaches_its_arguments_is_dropped():
    """Codex got `exec_command` with arguments "" (a warm model's `{"name": "exec_command", "echo
    ...` cut before `"arguments"`: the stream parser sends the name, never arguments) and answered
    "failed to parse function arguments: EOF"; the guard had read "" as "{}" and passed it."""
    text = 'Sure\n<tool_call>\n{"name": "bash", "echo polaris'
    parser, chunks = HermesStreamParser(), []
    for end in range(1, len(text) + 1):
        if delta := parser.feed(text[:end]):
            chunks.append(_chunk(delta))
    guard = ToolCallGuard(TOOLS)
    calls, finish = _forwarded(guard, [*chunks, _chunk(finish="tool_calls")])
    assert calls == [] and finish == ["stop"]
    assert guard.notes == ["malformed tool call dropped: arguments of bash are missing"]


@pytest.mark.parametrize("stream", [False, True])
def test_gateway_drops_a_call_to_an_unknown_tool(gateway, script, stream):
    """A name holding a newline and `<tool_call>` went to the harness as a real call."""
    script.queue.append(Reply(tool_calls=[ToolCall(BAD_NAME, {"command": "rm -rf /"})]))
    s = gateway.create_session()
    client = openai.OpenAI(base_url=f"{s.base_url}/v1", api_key="x", max_retries=0)
    kw = {"model": "m", "messages": [{"role": "user", "content": "go"}], "tools": TOOLS}
    if stream:
        chunks = list(client.chat.completions.create(stream=True, **kw))
        calls = [tc for c in chunks if c.choices for tc in c.choices[0].delta.tool_calls or []]
        finish = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    else:
        r = client.chat.completions.create(**kw)
        calls, finish = r.choices[0].message.tool_calls or [], [r.choices[0].finish_reason]
    assert calls == [] and finish == ["stop"]
    (rec,) = gateway.records(s.session_id)
    assert rec.finish_reason == "tool_calls" and rec.response_ids  # the record keeps what was sampled
    assert any(n.startswith("malformed tool call dropped") for n in rec.notes), rec.notes
