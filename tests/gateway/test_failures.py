"""Failures: engine errors, engine down, timeouts, broken streams, malformed requests, harnesses
that disconnect mid-stream. Each gets a provider-shaped answer and a trace record."""

from __future__ import annotations

import asyncio
import time

import anthropic
import httpx
import openai
import orjson
import pytest
from fastapi import FastAPI
from fastapi.responses import StreamingResponse

from polar_pl.gateway.handle import Gateway
from polar_pl.testing.scripted import Reply, serve_scripted
from polar_pl.utils.serving import ServerThread, free_port

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
MESSAGES = {"model": "m", "max_tokens": 16, "messages": [{"role": "user", "content": "hi"}]}


def _wait_for(pred, timeout=10.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(0.05)
    return False


def test_engine_5xx_is_502_openai_and_529_anthropic_and_recorded(gateway, script):
    script.fail = 500
    s = gateway.create_session()
    r = httpx.post(f"{s.base_url}/v1/chat/completions", json=CHAT, timeout=30)
    assert r.status_code == 502 and r.headers["retry-after"]
    assert r.json()["error"]["type"] == "server_error"
    with pytest.raises(anthropic.APIStatusError) as exc:
        anthropic.Anthropic(base_url=s.base_url, api_key="x", max_retries=0).messages.create(**MESSAGES)
    assert exc.value.status_code == 529
    assert exc.value.body["error"]["type"] == "overloaded_error"
    recs = gateway.records(s.session_id)
    assert [r.status for r in recs] == ["error", "error"]
    assert "scripted engine failure" in recs[0].error
    assert recs[0].normalized_request["messages"][0]["content"] == "hi"


def test_engine_down_is_502_in_shape(tmp_path):
    dead = f"http://127.0.0.1:{free_port()}"
    with Gateway([dead], tmp_path / "t.db", model="tiny") as gw:
        s = gw.create_session()
        with pytest.raises(openai.APIStatusError) as exc:
            openai.OpenAI(base_url=f"{s.base_url}/v1", api_key="x", max_retries=0).chat.completions.create(
                **CHAT
            )
        assert exc.value.status_code == 502
        assert "unreachable" in exc.value.message
        (rec,) = gw.records(s.session_id)
        assert rec.status == "error" and rec.prompt_ids == []


def _slow_engine(delay_before_headers: float = 0.0, chunks_then_cut: int | None = None) -> FastAPI:
    app = FastAPI()

    @app.get("/v1/models")
    async def models():
        return {"data": [{"id": "tiny"}]}

    @app.post("/v1/chat/completions")
    async def chat():
        await asyncio.sleep(delay_before_headers)

        async def gen():
            yield (
                b'data: {"id":"c1","choices":[{"index":0,"delta":{"role":"assistant","content":""}}],'
                b'"prompt_token_ids":[1,2,3]}\n\n'
            )
            for i in range(chunks_then_cut or 0):
                yield (
                    b"data: "
                    + orjson.dumps(
                        {
                            "id": "c1",
                            "choices": [
                                {
                                    "index": 0,
                                    "delta": {"content": f"t{i}"},
                                    "token_ids": [10 + i],
                                    "logprobs": {"content": [{"token": f"t{i}", "logprob": -0.5}]},
                                }
                            ],
                        }
                    )
                    + b"\n\n"
                )
            raise RuntimeError("engine crashed mid-stream")

        return StreamingResponse(gen(), media_type="text/event-stream")

    return app


def test_engine_timeout_is_504(tmp_path):
    with (
        ServerThread(_slow_engine(delay_before_headers=5.0)) as eng,
        Gateway([eng.url], tmp_path / "t.db", read_timeout=0.5) as gw,
    ):
        s = gw.create_session()
        r = httpx.post(f"{s.base_url}/v1/chat/completions", json=CHAT, timeout=30)
        assert r.status_code == 504 and r.json()["error"]["code"] == "timeout"
        (rec,) = gw.records(s.session_id)
        assert rec.status == "error" and "timed out" in rec.error


def test_stream_broken_mid_way_sends_error_event_and_keeps_partial(tmp_path):
    with (
        ServerThread(_slow_engine(chunks_then_cut=3), log_level="critical") as eng,
        Gateway([eng.url], tmp_path / "t.db") as gw,
    ):
        s = gw.create_session()
        with httpx.stream("POST", f"{s.base_url}/v1/chat/completions", json={**CHAT, "stream": True}) as r:
            assert r.status_code == 200
            events = [line for line in r.iter_lines() if line.startswith("data: ")]
        payloads = [orjson.loads(e[6:]) for e in events]
        assert [p["choices"][0]["delta"].get("content") for p in payloads[1:4]] == ["t0", "t1", "t2"]
        assert "error" in payloads[-1]
        (rec,) = gw.records(s.session_id)
        assert rec.status == "error" and rec.response_ids == [10, 11, 12]
        assert rec.response_logprobs == [-0.5, -0.5, -0.5] and rec.prompt_ids == [1, 2, 3]


@pytest.mark.parametrize("body", [b"{not json", b"[1, 2]", b'{"model": "m"}', b'{"messages": "x"}'])
def test_malformed_request_is_400_in_shape_never_500(gateway, body):
    s = gateway.create_session()
    r = httpx.post(
        f"{s.base_url}/v1/chat/completions", content=body, headers={"content-type": "application/json"}
    )
    assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error"
    r = httpx.post(f"{s.base_url}/v1/messages", content=body, headers={"content-type": "application/json"})
    assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error"
    assert r.json()["type"] == "error"
    recs = gateway.records(s.session_id)
    assert [rec.status for rec in recs] == ["error", "error"]
    try:  # the raw request is kept: parsed if it was a JSON object, else the bytes as sent
        expected = orjson.loads(body)
    except orjson.JSONDecodeError:
        expected = None
    if not isinstance(expected, dict):
        expected = {"_unparsed_body": body.decode()}
    assert recs[0].raw_request == expected


def test_disconnect_mid_stream_aborts_engine_and_records_partial(tiny_model_dir, tmp_path, script):
    script.queue.append(Reply("word " * 400))
    with (
        serve_scripted(script, model_dir=tiny_model_dir, token_delay=0.02) as eng,
        Gateway([eng.url], tmp_path / "t.db") as gw,
    ):
        s = gw.create_session()
        with httpx.stream("POST", f"{s.base_url}/v1/chat/completions", json={**CHAT, "stream": True}) as r:
            got = 0
            for line in r.iter_lines():
                got += line.startswith("data: ")
                if got == 5:
                    break
        assert _wait_for(lambda: gw.runtime.store.count(s.session_id) == 1)
        (rec,) = gw.records(s.session_id)
        assert rec.status == "aborted"
        assert 4 <= len(rec.response_ids) < 400 and len(rec.response_logprobs) == len(rec.response_ids)
        assert rec.raw_response.count("data: ") >= 5
        generated = eng.backend.stats.tokens_generated
        time.sleep(0.5)
        assert eng.backend.stats.tokens_generated - generated <= 2  # the engine stopped generating
        assert eng.backend.stats.tokens_generated < 400
