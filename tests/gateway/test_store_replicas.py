"""Durability of the trace store across restarts, and several engine replicas behind one gateway."""

from __future__ import annotations

import threading
from contextlib import ExitStack

import httpx
import openai
import pytest

from polar_pl.engine.server import create_app as create_engine_app
from polar_pl.gateway.handle import Gateway
from polar_pl.gateway.store.records import TraceRecord
from polar_pl.gateway.store.traces import TraceStore, read_records
from polar_pl.gateway.upstream.replicas import ReplicaPool
from polar_pl.testing.scripted import Reply, ScriptedBackend, serve_scripted
from polar_pl.utils.serving import ServerThread

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


def _call(base_url: str, **kw) -> None:
    openai.OpenAI(base_url=f"{base_url}/v1", api_key="x", max_retries=0).chat.completions.create(**CHAT, **kw)


def test_records_and_sessions_survive_a_restart(engine, tmp_path):
    path = tmp_path / "traces.db"
    with Gateway([engine.url], path) as gw:
        s = gw.create_session(task_id="t")
        _call(s.base_url)
        _call(s.base_url, stream=True)
    assert [r.call_index for r in read_records(path, s.session_id)] == [0, 1]
    with Gateway([engine.url], path) as gw:
        _call(f"{gw.url}/s/{s.token}")  # the token still works after the restart
        recs = gw.records(s.session_id)
        assert [r.call_index for r in recs] == [0, 1, 2]  # call indices continue, never reused
        assert all(r.status == "ok" and r.task_id == "t" and r.response_ids for r in recs)


def test_clean_shutdown_loses_no_record_under_concurrency(engine, tmp_path):
    path = tmp_path / "traces.db"
    gw = Gateway([engine.url], path).start()
    sessions = [gw.create_session() for _ in range(8)]
    threads = [
        threading.Thread(target=_call, args=(s.base_url,), kwargs={"stream": True}) for s in sessions * 3
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    gw.stop()
    assert len(read_records(path)) == 24
    store = TraceStore(path)
    try:
        assert sorted(r.call_index for r in store.records(sessions[0].session_id)) == [0, 1, 2]
        assert sum(1 for _ in store.iter_records(batch=5)) == 24
    finally:
        store.close()


def _engine(tiny_model_dir, script) -> tuple[ServerThread, ScriptedBackend]:
    backend = ScriptedBackend.from_model_dir(tiny_model_dir, script)
    return ServerThread(create_engine_app(backend)), backend


def test_sessions_stick_to_a_replica_and_spread_and_skip_a_dead_one(tiny_model_dir, tmp_path, script):
    engines = [_engine(tiny_model_dir, script) for _ in range(2)]
    with ExitStack() as stack:
        for srv, _ in engines:
            stack.enter_context(srv)
        gw = stack.enter_context(
            Gateway([srv.url for srv, _ in engines], tmp_path / "t.db", health_interval=0.2)
        )
        a, b = gw.create_session(), gw.create_session()
        for _ in range(3):
            _call(a.base_url)
            _call(b.base_url)
        up_a = {r.upstream for r in gw.records(a.session_id)}
        up_b = {r.upstream for r in gw.records(b.session_id)}
        assert len(up_a) == 1 and len(up_b) == 1 and up_a != up_b  # sticky, and spread over both
        assert {backend.stats.requests for _, backend in engines} == {3}
        # take a's replica down: its next calls move to the live one, nothing fails
        dead = next(srv for srv, _ in engines if srv.url in up_a)
        live = next(srv for srv, _ in engines if srv is not dead)
        dead.stop()
        _call(a.base_url)
        _call(a.base_url)
        recs = gw.records(a.session_id)
        assert [r.status for r in recs] == ["ok"] * 5
        assert {r.upstream for r in recs[3:]} == {live.url}
        health = httpx.get(f"{gw.url}/health").json()["replicas"]
        assert {h["url"]: h["healthy"] for h in health}[dead.url] is False
        c = gw.create_session()  # new sessions avoid the dead replica
        _call(c.base_url)
        assert gw.records(c.session_id)[0].upstream == live.url


def _record(i: int, session: str = "s") -> TraceRecord:
    return TraceRecord(
        session_id=session,
        call_index=i,
        timestamp=float(i),
        provider="openai_chat",
        raw_request={"messages": [{"role": "user", "content": "x" * 1000}]},
        raw_response="data: [DONE]\n\n",
        normalized_request={},
        prompt_ids=[1, 2],
        response_ids=[3],
        response_logprobs=[-0.5],
        finish_reason="stop",
        policy_version=0,
        latency_s=0.01,
        notes=("n",),
    )


def test_full_sync_store_group_commits_from_its_writer_thread(tmp_path):
    """synchronous=FULL commits on a dedicated thread (fsync off the event loop); close() flushes."""
    store = TraceStore(tmp_path / "t.db", synchronous="FULL")
    assert not store.inline
    futures = [store.append(_record(i)) for i in range(50)]
    store.close()
    assert all(f.done() and f.exception() is None for f in futures)
    recs = read_records(tmp_path / "t.db", "s")
    assert [r.call_index for r in recs] == list(range(50)) and recs[0].notes == ("n",)


def test_normal_sync_store_commits_inline_and_rejects_bad_levels(tmp_path):
    store = TraceStore(tmp_path / "t.db")
    assert store.inline
    fut = store.append(_record(0))
    assert fut.done() and store.count("s") == 1  # committed before append returned
    store.close()
    with pytest.raises(ValueError, match="synchronous"):
        TraceStore(tmp_path / "u.db", synchronous="SOMETIMES")


def test_stop_with_streams_in_flight_loses_no_record(tiny_model_dir, tmp_path, script):
    """Gateway.stop() while harnesses are mid-stream: every call still ends up in the store."""
    script.default = lambda chat: Reply("word " * 60)
    path = tmp_path / "t.db"
    with serve_scripted(script, model_dir=tiny_model_dir, token_delay=0.01) as eng:
        gw = Gateway([eng.url], path).start()
        sessions = [gw.create_session() for _ in range(6)]
        started = threading.Barrier(len(sessions) + 1)

        def stream(s) -> None:
            try:
                with httpx.stream(
                    "POST", f"{s.base_url}/v1/chat/completions", timeout=30, json={**CHAT, "stream": True}
                ) as r:
                    lines = r.iter_lines()
                    next(lines)
                    started.wait()
                    for _ in lines:
                        pass
            except httpx.HTTPError:
                pass

        threads = [threading.Thread(target=stream, args=(s,)) for s in sessions]
        for t in threads:
            t.start()
        started.wait()
        gw.stop()
        for t in threads:
            t.join()
    recs = read_records(path)
    assert sorted(r.session_id for r in recs) == sorted(s.session_id for s in sessions)
    assert all(r.status in ("ok", "aborted") and r.response_ids for r in recs)


def test_gateways_in_front_of_the_same_replicas_do_not_all_start_on_the_first():
    """With rollout=ray every worker has its own gateway: each sent its first session to replica 0
    (ties broke by list order), so one engine took every worker's first sessions."""
    firsts = {ReplicaPool(["http://a:1", "http://b:2"], client=None).pick("s").url for _ in range(40)}
    assert firsts == {"http://a:1", "http://b:2"}
