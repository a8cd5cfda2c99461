"""ScriptedBackend through the real engine server, with the official OpenAI SDK as client."""

from __future__ import annotations

import json

import openai
import pytest

from polar_pl.testing.scripted import Reply, ToolCall, serve_scripted

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "write_file",
            "description": "Write a file",
            "parameters": {
                "type": "object",
                "properties": {"path": {"type": "string"}, "content": {"type": "string"}},
                "required": ["path", "content"],
            },
        },
    }
]
ARGS = {"path": "a.txt", "content": "hello wörld"}


@pytest.fixture
def engine(tiny_model_dir):
    script = [Reply(tool_calls=[ToolCall("write_file", ARGS)]), Reply("done")]
    with serve_scripted(script, model_dir=tiny_model_dir) as srv:
        yield srv


def test_tool_call_then_answer(engine):
    client = openai.OpenAI(base_url=engine.base_url, api_key="x")
    messages = [{"role": "user", "content": "write a.txt"}]
    first = client.chat.completions.create(
        model=engine.model,
        messages=messages,
        tools=TOOLS,
        logprobs=True,
        top_logprobs=0,
        extra_body={"return_token_ids": True},
    )
    choice = first.choices[0]
    assert choice.finish_reason == "tool_calls"
    (call,) = choice.message.tool_calls
    assert call.function.name == "write_file"
    assert json.loads(call.function.arguments) == ARGS
    assert call.id.startswith("chatcmpl-tool-")
    extra = first.model_extra
    token_ids = choice.model_extra["token_ids"]
    assert len(token_ids) == len(choice.logprobs.content) == first.usage.completion_tokens
    assert len(extra["prompt_token_ids"]) == first.usage.prompt_tokens
    assert extra["policy_version"] == 0
    tok = engine.backend.tokenizer
    assert token_ids[-1] == tok.convert_tokens_to_ids("<|im_end|>")
    assert "<tool_call>" in tok.decode(token_ids)

    messages += [
        choice.message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": "ok"},
    ]
    second = client.chat.completions.create(model=engine.model, messages=messages, tools=TOOLS)
    assert second.choices[0].message.content == "done"
    assert second.choices[0].finish_reason == "stop"
    # The server saw the tool result in the second request's prompt.
    second_prompt = tok.decode(list(engine.backend.requests[1].prompt_ids))
    assert "<tool_response>\nok\n</tool_response>" in second_prompt


def test_streamed_tool_call_deltas(engine):
    client = openai.OpenAI(base_url=engine.base_url, api_key="x")
    stream = client.chat.completions.create(
        model=engine.model,
        messages=[{"role": "user", "content": "go"}],
        tools=TOOLS,
        stream=True,
        stream_options={"include_usage": True},
        extra_body={"return_token_ids": True},
    )
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert chunks[0].model_extra["prompt_token_ids"]
    name_deltas = [
        tc
        for c in chunks
        if c.choices
        for tc in (c.choices[0].delta.tool_calls or [])
        if tc.function and tc.function.name
    ]
    assert [tc.function.name for tc in name_deltas] == ["write_file"]
    args = "".join(
        tc.function.arguments or ""
        for c in chunks
        if c.choices
        for tc in (c.choices[0].delta.tool_calls or [])
        if tc.function
    )
    assert json.loads(args) == ARGS
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes == ["tool_calls"]
    streamed_ids = [t for c in chunks if c.choices for t in c.choices[0].model_extra.get("token_ids", [])]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == len(streamed_ids)


def test_script_exhausted_is_an_error(engine):
    client = openai.OpenAI(base_url=engine.base_url, api_key="x", max_retries=0)
    for _ in range(2):
        client.chat.completions.create(model=engine.model, messages=[{"role": "user", "content": "x"}])
    with pytest.raises(openai.InternalServerError) as err:
        client.chat.completions.create(model=engine.model, messages=[{"role": "user", "content": "x"}])
    assert "no reply left" in err.value.body["message"]


def test_reasoning_renders_the_thinking_block(tiny_model_dir):
    with serve_scripted([Reply("42", reasoning="think hard")], model_dir=tiny_model_dir) as srv:
        client = openai.OpenAI(base_url=srv.base_url, api_key="x")
        r = client.chat.completions.create(model=srv.model, messages=[{"role": "user", "content": "q"}])
        assert r.choices[0].message.content == "<think>\nthink hard\n</think>\n\n42"


def test_callable_script_sees_the_request(tiny_model_dir):
    def answer(chat):
        return Reply(f"you said {chat['messages'][-1]['content']}")

    with serve_scripted(answer, model_dir=tiny_model_dir) as srv:
        client = openai.OpenAI(base_url=srv.base_url, api_key="x")
        for word in ("a", "b"):
            r = client.chat.completions.create(model=srv.model, messages=[{"role": "user", "content": word}])
            assert r.choices[0].message.content == f"you said {word}"


def test_scripted_server_is_an_engine_handle(engine, tmp_path):
    from polar_pl.engine.protocol import Engine

    assert isinstance(engine, Engine) and engine.health()
    assert engine.update_weights_from_state_dict({}) == 1
    assert engine.update_weights_from_disk(str(tmp_path)) == 2 == engine.policy_version()
    client = openai.OpenAI(base_url=engine.base_url, api_key="x")
    raw = client.chat.completions.with_raw_response.create(
        model=engine.model, messages=[{"role": "user", "content": "x"}]
    )
    assert raw.headers["x-policy-version"] == "2" and raw.parse().model_extra["policy_version"] == 2
