"""The official `google-genai` SDK through the real gateway, against the real engine server with a
scripted backend: generateContent and streamGenerateContent (alt=sse), a functionCall /
functionResponse round trip that stays token-prefix-mergeable, JSON mode as Gemini CLI's router
uses it, countTokens, errors, and the recorded Gemini CLI / pi requests replayed."""

from __future__ import annotations

import json

import httpx
import pytest
from fixture_paths import CAPTURES
from google import genai
from google.genai import errors, types
from reasoning_proxy import reasoning_proxy

from polar_pl.gateway.handle import Gateway
from polar_pl.testing.scripted import Reply, ToolCall
from polar_pl.utils.serving import ServerThread

BASH = types.FunctionDeclaration(
    name="run_shell_command",
    description="Run a shell command",
    parameters=types.Schema(
        type="OBJECT", properties={"command": types.Schema(type="STRING")}, required=["command"]
    ),  # Gemini's uppercase schema dialect, as the SDK sends it
)
NO_AFC = types.AutomaticFunctionCallingConfig(disable=True)


def _client(base_url: str, key: str = "unused") -> genai.Client:
    # Keep the returned client referenced while using it: a dropped Client closes its connection.
    options = types.HttpOptions(base_url=base_url, api_version="v1beta", timeout=60_000)
    return genai.Client(api_key=key, http_options=options)


def test_generate_content_is_recorded(gateway):
    s = gateway.create_session(harness="gemini_cli")
    client = _client(s.base_url)
    r = client.models.generate_content(
        model="gemini-x",
        contents="say hi",
        config=types.GenerateContentConfig(system_instruction="Be brief.", max_output_tokens=64),
    )
    assert r.text == "Hello from the engine."
    assert r.candidates[0].finish_reason == types.FinishReason.STOP
    assert r.model_version == "gemini-x"
    (rec,) = gateway.records(s.session_id)
    assert rec.provider == "google" and rec.status == "ok"
    assert r.usage_metadata.prompt_token_count == len(rec.prompt_ids) > 0
    assert r.usage_metadata.candidates_token_count == len(rec.response_ids) == len(rec.response_logprobs)
    assert rec.normalized_request["messages"][0] == {"role": "system", "content": "Be brief."}


def test_stream_with_api_key_on_the_bare_path(gateway):
    s = gateway.create_session()
    client = _client(gateway.url, key=s.token)
    chunks = list(client.models.generate_content_stream(model="gemini-x", contents="hi"))
    assert "".join(c.text or "" for c in chunks) == "Hello from the engine."
    assert len(chunks) > 2, "tokens are forwarded as they come, not as one block"
    assert chunks[-1].candidates[0].finish_reason == types.FinishReason.STOP
    assert all(c.candidates[0].finish_reason is None for c in chunks[:-1])
    (rec,) = gateway.records(s.session_id)
    assert chunks[-1].usage_metadata.prompt_token_count == len(rec.prompt_ids)
    assert chunks[-1].usage_metadata.candidates_token_count == len(rec.response_ids)


def test_function_call_round_trip_stays_prefix_mergeable(gateway, script):
    script.queue.extend(
        [Reply(tool_calls=[ToolCall("run_shell_command", {"command": "echo hello > f.txt"})]), Reply("done")]
    )
    s = gateway.create_session(harness="gemini_cli")
    client = _client(s.base_url)
    config = types.GenerateContentConfig(
        tools=[types.Tool(function_declarations=[BASH])], automatic_function_calling=NO_AFC
    )
    contents = [
        types.Content(role="user", parts=[types.Part.from_text(text="create f.txt containing hello")])
    ]
    chunks = list(client.models.generate_content_stream(model="gemini-x", contents=contents, config=config))
    calls = [
        p.function_call
        for c in chunks
        for p in (c.candidates[0].content.parts if c.candidates[0].content else [])
        if p.function_call
    ]
    (call,) = calls
    assert (call.name, call.args) == ("run_shell_command", {"command": "echo hello > f.txt"})
    model_turn = types.Content(role="model", parts=[types.Part(function_call=call)])
    answer = types.Part.from_function_response(name="run_shell_command", response={"output": "(empty)"})
    contents += [model_turn, types.Content(role="user", parts=[answer])]
    r = client.models.generate_content(model="gemini-x", contents=contents, config=config)
    assert r.text == "done"

    call1, call2 = gateway.records(s.session_id)
    assert call1.finish_reason == "tool_calls"
    assert script.chats[0]["tools"][0]["function"]["parameters"]["properties"]["command"]["type"] == "string"
    sampled = call1.prompt_ids + call1.response_ids
    assert call2.prompt_ids[: len(sampled)] == sampled, "second prompt must extend prompt + sampled tokens"
    tool_msg = script.chats[1]["messages"][-1]
    assert tool_msg["role"] == "tool" and tool_msg["tool_call_id"] == call.id
    assert json.loads(tool_msg["content"]) == {"output": "(empty)"}


