"""Session tokens are kept hashed: the trace store held them in plain text, so whoever could read
the file (a sandbox under the old bwrap, a copied run directory) could act as any live session."""

from __future__ import annotations

import sqlite3
import uuid

import httpx
import orjson

from polar_pl.gateway.handle import Gateway
from polar_pl.gateway.store.records import hash_token
from polar_pl.gateway.store.traces import read_sessions

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}


def _bytes(path) -> bytes:
    return b"".join(p.read_bytes() for p in path.parent.glob(path.name + "*"))  # db, -wal, -shm


def test_store_keeps_a_hash_and_the_handle_the_token(engine, tmp_path):
    path = tmp_path / "traces.db"
    with Gateway([engine.url], path) as gw:
        s = gw.create_session(task_id="t")
        httpx.post(f"{s.base_url}/v1/chat/completions", json=CHAT, timeout=30).raise_for_status()
        auth = {"authorization": f"Bearer {gw.admin_token}"}
        listed = httpx.get(f"{gw.url}/admin/sessions", headers=auth, timeout=30).text
        assert s.token not in listed and "token" not in listed
    assert s.token.encode() not in _bytes(path)
    (info,) = read_sessions(path)
    assert info.token_hash == hash_token(s.token) and not hasattr(info, "token")


def test_a_store_with_plain_tokens_still_opens_and_loses_them(engine, tmp_path):
    path = tmp_path / "old.db"
    token = f"plr-{uuid.uuid4().hex}"
    old = {"session_id": "sess-old", "token": token, "task_id": "t", "group_id": None, "rollout_id": None,
           "harness": None, "created": 1.0, "deleted": False, "meta": {}}  # fmt: skip
    conn = sqlite3.connect(path)
    conn.executescript(
        "CREATE TABLE sessions (session_id TEXT PRIMARY KEY, token TEXT UNIQUE NOT NULL, data BLOB NOT NULL);"
    )
    conn.execute("INSERT INTO sessions VALUES (?, ?, ?)", ("sess-old", token, orjson.dumps(old)))
    conn.commit()
    conn.close()
    assert read_sessions(path)[0].token_hash == hash_token(token)  # read-only tools read it too
    with Gateway([engine.url], path) as gw:
        r = httpx.post(f"{gw.url}/s/{token}/v1/chat/completions", json=CHAT, timeout=30)
        assert r.status_code == 200  # the harness's token still works
        assert [rec.session_id for rec in gw.records("sess-old")] == ["sess-old"]
    assert token.encode() not in _bytes(path)
