"""The durable trace store: SQLite in WAL mode.

Every model call becomes one row holding the whole TraceRecord as JSON (nothing truncated).
`append` returns a future that resolves once the row is committed, so the core can hold back the
end of a response until its record is durable. How the commit happens depends on `synchronous`,
chosen by measurement (bench/gateway.py):

- NORMAL / OFF (default NORMAL): a commit only appends to the WAL file, no fsync (tens of
  microseconds), so it is done inline, in the caller's thread. Handing it to a thread cost more:
  two thread wake-ups per request and GIL hand-offs added ~3 ms to every response under load.
  WAL checkpoints (which do fsync) are taken off the write path: auto-checkpointing is off and a
  background thread checkpoints every second.
- FULL / EXTRA: every commit fsyncs, which must not block the event loop; a dedicated writer
  thread commits whatever is queued in one transaction (group commit: far fewer than one fsync
  per request under load).

Sessions live in the same database, so a restarted gateway still knows its sessions: each by the
hash of its token (records.hash_token), never the token (stores written before are rewritten on
open, with secure_delete so the old bytes are zeroed).
"""

from __future__ import annotations

import asyncio
import queue
import sqlite3
import threading
from collections.abc import Iterator
from concurrent.futures import Future
from dataclasses import asdict
from pathlib import Path
from typing import Any

import orjson

from polar_pl.gateway.store.records import SessionInfo, TraceRecord

_SCHEMA = """
CREATE TABLE IF NOT EXISTS records (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    session_id TEXT NOT NULL,
    call_index INTEGER NOT NULL,
    timestamp REAL NOT NULL,
    status TEXT NOT NULL,
    data BLOB NOT NULL
);
CREATE INDEX IF NOT EXISTS records_session ON records(session_id, call_index);
CREATE TABLE IF NOT EXISTS sessions (
    session_id TEXT PRIMARY KEY,
    token TEXT UNIQUE NOT NULL,
    data BLOB NOT NULL
);
"""

_STOP = object()


def _open(path: Path, synchronous: str) -> sqlite3.Connection:
    conn = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute(f"PRAGMA synchronous={synchronous}")
    conn.execute("PRAGMA busy_timeout=10000")
    conn.executescript(_SCHEMA)
    return conn


