"""Bad input at the door: bodies nested deeper than the gateway can encode again, bodies over the
size limit, an engine answering count_tokens with something that is not JSON, an engine whose
address must not reach the harness. Each gets a 4xx (or the engine's 502) in the provider's
shape, a record where it was a model call, and leaves no counter behind."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request

import anthropic
import httpx
import orjson
import pytest
from fastapi import FastAPI
from starlette.responses import PlainTextResponse

from polar_pl.gateway.handle import Gateway
from polar_pl.utils.serving import ServerThread, free_port

USER = [{"role": "user", "content": "hi"}]


def nested(levels: int) -> dict:
    """A JSON schema `levels` objects deep (each level: {"type", "properties": {"a": ...}})."""
    schema: dict = {"type": "string"}
    for _ in range(levels // 2):
        schema = {"type": "object", "properties": {"a": schema}}
    return schema


def post(url: str, body: dict, **kw) -> httpx.Response:
    # the stdlib encoder: orjson itself refuses to write what these tests send
    return httpx.post(
        url, content=json.dumps(body), headers={"content-type": "application/json"}, timeout=30, **kw
    )


def idle(gw: Gateway) -> bool:
    stats = gw.stats()
    return stats["gateway/in_flight"] == 0 and stats["gateway/inflight"] == 0


@pytest.mark.parametrize("stream", [False, True])
def test_tool_schema_nested_300_levels_is_400_with_a_record_and_no_leak(gateway, stream):
    """The issue's probe: such a request raised while the engine body was serialised, left
    `inflight` > 0 behind (engine_busy ~1.0 on an idle gateway, drain never returning) and no record."""
    s = gateway.create_session()
    tools = [{"type": "function", "function": {"name": "f", "parameters": nested(600)}}]
    r = post(
        f"{s.base_url}/v1/chat/completions",
        {"model": "m", "messages": USER, "tools": tools, "stream": stream},
    )
    assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error"
    assert "nested deeper than 128 levels" in r.json()["error"]["message"]
    assert idle(gateway)
    t0 = time.monotonic()
    gateway.pause("drain", timeout=5)
    assert time.monotonic() - t0 < 1
    gateway.resume()
    (rec,) = gateway.records(s.session_id)
    assert rec.status == "error" and orjson.loads(rec.raw_request["_unparsed_body"].encode()) == json.loads(
        json.dumps({"model": "m", "messages": USER, "tools": tools, "stream": stream})
    )


def test_deep_json_anywhere_in_any_api_is_400_in_its_shape(gateway):
    """Deep `metadata`, message content and tool arguments gave 500s or cut streams (~250 of
    2,500 fuzz calls per pass), with no record."""
    s = gateway.create_session()
    deep = nested(400)
    cases = [
        ("/v1/messages", {"model": "m", "max_tokens": 8, "messages": USER, "metadata": deep, "stream": True}),
        ("/v1/responses", {"model": "m", "input": [{"role": "user", "content": [deep]}]}),
        (
            "/v1beta/models/m:streamGenerateContent?alt=sse",
            {"contents": [{"parts": [{"functionCall": deep}]}]},
        ),
    ]
    shapes = []
    for path, body in cases:
        r = post(f"{s.base_url}{path}", body)
        assert r.status_code == 400, r.text
        shapes.append(r.json())
    assert shapes[0]["type"] == "error" and shapes[0]["error"]["type"] == "invalid_request_error"
    assert shapes[1]["error"]["type"] == "invalid_request_error"
    assert shapes[2]["error"]["status"] == "INVALID_ARGUMENT"
    assert [r.status for r in gateway.records(s.session_id)] == ["error"] * 3 and idle(gateway)


def test_a_deep_but_allowed_schema_is_served_and_recorded(gateway):
    s = gateway.create_session()
    schema = nested(120)
    with anthropic.Anthropic(base_url=s.base_url, api_key="x", max_retries=0) as client:
        client.messages.create(
            model="m", max_tokens=8, messages=USER, tools=[{"name": "f", "input_schema": schema}]
        )
    (rec,) = gateway.records(s.session_id)
    assert rec.status == "ok" and rec.raw_request["tools"][0]["input_schema"] == schema


def test_admin_session_with_deep_meta_is_400(admin):
    """It dropped the connection without an answer (the session row could not be encoded)."""
    r = admin.post("/admin/sessions", content=json.dumps({"task_id": "t", "meta": nested(600)}))
    assert r.status_code == 400 and "nested deeper" in r.json()["error"]
    assert admin.post("/admin/sessions", json={"meta": "not an object"}).status_code == 400
    assert admin.post("/admin/sessions", json={"meta": {"k": [1]}}).status_code == 200


def test_body_over_the_limit_is_413_in_shape_and_recorded(engine, tmp_path):
    with Gateway([engine.url], tmp_path / "t.db", max_body_bytes=4096, model="tiny") as gw:
        s = gw.create_session()
        big = {"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": "x" * 8000}]}
        r = httpx.post(f"{s.base_url}/v1/messages", json=big, timeout=30)
        assert r.status_code == 413 and r.json()["error"]["type"] == "request_too_large"

        def chunks():  # no content-length: refused while reading
            yield b'{"model": "m", "messages": [{"role": "user", "content": "'
            for _ in range(10):
                yield b"y" * 1000
            yield b'"}]}'

        r = httpx.post(f"{s.base_url}/v1/chat/completions", content=chunks(), timeout=30)
        assert r.status_code == 413 and r.json()["error"]["type"] == "invalid_request_error"
        assert [r.status for r in gw.records(s.session_id)] == ["error", "error"]
        r = httpx.post(f"{gw.url}/v1/messages", json=big, timeout=30)  # no token: 401 before reading
        assert r.status_code == 401 and r.json()["error"]["type"] == "authentication_error"
        with pytest.raises(ValueError, match="max_body_bytes"):
            Gateway([engine.url], tmp_path / "u.db", max_body_bytes=0)


def _bad_tokenize_engine() -> FastAPI:
    app = FastAPI()

    @app.get("/v1/models")
    async def models():
        return {"data": [{"id": "tiny"}]}

    @app.post("/tokenize")
    async def tokenize():
        return PlainTextResponse("<html>bad gateway</html>", status_code=200)

    return app


def test_count_tokens_on_a_non_json_engine_answer_is_502_in_shape(tmp_path):
    """It answered 400 "template cannot render": the engine's bad answer read as the harness's fault."""
    with ServerThread(_bad_tokenize_engine()) as eng, Gateway([eng.url], tmp_path / "t.db") as gw:
        s = gw.create_session()
        with pytest.raises(anthropic.APIStatusError) as exc:
            anthropic.Anthropic(base_url=s.base_url, api_key="x", max_retries=0).messages.count_tokens(
                model="m", messages=USER
            )
        assert exc.value.status_code == 502 and "not JSON" in exc.value.message


def test_engine_address_never_reaches_the_harness(tmp_path):
    port = free_port()
    with Gateway([f"http://127.0.0.1:{port}"], tmp_path / "t.db", model="tiny") as gw:
        s = gw.create_session()
        r = post(f"{s.base_url}/v1/chat/completions", {"model": "m", "messages": USER})
        assert r.status_code == 502 and str(port) not in r.text and "unreachable" in r.text
        (rec,) = gw.records(s.session_id)
        assert str(port) in rec.error  # the record keeps where it failed


def _messages_body(mib: int) -> bytes:
    content = b"x" * (mib << 20)
    return b'{"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": "' + content + b'"}]}'


def _urllib_error(url: str, data) -> urllib.error.HTTPError:
    """urllib sends `Connection: close` and writes the whole body before it reads any answer."""
    req = urllib.request.Request(url, data=data, headers={"content-type": "application/json"})
    with pytest.raises(urllib.error.HTTPError) as err:
        urllib.request.urlopen(req, timeout=60)
    return err.value


@pytest.mark.parametrize("mib", [64, 200])
def test_a_body_far_over_the_limit_gets_its_413_before_the_connection_closes(engine, tmp_path, mib):
    """A 64 MiB body (default limit 32 MiB) sent with urllib ended in a connection reset, not the
    413: the gateway answered without reading the body and closed a socket with unread bytes,
    which the kernel answers with RST while the client is still writing. 40 MiB got its 413 only
    because it fit in the loopback socket buffers (up to 32 MiB receive + 4 MiB send here)."""
    with Gateway([engine.url], tmp_path / "t.db", model="tiny") as gw:
        s = gw.create_session()
        body = _messages_body(mib)
        err = _urllib_error(f"{s.base_url}/v1/messages", body)
        assert err.code == 413 and json.loads(err.read())["error"]["type"] == "request_too_large"
        err = _urllib_error(f"{gw.url}/s/not-a-token/v1/messages", body)  # refused before reading
        assert err.code == 401 and json.loads(err.read())["error"]["type"] == "authentication_error"
        chunks = (body[i : i + (1 << 20)] for i in range(0, len(body), 1 << 20))  # no length: chunked
        err = _urllib_error(f"{s.base_url}/v1/chat/completions", chunks)
        assert err.code == 413 and json.loads(err.read())["error"]["type"] == "invalid_request_error"
        assert [r.status for r in gw.records(s.session_id)] == ["error", "error"]
