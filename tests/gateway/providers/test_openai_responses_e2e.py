"""The official `openai` SDK's Responses client through the real gateway to a scripted engine.

Real parts at every boundary: the gateway app and the engine server run on 127.0.0.1; the engine
is the ScriptedBackend (real tokenizer and chat template, deterministic tool calls) behind the
real engine HTTP server. Streams are checked with the Responses grammar checker and with the SDK's
own stream accumulator; records are read back from the gateway's trace store.
"""

from __future__ import annotations

import json
from typing import Any

import httpx
import openai
import pytest
from fixture_paths import CAPTURES, HARNESS_PREFIX
from test_openai_responses_grammar import check_stream, parse_sse

from polar_pl.gateway.handle import Gateway
from polar_pl.testing.scripted import Reply, ToolCall, serve_scripted

TOOLS = [
    {
        "type": "function",
        "name": "write_file",
        "description": "Write a file.",
        "parameters": {
            "type": "object",
            "properties": {"path": {"type": "string"}, "content": {"type": "string"}},
            "required": ["path", "content"],
        },
        "strict": False,
    },
    {"type": "web_search"},
]
WRITE = {"path": "f.txt", "content": "hello"}
CAPTURED = sorted(CAPTURES.glob("*/*responses*.request.body.json"))


def script(chat: dict[str, Any]) -> Reply:
    """Order-independent answers: a tool result is acknowledged, a task gets a tool call."""
    last = chat["messages"][-1]
    if last["role"] == "tool":
        return Reply(f"done: {last['content']}")
    if "write" in str(last["content"]):
        return Reply("Writing it.", tool_calls=[ToolCall("write_file", WRITE)])
    return Reply("Hello from the engine.")


@pytest.fixture(scope="module")
def stack(tiny_model_dir, tmp_path_factory):
    with serve_scripted(script, model_dir=tiny_model_dir) as engine:
        store = tmp_path_factory.mktemp("responses-e2e") / "traces.db"
        with Gateway([engine.url], store, health_interval=30.0) as gw:
            yield gw, engine


@pytest.fixture
def session(stack):
    gw, engine = stack
    s = gw.create_session(task_id="t", harness="codex")
    client = openai.OpenAI(base_url=f"{s.base_url}/v1", api_key="unused", max_retries=0, timeout=60)
    return gw, engine, s, client


def _raw_stream(client: openai.OpenAI, **kwargs: Any):
    """The gateway's SSE bytes for a streamed create, through the SDK's HTTP layer, checked."""
    with client.responses.with_streaming_response.create(stream=True, **kwargs) as resp:
        assert resp.headers["content-type"].startswith("text/event-stream")
        return check_stream(parse_sse(b"".join(resp.iter_bytes())))


def test_non_streaming_text(session):
    gw, engine, s, client = session
    resp = client.responses.create(model=engine.model, input="say hi", instructions="Be brief.")
    assert resp.status == "completed" and resp.output_text == "Hello from the engine."
    [record] = gw.records(s.session_id)
    assert record.provider == "openai_responses" and record.status == "ok"
    assert resp.usage.input_tokens == len(record.prompt_ids) > 0
    assert resp.usage.output_tokens == len(record.response_ids) == len(record.response_logprobs) > 0
    assert record.normalized_request["messages"][0] == {"role": "system", "content": "Be brief."}


def test_streaming_text_passes_grammar_and_sdk_accumulator(session):
    gw, engine, s, client = session
    result = _raw_stream(client, model=engine.model, input="say hi")
    assert result.items[0]["content"][0]["text"] == "Hello from the engine."
    assert result.types.count("response.output_text.delta") > 1  # forwarded token by token
    with client.responses.stream(model=engine.model, input="say hi") as stream:
        final = stream.get_final_response()
    assert final.output_text == "Hello from the engine." and final.status == "completed"
    assert len(gw.records(s.session_id)) == 2


@pytest.mark.parametrize("streaming", [True, False], ids=["stream", "no-stream"])
def test_function_call_round_trip(session, streaming):
    gw, engine, s, client = session
    first_input: list[dict[str, Any]] = [
        {
            "type": "message",
            "role": "developer",
            "content": [{"type": "input_text", "text": "You are Codex."}],
        },
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "write f.txt"}]},
    ]
    kwargs = {"model": engine.model, "tools": TOOLS, "tool_choice": "auto", "store": False}
    if streaming:
        first = openai.types.responses.Response.model_validate(
            _raw_stream(client, input=first_input, **kwargs).response
        )
    else:
        first = client.responses.create(input=first_input, **kwargs)
    assert [item.type for item in first.output] == ["message", "function_call"]
    call = first.output[1]
    assert call.name == "write_file" and json.loads(call.arguments) == WRITE and call.call_id

    second_input = [
        *first_input,
        *[item.model_dump(exclude_unset=True) for item in first.output],
        {"type": "function_call_output", "call_id": call.call_id, "output": "wrote 5 bytes"},
    ]
    if streaming:
        second = openai.types.responses.Response.model_validate(
            _raw_stream(client, input=second_input, **kwargs).response
        )
    else:
        second = client.responses.create(input=second_input, **kwargs)
    assert second.output_text == "done: wrote 5 bytes"

    one, two = gw.records(s.session_id)
    assert one.status == two.status == "ok" and one.response_ids and two.response_ids
    assert any("web_search" in n for n in one.notes)
    turn = two.normalized_request["messages"][2]
    assert turn["role"] == "assistant" and turn["content"] == first.output[0].content[0].text
    assert turn["tool_calls"][0]["id"] == call.call_id
    assert two.normalized_request["messages"][3] == {
        "role": "tool",
        "tool_call_id": call.call_id,
        "content": "wrote 5 bytes",
    }


