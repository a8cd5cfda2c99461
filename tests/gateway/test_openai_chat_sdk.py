"""The official OpenAI SDK through the gateway (Chat Completions), against the real engine server
with a scripted backend: streaming and not, a tool round trip, and what lands in the store."""

from __future__ import annotations

import json

import openai

from polar_pl.testing.scripted import Reply, ToolCall

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "bash",
            "description": "Run a shell command",
            "parameters": {
                "type": "object",
                "properties": {"command": {"type": "string"}},
                "required": ["command"],
            },
        },
    }
]


def _client(base_url: str, key: str = "unused") -> openai.OpenAI:
    return openai.OpenAI(base_url=base_url, api_key=key, max_retries=0, timeout=30)


def test_non_streaming_call_is_recorded_token_by_token(gateway, engine):
    s = gateway.create_session(task_id="t1", group_id="g1", harness="pi")
    r = _client(f"{s.base_url}/v1").chat.completions.create(
        model="my-model", messages=[{"role": "user", "content": "say hi"}]
    )
    assert r.choices[0].message.content == "Hello from the engine."
    assert r.choices[0].finish_reason == "stop"
    assert r.model == "my-model"  # the harness's name is echoed, not the served one
    assert "token_ids" not in (r.choices[0].model_extra or {})
    (rec,) = gateway.records(s.session_id)
    assert rec.status == "ok" and rec.provider == "openai_chat" and rec.call_index == 0
    assert (rec.task_id, rec.group_id, rec.call_kind) == ("t1", "g1", "main")
    assert rec.prompt_ids and rec.response_ids
    assert len(rec.response_logprobs) == len(rec.response_ids)
    assert rec.finish_reason == "stop"
    assert r.usage.prompt_tokens == len(rec.prompt_ids)
    assert r.usage.completion_tokens == len(rec.response_ids)
    assert rec.normalized_request["model"] == engine.model
    assert rec.normalized_request["return_token_ids"] is True
    assert rec.raw_request["model"] == "my-model"
    assert json.loads(rec.raw_response)["choices"][0]["message"]["content"] == "Hello from the engine."


def test_streaming_with_usage_and_api_key_auth_on_bare_path(gateway):
    s = gateway.create_session()
    stream = _client(f"{gateway.url}/v1", key=s.token).chat.completions.create(
        model="m",
        messages=[{"role": "user", "content": "hi"}],
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == "Hello from the engine."
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes == ["stop"]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens > 0
    (rec,) = gateway.records(s.session_id)
    assert rec.raw_response.endswith("data: [DONE]\n\n")
    assert rec.status == "ok" and len(rec.response_ids) == chunks[-1].usage.completion_tokens


def test_tool_round_trip(gateway, script):
    script.queue.extend(
        [Reply(tool_calls=[ToolCall("bash", {"command": "echo hello > f.txt"})]), Reply("done")]
    )
    s = gateway.create_session()
    client = _client(f"{s.base_url}/v1")
    messages = [{"role": "user", "content": "create f.txt"}]
    stream = client.chat.completions.create(model="m", messages=messages, tools=TOOLS, stream=True)
    calls: dict[int, dict] = {}
    finish = None
    for c in stream:
        for tc in c.choices[0].delta.tool_calls or ():
            slot = calls.setdefault(tc.index, {"id": None, "name": "", "arguments": ""})
            slot["id"] = tc.id or slot["id"]
            slot["name"] += tc.function.name or ""
            slot["arguments"] += tc.function.arguments or ""
        finish = c.choices[0].finish_reason or finish
    assert finish == "tool_calls"
    (call,) = calls.values()
    assert call["name"] == "bash" and json.loads(call["arguments"]) == {"command": "echo hello > f.txt"}
    messages += [
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": call["id"],
                    "type": "function",
                    "function": {"name": "bash", "arguments": call["arguments"]},
                }
            ],
        },
        {"role": "tool", "tool_call_id": call["id"], "content": "(no output)"},
    ]
    r = client.chat.completions.create(model="m", messages=messages, tools=TOOLS)
    assert r.choices[0].message.content == "done"
    first, second = gateway.records(s.session_id)
    assert [first.call_index, second.call_index] == [0, 1]
    assert first.finish_reason == "tool_calls"
    # the second prompt extends the first call's prompt + sampled tokens (prefix-mergeable)
    assert second.prompt_ids[: len(first.prompt_ids)] == first.prompt_ids
    assert second.normalized_request["messages"][1]["tool_calls"][0]["function"]["name"] == "bash"
    assert script.chats[1]["messages"][2]["role"] == "tool"


def test_n_greater_than_one_is_rejected_in_openai_shape(gateway):
    s = gateway.create_session()
    try:
        _client(f"{s.base_url}/v1").chat.completions.create(
            model="m", messages=[{"role": "user", "content": "x"}], n=2
        )
    except openai.BadRequestError as exc:
        assert exc.status_code == 400 and "n=2" in exc.message
    else:
        raise AssertionError("n=2 was accepted")
    (rec,) = gateway.records(s.session_id)
    assert rec.status == "error" and "n=2" in rec.error
