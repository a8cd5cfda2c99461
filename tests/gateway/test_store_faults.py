"""The trace store under faults: a full disk (a small tmpfs, filled to the last byte), a record
orjson cannot encode, and delivery marks with FULL sync.

With the store's disk full, streams were cut with no provider error event, non-stream calls got
`500 internal gateway error: OperationalError`, and the WAL checkpoint thread died for good (the
WAL then grew without bound once space was freed)."""

from __future__ import annotations

import errno
import logging
import os
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import anthropic
import httpx
import openai
import orjson
import pytest
from sse_grammar import parse_sse

from polar_pl.gateway.handle import Gateway
from polar_pl.gateway.store.records import TraceRecord
from polar_pl.gateway.store.traces import StoreUnavailable, TraceStore, read_records

USER = [{"role": "user", "content": "hi"}]


class SmallDisk:
    """A 8 MiB tmpfs: `fill()` takes every byte left, `free()` gives them back."""

    def __init__(self, path: Path):
        self.path = path
        self.filler = path / "filler"

    def fill(self) -> None:
        fd = os.open(self.filler, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
        try:
            for size in (1 << 20, 1 << 16, 1 << 12, 1 << 9, 1):
                try:
                    while True:
                        os.write(fd, b"\0" * size)
                except OSError as exc:
                    assert exc.errno == errno.ENOSPC
        finally:
            os.close(fd)

    def free(self) -> None:
        self.filler.unlink(missing_ok=True)


@pytest.fixture
def small_disk(tmp_path) -> Iterator[SmallDisk]:
    mnt = tmp_path / "disk"
    mnt.mkdir()
    if os.geteuid() != 0:
        pytest.skip("a full disk is simulated with a tmpfs mount (needs root)")
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs", str(mnt)], capture_output=True, check=False
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode().strip()}")
    try:
        yield SmallDisk(mnt)
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def _record(i: int, **kw) -> TraceRecord:
    fields = {
        "session_id": "s", "call_index": i, "timestamp": 0.0, "provider": "openai_chat",
        "raw_request": {"x": "y" * 2000}, "raw_response": "r" * 1000, "normalized_request": {},
        "prompt_ids": list(range(100)), "response_ids": [1], "response_logprobs": [0.0],
        "finish_reason": "stop", "policy_version": 0, "latency_s": 0.0,
    }  # fmt: skip
    return TraceRecord(**(fields | kw))