def test_json_mode_like_the_router_classifier(gateway, script):
    script.queue.append('{"complexity_reasoning": "simple", "complexity_score": 5}')
    s = gateway.create_session()
    schema = {
        "type": "object",
        "properties": {"complexity_reasoning": {"type": "string"}, "complexity_score": {"type": "integer"}},
    }
    client = _client(s.base_url)
    r = client.models.generate_content(
        model="gemini-x-lite",
        contents="classify",
        config=types.GenerateContentConfig(
            response_mime_type="application/json", response_json_schema=schema
        ),
    )
    assert r.parsed == {"complexity_reasoning": "simple", "complexity_score": 5}
    assert script.chats[0]["response_format"]["json_schema"]["schema"] == schema


def test_count_tokens_matches_the_prompt_the_engine_sees(gateway):
    s = gateway.create_session()
    client = _client(s.base_url)
    counted = client.models.count_tokens(model="gemini-x", contents="count these tokens")
    client.models.generate_content(model="gemini-x", contents="count these tokens")
    (rec,) = gateway.records(s.session_id)
    assert counted.total_tokens == len(rec.prompt_ids)


def test_errors_in_google_shape(gateway, script):
    s = gateway.create_session()
    stranger = _client(gateway.url, key="not-a-session")
    with pytest.raises(errors.ClientError) as denied:
        stranger.models.generate_content(model="g", contents="x")
    assert denied.value.code == 401 and denied.value.status == "UNAUTHENTICATED"
    with httpx.Client(timeout=30) as http:
        r = http.post(f"{s.base_url}/v1beta/models/g:generateContent", json={"contents": [{"role": "robot"}]})
    assert r.status_code == 400 and r.json()["error"]["status"] == "INVALID_ARGUMENT"
    script.fail = 503
    client = _client(s.base_url)
    with pytest.raises(errors.ServerError) as failed:
        client.models.generate_content(model="g", contents="x")
    assert failed.value.code >= 500 and failed.value.status in (
        "UNAVAILABLE",
        "INTERNAL",
        "DEADLINE_EXCEEDED",
    )


GOOGLE_CAPTURES = sorted(
    p for p in CAPTURES.glob("*/*.request.record.json") if "/models/" in json.loads(p.read_text())["path"]
)


