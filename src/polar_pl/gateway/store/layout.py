"""How a trace record is laid out in the store's `records` table.

Layout 2 (user_version 2): the token arrays of a record are blobs in columns of their own,
little-endian int32 (`prompt_ids`, `response_ids`, `rendered_prompt_ids`,
`response_policy_versions`) and float32 (`response_logprobs`, the engine's logprobs are float32
values); `data` holds the rest of the record as JSON, with those fields empty. A 50k-token prompt
is then 200 KB read in one piece and compared as an array, not 300 KB of JSON parsed into 50k
Python ints.

Layout 1 (stores written before): `data` holds the whole record as JSON and the blob columns are
missing (added, NULL, when a writer opens the store). Readers take both, row by row: a row whose
`prompt_ids` blob is NULL is read from its JSON.

Readers give token fields as lists (the record contract) or, with `packed=True`, as read-only
int32 / float32 arrays over the blobs (what the merge and the export use).
"""

from __future__ import annotations

import dataclasses
import sqlite3
from typing import Any

import numpy as np
import orjson

from polar_pl.gateway.store.packed import F32, I32, pack_f32, pack_i32
from polar_pl.gateway.store.records import TraceRecord

LAYOUT = 2
INT_COLUMNS = ("prompt_ids", "response_ids", "rendered_prompt_ids", "response_policy_versions")
TOKEN_COLUMNS = (*INT_COLUMNS, "response_logprobs")
_DTYPES = (*(I32 for _ in INT_COLUMNS), F32)
# The store's own reads (the merge, store/traces.py) map the file instead of copying each page
# through SQLite's cache: a session's blobs are most of what a read returns (bench/merge.py: the
# read of 10 M tokens took 0.06 s copied, 0.03 s mapped). Mapped pages count in the RSS (clean
# file pages, reclaimable): the read-only tools (export, viewer) do not map, their RSS stays flat.
MMAP_SIZE = 1 << 30
SCHEMA = f"""
CREATE TABLE IF NOT EXISTS records (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    session_id TEXT NOT NULL,
    call_index INTEGER NOT NULL,
    timestamp REAL NOT NULL,
    status TEXT NOT NULL,
    data BLOB NOT NULL,
    {", ".join(f"{c} BLOB" for c in TOKEN_COLUMNS)}
);
CREATE INDEX IF NOT EXISTS records_session ON records(session_id, call_index);
CREATE TABLE IF NOT EXISTS sessions (
    session_id TEXT PRIMARY KEY,
    token TEXT UNIQUE NOT NULL,
    data BLOB NOT NULL
);
"""
INSERT = (
    "INSERT INTO records(session_id, call_index, timestamp, status, data, "
    f"{', '.join(TOKEN_COLUMNS)}) VALUES (?,?,?,?,?,{','.join('?' * len(TOKEN_COLUMNS))})"
)
_EMPTY: dict[str, Any] = {
    "prompt_ids": [],
    "response_ids": [],
    "response_logprobs": [],
    "rendered_prompt_ids": None,
    "response_policy_versions": None,
}


def migrate(conn: sqlite3.Connection) -> None:
    """Bring a store (new, or of layout 1) to this layout: the blob columns, the user_version."""
    conn.executescript(SCHEMA)
    have = {row[1] for row in conn.execute("PRAGMA table_info(records)")}
    for col in TOKEN_COLUMNS:
        if col not in have:
            conn.execute(f"ALTER TABLE records ADD COLUMN {col} BLOB")
    if conn.execute("PRAGMA user_version").fetchone()[0] < LAYOUT:
        conn.execute(f"PRAGMA user_version={LAYOUT}")


def record_columns(conn: sqlite3.Connection) -> str:
    """The SELECT list `decode` takes, for this store's layout (a read-only reader cannot migrate)."""
    have = {row[1] for row in conn.execute("PRAGMA table_info(records)")}
    return ", ".join(["status", "data", *(c if c in have else "NULL" for c in TOKEN_COLUMNS)])


def encode(rec: TraceRecord, raw_body: bytes | None = None) -> tuple[Any, ...]:
    """The row values of a record after (session_id, call_index, timestamp): status, data, blobs.
    raw_body: the request as received, kept in place of the parsed one if that cannot be encoded."""
    # orjson serializes the dataclass directly: no asdict() deep copy of the (large) raw request
    slim = dataclasses.replace(rec, **_EMPTY)
    try:
        data = orjson.dumps(slim, option=orjson.OPT_SERIALIZE_NUMPY)
    except TypeError as exc:  # orjson parses 1,024 levels but encodes at most 254
        if raw_body is None:
            raise
        data = orjson.dumps(slim.with_raw_request(raw_body, str(exc)), option=orjson.OPT_SERIALIZE_NUMPY)
    rendered, versions = rec.rendered_prompt_ids, rec.response_policy_versions
    return (
        rec.status,
        data,
        pack_i32(rec.prompt_ids),
        pack_i32(rec.response_ids),
        None if rendered is None else pack_i32(rendered),
        None if versions is None else pack_i32(versions),
        pack_f32(rec.response_logprobs),
    )


def decode_dict(data: bytes, blobs: tuple[bytes | None, ...], packed: bool) -> dict[str, Any]:
    """The record's fields from its row: `data` and the TOKEN_COLUMNS blobs (all NULL: layout 1)."""
    d = orjson.loads(data)
    if blobs[0] is None:  # layout 1: the JSON has everything
        if packed:
            for col in TOKEN_COLUMNS:
                if d.get(col) is not None:
                    d[col] = np.asarray(d[col], dtype=F32 if col == "response_logprobs" else I32)
        return d
    for col, dtype, blob in zip(TOKEN_COLUMNS, _DTYPES, blobs, strict=True):
        if blob is None:
            d[col] = None
        elif packed:
            d[col] = np.frombuffer(blob, dtype=dtype)
        else:
            d[col] = np.frombuffer(blob, dtype=dtype).tolist()
    return d


def decode(row: tuple, packed: bool = False) -> TraceRecord:
    """A record from a row selected with `record_columns` (status, data, blobs...)."""
    return TraceRecord.from_owned_dict(decode_dict(row[1], row[2:], packed))