def _wait_for(pred, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(0.05)
    return False


def test_the_checkpointer_survives_a_full_disk_and_gives_the_wal_back(small_disk):
    store = TraceStore(small_disk.path / "t.db", checkpoint_interval=0.2)
    for i in range(50):  # in the WAL, not yet in the database file
        store.append(_record(i)).result()
    small_disk.fill()
    with pytest.raises(StoreUnavailable, match="disk is full"):
        store.append(_record(50)).result()
    assert store.errors == 1
    assert _wait_for(lambda: store.checkpoint_errors > 0)
    assert store._thread.is_alive()
    small_disk.free()
    wal = small_disk.path / "t.db-wal"
    assert _wait_for(lambda: wal.stat().st_size == 0), "the WAL was not checkpointed once space came back"
    store.append(_record(51)).result()
    assert [r.call_index for r in store.records("s")] == [*range(50), 51]
    store.close()


def _stream_events(url: str, body: dict) -> list:
    with httpx.stream("POST", url, json=body, timeout=30) as r:
        assert r.status_code == 200
        return parse_sse(r.read().decode())


def test_a_full_disk_is_answered_in_each_providers_retryable_shape(engine, small_disk):
    with Gateway([engine.url], small_disk.path / "t.db") as gw:
        s = gw.create_session()
        anth = anthropic.Anthropic(base_url=s.base_url, api_key="x", max_retries=0)
        anth.messages.create(model="m", max_tokens=8, messages=USER)
        small_disk.fill()
        with pytest.raises(anthropic.APIStatusError) as exc:
            anth.messages.create(model="m", max_tokens=8, messages=USER)
        assert exc.value.status_code == 529 and exc.value.body["error"]["type"] == "overloaded_error"
        assert exc.value.response.headers["retry-after"]
        with pytest.raises(openai.APIStatusError) as oexc:
            openai.OpenAI(base_url=f"{s.base_url}/v1", api_key="x", max_retries=0).chat.completions.create(
                model="m", messages=USER
            )
        assert oexc.value.status_code == 503 and oexc.value.response.headers["retry-after"]

        events = _stream_events(
            f"{s.base_url}/v1/messages", {"model": "m", "max_tokens": 8, "messages": USER, "stream": True}
        )
        assert events[-1][0] == "error" and events[-1][1]["error"]["type"] == "overloaded_error"
        events = _stream_events(
            f"{s.base_url}/v1/chat/completions", {"model": "m", "messages": USER, "stream": True}
        )
        assert "error" in events[-1][1] and not any(data == "[DONE]" for _, data in events)
        events = _stream_events(f"{s.base_url}/v1/responses", {"model": "m", "input": "hi", "stream": True})
        assert events[-1][0] == "response.failed"
        events = _stream_events(
            f"{s.base_url}/v1beta/models/m:streamGenerateContent?alt=sse",
            {"contents": [{"parts": [{"text": "hi"}]}]},
        )
        assert events[-1][1]["error"]["status"] == "UNAVAILABLE"
        r = httpx.post(
            f"{s.base_url}/v1beta/models/m:streamGenerateContent",
            json={"contents": [{"parts": [{"text": "hi"}]}]},
        )
        assert (
            orjson.loads(r.content)[-1]["error"]["status"] == "UNAVAILABLE"
        )  # a JSON array, still well-formed
        assert gw.stats()["gateway/store_errors"] == 7
        assert gw.stats()["gateway/in_flight"] == 0 and gw.stats()["gateway/inflight"] == 0

        small_disk.free()
        anth.messages.create(model="m", max_tokens=8, messages=USER)
        assert [r.status for r in gw.records(s.session_id)] == ["ok", "ok"]


def test_a_record_orjson_cannot_encode_keeps_the_raw_request_bytes(tmp_path):
    deep: dict = {}
    for _ in range(300):
        deep = {"a": deep}
    store = TraceStore(tmp_path / "t.db")
    store.append(_record(0, raw_request=deep), raw_body=b'{"a": "as sent"}').result()
    with pytest.raises(StoreUnavailable, match="cannot be encoded"):
        store.append(_record(1, raw_request=deep)).result()  # nothing to fall back on
    (rec,) = store.records("s")
    assert rec.raw_request == {"_unparsed_body": '{"a": "as sent"}'} and "raw bytes" in rec.notes[-1]
    assert rec.response_ids == [1]  # the tokens are kept
    store.close()


def test_a_pending_record_reads_undelivered_until_its_delivery_is_marked(tmp_path):
    """With FULL sync, kill -9 left 269 records `ok` whose responses never reached the client."""
    store = TraceStore(tmp_path / "t.db", synchronous="FULL")
    futures = [store.append(_record(i), pending=True) for i in range(3)]
    for f in futures:
        f.result(10)
    assert [r.status for r in read_records(tmp_path / "t.db")] == ["undelivered"] * 3  # as after kill -9
    store.mark_delivered("s", 0, True)
    store.mark_delivered("s", 1, False)
    store.close()
    recs = read_records(tmp_path / "t.db")
    assert [r.status for r in recs] == ["ok", "undelivered", "undelivered"]
    assert "not delivered" in recs[1].error


@pytest.mark.parametrize("stream", [False, True])
def test_full_sync_calls_are_ok_once_delivered(engine, tmp_path, stream):
    with Gateway([engine.url], tmp_path / "t.db", store_synchronous="FULL") as gw:
        s = gw.create_session()
        r = httpx.post(
            f"{s.base_url}/v1/chat/completions", json={"model": "m", "messages": USER, "stream": stream}
        )
        assert r.status_code == 200
        assert _wait_for(lambda: [x.status for x in gw.records(s.session_id)] == ["ok"])


def test_a_waiter_that_left_does_not_break_the_writer(tmp_path, monkeypatch, caplog):
    """A call cancelled while its record's commit was queued (FULL; its client left, or the gateway
    stopped) cancelled the store's future: the writer's set_result raised on it, logged a
    traceback and failed the other records of its batch as not durable."""
    store = TraceStore(tmp_path / "t.db", synchronous="FULL")
    gate, commit = threading.Event(), store._commit
    monkeypatch.setattr(store, "_commit", lambda *a: (gate.wait(10), commit(*a))[1])
    left, stayed = store.append(_record(0)), store.append(_record(1))
    left.cancel()
    gate.set()
    stayed.result(10)
    store.close()
    assert [r.call_index for r in read_records(tmp_path / "t.db")] == [0, 1]
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR], caplog.text
