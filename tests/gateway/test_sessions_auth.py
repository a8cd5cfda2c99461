"""Admin routes and session auth: unknown, missing or deleted tokens get 401 in the provider's
error shape and nothing is recorded; the admin token guards the admin routes."""

from __future__ import annotations

import anthropic
import httpx
import openai
import pytest

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
MESSAGES = {"model": "m", "max_tokens": 16, "messages": [{"role": "user", "content": "hi"}]}


def test_admin_session_lifecycle(gateway, admin):
    r = admin.post(
        "/admin/sessions",
        json={"task_id": "t", "group_id": "g", "harness": "claude_code", "rollout_id": "r1"},
    )
    assert r.status_code == 200
    body = r.json()
    assert set(body) == {"session_id", "token", "base_url"}
    assert body["base_url"] == f"{gateway.url}/s/{body['token']}"
    sid = body["session_id"]
    info = admin.get(f"/admin/sessions/{sid}").json()
    assert (info["task_id"], info["group_id"], info["harness"], info["rollout_id"]) == (
        "t",
        "g",
        "claude_code",
        "r1",
    )
    assert "token" not in info and info["calls"] == 0
    httpx.post(f"{body['base_url']}/v1/chat/completions", json=CHAT, timeout=30).raise_for_status()
    records = admin.get(f"/admin/sessions/{sid}/records").json()
    assert len(records) == 1 and records[0]["session_id"] == sid and records[0]["rollout_id"] == "r1"
    assert records[0]["prompt_ids"] and records[0]["status"] == "ok"
    assert admin.delete(f"/admin/sessions/{sid}").json() == {"session_id": sid, "deleted": True}
    assert admin.get(f"/admin/sessions/{sid}").json()["deleted"] is True
    assert admin.get("/admin/sessions/nope").status_code == 404
    stats = admin.get("/admin/stats").json()
    assert stats["gateway/calls"] == 1 and stats["gateway/status_ok"] == 1
    assert stats["gateway/latency_ms_p99"] > 0 and stats["gateway/response_tokens"] > 0


def test_admin_routes_need_the_admin_token(gateway):
    for headers in ({}, {"authorization": "Bearer wrong"}):
        assert httpx.post(f"{gateway.url}/admin/sessions", json={}, headers=headers).status_code == 401
        assert httpx.get(f"{gateway.url}/admin/sessions", headers=headers).status_code == 401
    # Every admin route, not just these two, sits behind the one dependency (it was eight copies).
    from polar_pl.gateway.http.admin import admin as admin_router

    for route in admin_router.routes:
        for method in route.methods:
            path = route.path.replace("{session_id}", "s1")
            r = httpx.request(method, f"{gateway.url}{path}", headers={"authorization": "Bearer wrong"})
            assert r.status_code == 401 and "admin token required" in r.json()["error"], (method, path)


@pytest.mark.parametrize("case", ["wrong", "missing", "deleted"])
def test_bad_token_is_401_in_openai_shape_and_unrecorded(gateway, case):
    s = gateway.create_session()
    if case == "deleted":
        gateway.delete_session(s.session_id)
    key = {"wrong": "plr-guessed", "missing": "", "deleted": s.token}[case]
    client = openai.OpenAI(base_url=f"{gateway.url}/v1", api_key=key or "x", max_retries=0)
    if case == "missing":
        r = httpx.post(f"{gateway.url}/v1/chat/completions", json=CHAT)
        assert r.status_code == 401
        assert r.json()["error"]["code"] == "invalid_api_key"
    else:
        with pytest.raises(openai.AuthenticationError):
            client.chat.completions.create(**CHAT)
    assert gateway.runtime.store.count() == 0


def test_bad_token_is_401_in_anthropic_shape(gateway):
    client = anthropic.Anthropic(base_url=gateway.url, api_key="plr-guessed", max_retries=0)
    with pytest.raises(anthropic.AuthenticationError) as exc:
        client.messages.create(**MESSAGES)
    assert exc.value.body["error"]["type"] == "authentication_error"
    r = httpx.post(f"{gateway.url}/s/plr-guessed/v1/messages", json=MESSAGES)
    assert r.status_code == 401 and r.json()["type"] == "error"
    assert gateway.runtime.store.count() == 0


def test_bad_token_is_401_in_google_shape(gateway):
    r = httpx.post(
        f"{gateway.url}/v1beta/models/g:generateContent?key=nope",
        json={"contents": [{"role": "user", "parts": [{"text": "hi"}]}]},
    )
    assert r.status_code == 401
    assert r.json()["error"]["code"] == 401
    assert gateway.runtime.store.count() == 0


def test_token_accepted_in_every_key_position(gateway):
    s = gateway.create_session()
    url = gateway.url
    chat = f"{url}/v1/chat/completions"
    assert httpx.post(chat, json=CHAT, headers={"authorization": f"Bearer {s.token}"}).status_code == 200
    assert httpx.post(f"{url}/v1/messages", json=MESSAGES, headers={"x-api-key": s.token}).status_code == 200
    google = {"contents": [{"role": "user", "parts": [{"text": "hi"}]}]}
    assert (
        httpx.post(
            f"{url}/v1beta/models/g:generateContent", json=google, headers={"x-goog-api-key": s.token}
        ).status_code
        == 200
    )
    assert httpx.post(f"{url}/v1beta/models/g:generateContent?key={s.token}", json=google).status_code == 200
    assert len(gateway.records(s.session_id)) == 4


def test_probes_and_models(gateway):
    assert httpx.head(f"{gateway.url}/").status_code == 200
    assert httpx.head(f"{gateway.url}/api/hello").status_code == 200
    assert httpx.get(f"{gateway.url}/v1/models").json()["data"][0]["object"] == "model"
    anth = httpx.get(f"{gateway.url}/v1/models", headers={"anthropic-version": "2023-06-01"}).json()
    assert anth["data"][0]["type"] == "model"
    assert httpx.get(f"{gateway.url}/v1beta/models").json()["models"][0]["name"].startswith("models/")
