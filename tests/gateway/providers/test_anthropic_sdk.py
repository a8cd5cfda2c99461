"""The official `anthropic` SDK through the real gateway, against the real engine server with a
scripted backend (real tokenization, token ids and logprobs): streaming and not, thinking, a
tool-use round trip that stays token-prefix-mergeable, count_tokens, errors, and the recorded
Claude Code / pi / Qwen Code requests replayed with their streams checked by the grammar."""

from __future__ import annotations

import json

import anthropic
import httpx
import pytest
from fixture_paths import CAPTURES
from reasoning_proxy import reasoning_proxy

from polar_pl.gateway.handle import Gateway
from polar_pl.testing.scripted import Reply, ToolCall
from polar_pl.utils.serving import ServerThread

TOOLS = [
    {
        "name": "Bash",
        "description": "Run a shell command",
        "input_schema": {
            "type": "object",
            "properties": {"command": {"type": "string"}},
            "required": ["command"],
        },
    }
]


def _client(base_url: str, key: str = "unused") -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=base_url, api_key=key, max_retries=0, timeout=60)


def test_non_streaming_message_is_recorded(gateway):
    s = gateway.create_session(harness="claude_code")
    msg = _client(s.base_url).messages.create(
        model="claude-x", max_tokens=64, system="Be brief.", messages=[{"role": "user", "content": "say hi"}]
    )
    assert [b.type for b in msg.content] == ["text"] and msg.content[0].text == "Hello from the engine."
    assert msg.stop_reason == "end_turn" and msg.model == "claude-x"
    (rec,) = gateway.records(s.session_id)
    assert rec.provider == "anthropic" and rec.status == "ok"
    assert msg.usage.input_tokens == len(rec.prompt_ids) > 0
    assert msg.usage.output_tokens == len(rec.response_ids) == len(rec.response_logprobs)
    assert rec.normalized_request["messages"][0] == {"role": "system", "content": "Be brief."}


def test_streaming_with_api_key_on_the_bare_path(gateway):
    s = gateway.create_session()
    with _client(gateway.url, key=s.token).messages.stream(
        model="claude-x", max_tokens=64, messages=[{"role": "user", "content": "hi"}]
    ) as stream:
        events = [e.type for e in stream]
        final = stream.get_final_message()
    assert events[0] == "message_start" and events[-1] == "message_stop"
    assert final.content[0].text == "Hello from the engine." and final.stop_reason == "end_turn"
    (rec,) = gateway.records(s.session_id)
    assert final.usage.input_tokens == len(rec.prompt_ids)
    assert final.usage.output_tokens == len(rec.response_ids)
    assert rec.raw_response.rstrip().endswith('data: {"type":"message_stop"}')


def test_tool_use_round_trip_stays_prefix_mergeable(gateway, script):
    script.queue.extend(
        [Reply(tool_calls=[ToolCall("Bash", {"command": "echo hello > f.txt"})]), Reply("done")]
    )
    s = gateway.create_session(harness="claude_code")
    client = _client(s.base_url)
    messages = [{"role": "user", "content": "create f.txt containing hello"}]
    with client.messages.stream(model="claude-x", max_tokens=256, tools=TOOLS, messages=messages) as stream:
        first = stream.get_final_message()
    assert first.stop_reason == "tool_use"
    (tool,) = first.content
    assert (tool.type, tool.name, tool.input) == ("tool_use", "Bash", {"command": "echo hello > f.txt"})
    messages += [
        {"role": "assistant", "content": [tool.model_dump()]},
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": tool.id, "content": "(no output)"}],
        },
    ]
    second = client.messages.create(model="claude-x", max_tokens=256, tools=TOOLS, messages=messages)
    assert second.content[0].text == "done" and second.stop_reason == "end_turn"

    call1, call2 = gateway.records(s.session_id)
    assert call1.finish_reason == "tool_calls"
    sampled = call1.prompt_ids + call1.response_ids
    assert call2.prompt_ids[: len(sampled)] == sampled, "second prompt must extend prompt + sampled tokens"
    assert script.chats[1]["messages"][2] == {
        "role": "tool",
        "tool_call_id": tool.id,
        "content": "(no output)",
    }