@pytest.mark.parametrize("record", GOOGLE_CAPTURES, ids=lambda p: f"{p.parent.name}/{p.name[:28]}")
def test_recorded_cli_request_replays_through_the_gateway(gateway, script, record):
    """Each recorded CLI request, sent as the CLI sent it (path, query, body), answers with a
    response or stream the structural checker accepts, usage counting the real prompt."""
    from test_google_stream import check_response, check_stream  # same directory, on sys.path

    rec = json.loads(record.read_text())
    body = json.loads(record.with_name(record.name.replace(".record.", ".body.")).read_text())
    body.setdefault("generationConfig", {})["maxOutputTokens"] = 64  # the tiny engine's context is short
    tools = [d["name"] for t in body.get("tools", []) for d in t.get("functionDeclarations", [])]
    script.queue.append(Reply(tool_calls=[ToolCall(tools[0], {"x": 1})]) if tools else '{"ok": true}')
    s = gateway.create_session()
    with httpx.Client(timeout=60) as http:
        r = http.post(
            f"{s.base_url}{rec['path']}",
            params={k: v[0] for k, v in rec["query"].items()},
            headers={"content-type": "application/json"},
            content=json.dumps(body),
        )
    assert r.status_code == 200, r.text
    (trace,) = gateway.records(s.session_id)
    if rec["path"].endswith(":streamGenerateContent"):
        result = check_stream(r.text)
        assert result["calls"] == [{"name": tools[0], "args": {"x": 1}, "id": result["calls"][0]["id"]}]
        assert result["usage"]["promptTokenCount"] == len(trace.prompt_ids)
    else:
        (part,) = check_response(r.json(), last=True)
        assert json.loads(part["text"]) == {"ok": True}
        assert r.json()["usageMetadata"]["promptTokenCount"] == len(trace.prompt_ids)


@pytest.fixture
def thinking_gateway(engine, tmp_path, tiny_model_dir):
    """The gateway in front of the engine with a reasoning parser (`<think>` -> delta.reasoning)."""
    with ServerThread(reasoning_proxy(engine.url)) as proxy:
        gw = Gateway(
            [proxy.url], tmp_path / "thinking.db", tokenizer_dir=tiny_model_dir, token_faithful=False
        ).start()
        yield gw
        gw.stop()


def test_thought_round_trip_without_thought_parts_like_gemini_cli(thinking_gateway, script):
    """Gemini CLI shows thought parts but keeps only the other parts (with their
    thoughtSignature) in its history: the engine must still see its reasoning, token for token."""
    script.queue.extend(
        [
            Reply(
                reasoning="Use the shell.", tool_calls=[ToolCall("run_shell_command", {"command": "echo hi"})]
            ),
            Reply("done"),
        ]
    )
    s = thinking_gateway.create_session(harness="gemini_cli")
    client = _client(s.base_url)
    config = types.GenerateContentConfig(
        tools=[types.Tool(function_declarations=[BASH])],
        automatic_function_calling=NO_AFC,
        thinking_config=types.ThinkingConfig(include_thoughts=True),
    )
    contents = [types.Content(role="user", parts=[types.Part.from_text(text="say hi in a file")])]
    chunks = list(client.models.generate_content_stream(model="gemini-x", contents=contents, config=config))
    parts = [p for c in chunks if c.candidates[0].content for p in c.candidates[0].content.parts]
    thoughts = "".join(p.text for p in parts if p.thought)
    assert thoughts.strip() == "Use the shell."
    kept = [p for p in parts if not p.thought]
    call = next(p for p in kept if p.function_call)
    assert call.thought_signature and call.function_call.args == {"command": "echo hi"}
    answer = types.Part.from_function_response(name="run_shell_command", response={"output": "hi"})
    contents += [types.Content(role="model", parts=kept), types.Content(role="user", parts=[answer])]
    r = client.models.generate_content(model="gemini-x", contents=contents, config=config)
    assert r.text.strip() == "done"

    call1, call2 = thinking_gateway.records(s.session_id)
    assert script.chats[1]["messages"][-2]["reasoning"].strip() == "Use the shell."
    sampled = call1.prompt_ids + call1.response_ids
    assert call2.prompt_ids[: len(sampled)] == sampled, "the reasoning must re-render from thoughtSignature"


def test_stream_without_alt_sse_is_a_json_array_through_the_gateway(gateway):
    s = gateway.create_session()
    with httpx.Client(timeout=60) as http:
        r = http.post(
            f"{s.base_url}/v1beta/models/gemini-x:streamGenerateContent",
            json={"contents": [{"role": "user", "parts": [{"text": "hi"}]}]},
        )
    assert r.status_code == 200 and r.headers["content-type"].startswith("application/json")
    items = r.json()
    assert "".join(
        p["text"] for i in items for p in i["candidates"][0].get("content", {}).get("parts", [])
    ) == ("Hello from the engine.")
    assert items[-1]["candidates"][0]["finishReason"] == "STOP"