class TraceStore:
    """Append-only record store. `append` is thread- and loop-safe; reads use their own connection.

    synchronous: SQLite's `synchronous` pragma. NORMAL (default; WAL mode) makes a committed record
    survive a crash of the gateway process; FULL also survives power loss, at one fsync per group
    commit (about 8 ms on this kind of disk, added to the end of every response at low load).
    """

    def __init__(self, path: str | Path, *, synchronous: str = "NORMAL", checkpoint_interval: float = 1.0):
        synchronous = synchronous.upper()
        if synchronous not in {"OFF", "NORMAL", "FULL", "EXTRA"}:
            raise ValueError(f"store synchronous={synchronous!r}: allowed OFF, NORMAL, FULL, EXTRA")
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.inline = synchronous in ("OFF", "NORMAL")
        self._write_conn = _open(self.path, synchronous)
        _hash_legacy_tokens(self._write_conn)
        self._read_conn = _open(self.path, synchronous)
        self._read_lock = threading.Lock()
        self._write_lock = threading.Lock()
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._closed = False
        self._stop = threading.Event()
        if self.inline:
            self._write_conn.execute("PRAGMA wal_autocheckpoint=0")
            target, name = lambda: self._checkpointer(checkpoint_interval), "trace-store-checkpoint"
        else:
            target, name = self._writer, "trace-store-writer"
        self._thread = threading.Thread(target=target, name=name, daemon=True)
        self._thread.start()

    # ---- writing -------------------------------------------------------------------------
    def append(self, record: TraceRecord) -> Future:
        """Commit (inline) or queue (FULL) a record; the future resolves once it is committed."""
        if self._closed:
            raise RuntimeError("trace store is closed")
        fut: Future = Future()
        if self.inline:
            with self._write_lock:
                self._commit([(record, fut)])
        else:
            self._queue.put((record, fut))
        return fut

    def _checkpointer(self, interval: float) -> None:
        conn = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
        try:
            while not self._stop.wait(interval):
                conn.execute("PRAGMA wal_checkpoint(PASSIVE)")
        finally:
            conn.close()

    async def append_async(self, record: TraceRecord) -> None:
        """Append and wait for the commit without blocking the event loop."""
        await asyncio.wrap_future(self.append(record))

    def put_session(self, info: SessionInfo) -> None:
        data = orjson.dumps(asdict(info))
        with self._read_lock:
            self._read_conn.execute(
                "INSERT OR REPLACE INTO sessions(session_id, token, data) VALUES (?, ?, ?)",
                (info.session_id, info.token_hash, data),
            )

    def _writer(self) -> None:
        while True:
            item = self._queue.get()
            batch = [item]
            while True:  # drain what is queued: one transaction, one fsync for all of it
                try:
                    batch.append(self._queue.get_nowait())
                except queue.Empty:
                    break
            stop = any(it is _STOP for it in batch)
            batch = [it for it in batch if it is not _STOP]
            if batch:
                self._commit(batch)
            if stop:
                return

    def _commit(self, batch: list[tuple[TraceRecord, Future]]) -> None:
        rows, waiters = [], []
        for rec, fut in batch:
            try:
                # orjson serializes the dataclass directly: same JSON as to_dict(), without
                # asdict()'s deep copy of the (possibly 100 KB) raw request
                data = orjson.dumps(rec)
            except orjson.JSONEncodeError as exc:  # a record that cannot be serialized fails alone
                fut.set_exception(exc)
                continue
            rows.append((rec.session_id, rec.call_index, rec.timestamp, rec.status, data))
            waiters.append(fut)
        try:
            conn = self._write_conn
            conn.execute("BEGIN")
            conn.executemany(
                "INSERT INTO records(session_id, call_index, timestamp, status, data) VALUES (?,?,?,?,?)",
                rows,
            )
            conn.execute("COMMIT")
        except sqlite3.Error as exc:  # every waiter learns its record is not durable
            if self._write_conn.in_transaction:
                self._write_conn.execute("ROLLBACK")
            for fut in waiters:
                fut.set_exception(exc)
            return
        for fut in waiters:
            fut.set_result(None)

    def close(self) -> None:
        """Flush everything queued (FULL), checkpoint, stop the thread. Idempotent."""
        if self._closed:
            return
        self._closed = True
        self._stop.set()
        if not self.inline:
            self._queue.put(_STOP)
        self._thread.join()
        with self._write_lock:
            self._write_conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            self._write_conn.close()
        self._read_conn.close()

    # ---- reading -------------------------------------------------------------------------
    def _rows(self, sql: str, args: tuple = ()) -> list[tuple]:
        with self._read_lock:
            return self._read_conn.execute(sql, args).fetchall()

    def records(self, session_id: str) -> list[TraceRecord]:
        rows = self._rows(
            "SELECT data FROM records WHERE session_id=? ORDER BY call_index, id", (session_id,)
        )
        return [TraceRecord.from_dict(orjson.loads(r[0])) for r in rows]

    def iter_records(self, batch: int = 256) -> Iterator[TraceRecord]:
        """Every record in write order, read in pages so a large store is not loaded at once."""
        last = 0
        while True:
            rows = self._rows("SELECT id, data FROM records WHERE id>? ORDER BY id LIMIT ?", (last, batch))
            if not rows:
                return
            for rid, data in rows:
                last = rid
                yield TraceRecord.from_dict(orjson.loads(data))

    def count(self, session_id: str | None = None) -> int:
        if session_id is None:
            return self._rows("SELECT COUNT(*) FROM records")[0][0]
        return self._rows("SELECT COUNT(*) FROM records WHERE session_id=?", (session_id,))[0][0]

    def next_call_index(self, session_id: str) -> int:
        row = self._rows("SELECT MAX(call_index) FROM records WHERE session_id=?", (session_id,))[0][0]
        return 0 if row is None else row + 1

    def sessions(self) -> list[SessionInfo]:
        out = []
        for (data,) in self._rows("SELECT data FROM sessions"):
            d: dict[str, Any] = orjson.loads(data)
            out.append(SessionInfo.from_dict(d))
        return out


def _hash_legacy_tokens(conn: sqlite3.Connection) -> None:
    """Replace the plain session tokens of an older store by their hashes, zeroing the old bytes."""
    rows = conn.execute("SELECT session_id, data FROM sessions WHERE token NOT LIKE 'sha256:%'").fetchall()
    if not rows:
        return
    conn.execute("PRAGMA secure_delete=ON")
    conn.execute("BEGIN")
    for session_id, data in rows:
        info = SessionInfo.from_dict(orjson.loads(data))
        conn.execute(
            "UPDATE sessions SET token=?, data=? WHERE session_id=?",
            (info.token_hash, orjson.dumps(asdict(info)), session_id),
        )
    conn.execute("COMMIT")
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")  # the WAL held the old pages too


def _read_only(path: str | Path) -> sqlite3.Connection:
    """A read-only connection: in WAL mode it never blocks the gateway writing the same file."""
    if not Path(path).exists():
        raise FileNotFoundError(f"no trace store at {path}")
    conn = sqlite3.connect(f"file:{Path(path)}?mode=ro", uri=True)
    conn.execute("PRAGMA busy_timeout=10000")
    return conn


def read_sessions(path: str | Path) -> list[SessionInfo]:
    """Every registered session of a store file, oldest first, read-only (for tools and viewers)."""
    conn = _read_only(path)
    try:
        rows = conn.execute("SELECT data FROM sessions ORDER BY rowid").fetchall()
    finally:
        conn.close()
    return [SessionInfo.from_dict(orjson.loads(r[0])) for r in rows]


def read_records(path: str | Path, session_id: str | None = None) -> list[TraceRecord]:
    """Read records from a store file without starting a writer (for tools and trainers)."""
    conn = _read_only(path)
    try:
        if session_id is None:
            rows = conn.execute("SELECT data FROM records ORDER BY id").fetchall()
        else:
            rows = conn.execute(
                "SELECT data FROM records WHERE session_id=? ORDER BY call_index, id", (session_id,)
            ).fetchall()
    finally:
        conn.close()
    return [TraceRecord.from_dict(orjson.loads(r[0])) for r in rows]