def test_think_text_from_an_engine_without_reasoning_parser_round_trips(gateway, script):
    """Without a reasoning parser the engine's `<think>` block arrives as content: it is passed
    on as text and, sent back, re-renders to the same tokens."""
    script.queue.extend(
        [
            Reply(
                reasoning="The user wants a file.",
                tool_calls=[ToolCall("Bash", {"command": "echo hi > f.txt"})],
            ),
            Reply("done"),
        ]
    )
    s = gateway.create_session()
    client = _client(s.base_url)
    messages = [{"role": "user", "content": "create f.txt"}]
    with client.messages.stream(model="m", max_tokens=256, tools=TOOLS, messages=messages) as stream:
        first = stream.get_final_message()
    assert [b.type for b in first.content] == ["text", "tool_use"]
    assert "The user wants a file." in first.content[0].text
    messages += [
        {"role": "assistant", "content": [b.model_dump() for b in first.content]},
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": first.content[1].id, "content": "ok"}],
        },
    ]
    client.messages.create(model="m", max_tokens=256, tools=TOOLS, messages=messages)
    call1, call2 = gateway.records(s.session_id)
    sampled = call1.prompt_ids + call1.response_ids
    assert call2.prompt_ids[: len(sampled)] == sampled


def test_two_tool_calls_in_one_turn(gateway, script):
    script.queue.append(
        Reply("Both.", tool_calls=[ToolCall("Bash", {"command": "ls"}), ToolCall("Bash", {"command": "pwd"})])
    )
    s = gateway.create_session()
    with _client(s.base_url).messages.stream(
        model="m", max_tokens=256, tools=TOOLS, messages=[{"role": "user", "content": "two"}]
    ) as stream:
        final = stream.get_final_message()
    assert [b.type for b in final.content] == ["text", "tool_use", "tool_use"]
    assert [b.input for b in final.content[1:]] == [{"command": "ls"}, {"command": "pwd"}]
    assert final.content[1].id != final.content[2].id


def test_count_tokens_matches_the_prompt_the_engine_sees(gateway):
    s = gateway.create_session()
    client = _client(s.base_url)
    kwargs = {"model": "m", "system": "sys", "messages": [{"role": "user", "content": "count these tokens"}]}
    counted = client.messages.count_tokens(**kwargs)
    client.messages.create(max_tokens=16, **kwargs)
    (rec,) = gateway.records(s.session_id)
    assert counted.input_tokens == len(rec.prompt_ids)


def test_bad_request_and_bad_token_in_anthropic_shape(gateway):
    s = gateway.create_session()
    with pytest.raises(anthropic.BadRequestError) as bad:
        _client(s.base_url).messages.create(
            model="m", max_tokens=16, messages=[{"role": "user", "content": [{"type": "tool_result"}]}]
        )
    assert bad.value.body["error"]["type"] == "invalid_request_error"
    assert "tool_use_id" in bad.value.body["error"]["message"]
    with pytest.raises(anthropic.AuthenticationError) as denied:
        _client(gateway.url, key="not-a-session").messages.create(
            model="m", max_tokens=16, messages=[{"role": "user", "content": "x"}]
        )
    assert denied.value.body["error"]["type"] == "authentication_error"


def test_engine_failure_is_an_anthropic_error(gateway, script):
    script.fail = 503
    s = gateway.create_session()
    with pytest.raises(anthropic.APIStatusError) as failed:
        _client(s.base_url).messages.create(
            model="m", max_tokens=16, messages=[{"role": "user", "content": "x"}]
        )
    assert failed.value.body["type"] == "error"
    assert failed.value.body["error"]["type"] in ("api_error", "overloaded_error")


ANTHROPIC_CAPTURES = sorted(
    p
    for p in CAPTURES.glob("*/*.request.record.json")
    if json.loads(p.read_text())["path"].startswith("/v1/messages")
)