def test_text_turn_round_trips_token_for_token(session):
    """Output items sent back as input re-render to exactly the tokens the policy sampled."""
    gw, engine, s, client = session
    history: list[Any] = [{"role": "user", "content": "say hi"}]
    first = client.responses.create(model=engine.model, input=history)
    history += [item.model_dump(exclude_unset=True) for item in first.output]
    history.append({"role": "user", "content": "and again"})
    client.responses.create(model=engine.model, input=history)
    one, two = gw.records(s.session_id)
    sampled = one.prompt_ids + one.response_ids
    assert two.prompt_ids[: len(sampled)] == sampled


def test_malformed_request_is_a_400_in_openai_shape(session):
    gw, engine, s, client = session
    with pytest.raises(openai.BadRequestError) as err:
        client.responses.create(model=engine.model, input=[{"type": "item_reference", "id": "msg_1"}])
    assert "item_reference" in err.value.body["message"]
    assert err.value.body["type"] == "invalid_request_error"
    [record] = gw.records(s.session_id)  # a failed call is recorded with its error
    assert record.status == "error" and "item_reference" in record.error


def test_wrong_token_is_a_401_and_records_nothing(stack):
    gw, engine = stack
    client = openai.OpenAI(base_url=f"{gw.url}/s/not-a-token/v1", api_key="nope", max_retries=0)
    with pytest.raises(openai.AuthenticationError) as err:
        client.responses.create(model=engine.model, input="hi")
    assert err.value.body["code"] == "invalid_api_key"


@pytest.mark.parametrize("path", CAPTURED, ids=lambda p: f"{p.parent.name}/{p.name[:24]}")
def test_captured_cli_requests_replay_through_the_gateway(stack, path):
    """Each recorded CLI body, sent as the CLI sent it (token as the API key on the bare path)."""
    gw, _ = stack
    s = gw.create_session(harness=path.parent.name)
    body = path.read_bytes()
    raw = json.loads(body)
    resp = httpx.post(
        f"{gw.url}/v1/responses",
        content=body,
        headers={"authorization": f"Bearer {s.token}", "content-type": "application/json"},
        timeout=60,
    )
    assert resp.status_code == 200, resp.text
    result = check_stream(parse_sse(resp.content))
    assert result.response["model"] == raw["model"] and result.response["status"] == "completed"
    [record] = gw.records(s.session_id)
    assert record.status == "ok" and record.response_ids and record.raw_request == raw
    messages = record.normalized_request["messages"]
    items = raw["input"]
    assert sum(m["role"] == "user" for m in messages) == sum(i.get("role") == "user" for i in items)
    assert sum(m["role"] == "tool" for m in messages) == sum(
        i.get("type") == "function_call_output" for i in items
    )
    calls = [tc for m in messages for tc in m.get("tool_calls") or []]
    assert len(calls) == sum(i.get("type") == "function_call" for i in items)
    function_tools = [t["name"] for t in raw.get("tools", []) if t["type"] == "function"]
    assert [t["function"]["name"] for t in record.normalized_request.get("tools", [])] == function_tools


# --- real CLIs speaking the Responses API -------------------------------------------------------

# harness -> (its shell tool, the argument holding the command, extra arguments it requires)
CLI_SHELL = {
    "codex": ("exec_command", "cmd", {}),
    "pi": ("bash", "command", {}),
    "opencode": ("bash", "command", {"description": "Write the result file"}),
}


@pytest.mark.slow
@pytest.mark.parametrize("name", list(CLI_SHELL))
def test_cli_over_responses_runs_a_tool_task(name, tiny_model_dir, tmp_path):
    """Pi and OpenCode only accept the full item grammar; Codex speaks nothing but Responses."""
    from polar_pl.harness import build_harness
    from polar_pl.harness.protocol import GatewaySession
    from polar_pl.harness.run import run_harness
    from polar_pl.sandbox.local import LocalSandbox

    prefix = HARNESS_PREFIX
    harness = build_harness(name, provider="openai_responses")
    if not harness.is_installed(prefix):
        pytest.skip(f"{name} is not installed: polar-pl harness install {name} --prefix {prefix}")
    tool, arg, extra = CLI_SHELL[name]

    def reply(chat: dict[str, Any]) -> Reply:
        if any(m["role"] == "tool" for m in chat["messages"]):
            return Reply("The file is written.")
        if tool in {t["function"]["name"] for t in chat.get("tools") or []}:
            return Reply(tool_calls=[ToolCall(tool, {arg: "printf hi > result.txt", **extra})])
        return Reply("Write a file")  # side calls (titles)

    with (
        serve_scripted(reply, model_dir=tiny_model_dir) as engine,
        Gateway([engine.url], tmp_path / "traces.db", health_interval=30.0) as gw,
    ):
        handle = gw.create_session(harness=name)
        session = GatewaySession(base_url=handle.base_url, token=handle.token, model="polar-tiny")
        sandbox = LocalSandbox(owner="pytest", harness_prefix=str(prefix))
        sandbox.start()
        try:
            result = run_harness(harness, sandbox, session, "Write hi into result.txt.", timeout=240)
            detail = f"stdout:\n{result.stdout[-2000:]}\nstderr:\n{result.stderr[-2000:]}"
            assert result.exit_code == 0 and not result.timed_out, detail
            assert sandbox.get_file("result.txt") == b"hi"
        finally:
            sandbox.stop()
        main = [r for r in gw.records(handle.session_id) if r.call_kind == "main"]
    assert len(main) >= 2 and all(r.provider == "openai_responses" and r.status == "ok" for r in main)
    assert any(m["role"] == "tool" for m in main[-1].normalized_request["messages"])
