"""The store's layout 2 (token arrays as int32 / float32 blobs, JSON for the rest) and the stores
written before it (tests/gateway/data/store_layout1.db: written by the all-JSON store code)."""

from __future__ import annotations

import json
import shutil
import sqlite3
from pathlib import Path

import numpy as np
import pytest

from polar_pl.gateway.store.records import TraceRecord
from polar_pl.gateway.store.traces import TraceReader, TraceStore, read_records, read_sessions

DATA = Path(__file__).parent / "data"
TOKEN_FIELDS = (
    "prompt_ids",
    "response_ids",
    "response_logprobs",
    "rendered_prompt_ids",
    "response_policy_versions",
)


@pytest.fixture
def old_store(tmp_path) -> Path:
    path = tmp_path / "old.db"
    shutil.copy(DATA / "store_layout1.db", path)
    return path


def expected() -> list[TraceRecord]:
    return [TraceRecord.from_dict(d) for d in json.loads((DATA / "store_layout1.json").read_text())]


def test_a_store_of_the_old_layout_reads_as_written(old_store) -> None:
    """Read-only (no migration: a reader cannot write), as lists and packed."""
    assert read_records(old_store) == expected()
    assert [s.session_id for s in read_sessions(old_store)] == ["sess-old"]
    with TraceReader(old_store) as reader:
        assert reader.session_ids() == ["sess-old", "sess-side"]
        for got, want in zip(reader.records(packed=True), expected(), strict=True):
            assert isinstance(got.prompt_ids, np.ndarray) and got.prompt_ids.dtype == np.int32
            assert got.prompt_ids.tolist() == want.prompt_ids
            assert got.response_logprobs.tolist() == want.response_logprobs
            assert (got.rendered_prompt_ids is None) == (want.rendered_prompt_ids is None)


def test_a_writer_migrates_the_old_store_and_both_layouts_read_back(old_store) -> None:
    store = TraceStore(old_store)
    new = TraceRecord.from_dict(
        expected()[1].to_dict() | {"call_index": 3, "prompt_ids": list(range(5000)), "response_ids": [9, 2]}
    )
    store.append(new).result()
    assert store.records("sess-old") == [*expected()[:3], new]
    store.close()
    conn = sqlite3.connect(old_store)
    assert conn.execute("PRAGMA user_version").fetchone()[0] == 2
    old_row, new_row = conn.execute(
        "SELECT data, prompt_ids, response_logprobs FROM records WHERE session_id='sess-old' AND call_index IN (1, 3)"
    ).fetchall()
    assert old_row[1] is None and json.loads(old_row[0])["prompt_ids"]  # old rows stay as written
    data, blob, logprobs = new_row
    assert len(blob) == 4 * 5000 and np.frombuffer(blob, "<i4").tolist() == list(range(5000))
    assert np.frombuffer(logprobs, "<f4").tolist() == [-1.5, -0.0625]
    assert all(json.loads(data)[f] in ([], None) for f in TOKEN_FIELDS)  # the ids are in the blobs only
    assert read_records(old_store, "sess-old") == [*expected()[:3], new]


def test_export_reads_an_old_store(old_store, tmp_path) -> None:
    from polar_pl.cli import main
    from polar_pl.trajectory.traces_cli import read_rows

    out = tmp_path / "rows.jsonl"
    assert main(["traces", "export", "--store", str(old_store), "--out", str(out)]) == 0
    rows = read_rows(out)
    assert [r.session_id for r in rows] == ["sess-old", "sess-side"]
    assert rows[0].input_ids == expected()[1].prompt_ids + expected()[1].response_ids


def test_sessions_registered_while_records_are_read_from_other_threads(tmp_path) -> None:
    """`database is locked` from put_session with 16 sessions starting at once: reading a session's
    records asked the shared read connection for its columns outside the connection's lock."""
    import dataclasses
    import threading

    from polar_pl.gateway.store.records import SessionInfo

    store = TraceStore(tmp_path / "t.db", synchronous="FULL")
    errors: list[BaseException] = []
    rec = expected()[0]

    def work(k: int) -> None:
        try:
            for i in range(60):
                store.put_session(SessionInfo(session_id=f"s{k}-{i}", token_hash=f"sha256:{k}-{i}"))
                store.append(dataclasses.replace(rec, session_id=f"s{k}-{i}", call_index=0))
                store.records(f"s{k}-{i}")
                store.records(f"s{k}-{i - 1}")
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(k,)) for k in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    store.close()
    assert not errors, errors[:3]
    assert len(read_sessions(tmp_path / "t.db")) == 16 * 60