@pytest.mark.parametrize("record", ANTHROPIC_CAPTURES, ids=lambda p: f"{p.parent.name}/{p.name[:28]}")
def test_recorded_cli_request_replays_through_the_gateway(gateway, script, record):
    """Each recorded CLI request, sent as the CLI sent it (path, query, body), streams back a
    message that the structural grammar checker accepts, with the real prompt length as usage."""
    from test_anthropic_stream import check_stream  # same directory; pytest puts it on sys.path

    rec = json.loads(record.read_text())
    body = json.loads(record.with_name(record.name.replace(".record.", ".body.")).read_text())
    body["max_tokens"] = 64  # the tiny engine's context is short; nothing else is changed
    # a tool the request offers (pi's is `bash`, Qwen Code's first is `agent`): a call to a name
    # not among the request's tools is never passed on
    names = [t["name"] for t in body.get("tools") or []]
    tool = next((n for n in names if n.lower() == "bash"), names[0] if names else "Bash")
    script.queue.append(
        Reply("ok", tool_calls=[ToolCall(tool, {"command": "true"})]) if body.get("tools") else "ok"
    )
    s = gateway.create_session()
    with httpx.Client(timeout=60) as http:
        r = http.post(
            f"{s.base_url}{rec['path']}",
            params={k: v[0] for k, v in rec["query"].items()},
            headers={"anthropic-version": "2023-06-01", "content-type": "application/json"},
            content=json.dumps(body),
        )
    assert r.status_code == 200, r.text
    message = check_stream(r.text)
    assert message["content"][0]["type"] == "text" and message["content"][0]["text"].strip() == "ok"
    if body.get("tools"):
        assert message["stop_reason"] == "tool_use"
        assert message["content"][1]["name"] == tool and message["content"][1]["input"] == {"command": "true"}
    (trace,) = gateway.records(s.session_id)
    assert trace.status == "ok" and message["usage"]["input_tokens"] == len(trace.prompt_ids)
    n_system = sum(1 for m in body["messages"] if m["role"] == "system")
    assert [m["role"] for m in trace.normalized_request["messages"]].count("system") == n_system + 1


def test_stop_sequence_reported_on_the_stream(gateway, script):
    script.default = lambda chat: Reply("Hello END world")
    s = gateway.create_session()
    with _client(s.base_url).messages.stream(
        model="m", max_tokens=50, stop_sequences=["END"], messages=[{"role": "user", "content": "x"}]
    ) as stream:
        final = stream.get_final_message()
    assert (final.stop_reason, final.stop_sequence) == ("stop_sequence", "END")
    assert final.content[0].text == "Hello "


@pytest.fixture
def thinking_gateway(engine, tmp_path, tiny_model_dir):
    """The gateway in front of the engine with a reasoning parser (`<think>` -> delta.reasoning)."""
    with ServerThread(reasoning_proxy(engine.url)) as proxy:
        gw = Gateway(
            [proxy.url], tmp_path / "thinking.db", tokenizer_dir=tiny_model_dir, token_faithful=False
        ).start()
        yield gw
        gw.stop()


def test_thinking_round_trip_with_display_omitted_like_claude_code(thinking_gateway, script):
    """Claude Code asks for `display: "omitted"` and sends thinking blocks back as it got them
    (empty text, signature): the engine must still see its reasoning, token for token."""
    script.queue.extend(
        [
            Reply(
                reasoning="The user wants a file.",
                tool_calls=[ToolCall("Bash", {"command": "echo hi > f.txt"})],
            ),
            Reply("done", reasoning="It worked."),
        ]
    )
    s = thinking_gateway.create_session(harness="claude_code")
    client = _client(s.base_url)
    thinking = {"type": "adaptive", "display": "omitted"}
    messages = [{"role": "user", "content": "create f.txt"}]
    with client.messages.stream(
        model="m", max_tokens=256, tools=TOOLS, messages=messages, thinking=thinking
    ) as st:
        first = st.get_final_message()
    kinds = [b.type for b in first.content]
    assert kinds[0] == "thinking" and kinds[-1] == "tool_use" and first.stop_reason == "tool_use"
    assert first.content[0].thinking == "" and first.content[0].signature
    messages += [
        {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in first.content]},
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": first.content[-1].id, "content": "ok"}],
        },
    ]
    second = client.messages.create(model="m", max_tokens=256, tools=TOOLS, messages=messages)
    reply_thinking = second.content[0]
    assert reply_thinking.type == "thinking" and reply_thinking.thinking.strip() == "It worked."
    assert second.content[-1].text.strip() == "done"

    call1, call2 = thinking_gateway.records(s.session_id)
    assert script.chats[1]["messages"][1]["reasoning"].strip() == "The user wants a file."
    sampled = call1.prompt_ids + call1.response_ids
    assert call2.prompt_ids[: len(sampled)] == sampled, "the reasoning must re-render from the signature"
