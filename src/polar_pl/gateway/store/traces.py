"""The durable trace store: SQLite in WAL mode.

Every model call becomes one row: its token ids and logprobs as packed arrays, the rest of the
TraceRecord as JSON (nothing truncated; store/layout.py, which also reads stores of the older
all-JSON layout).
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

Faults: a commit that fails (disk full, I/O error) fails its waiters with `StoreUnavailable` and
is counted (`errors`); the checkpointer counts its own failures and retries on its next tick,
truncating the WAL once it succeeds again. A record that orjson cannot encode (JSON nested deeper
than its 254 levels) is kept with the raw request bytes in place of the parsed request.
With FULL / EXTRA an ok record can be appended `pending`: its status column reads "pending" until
`mark_delivered`, and readers report a pending record as "undelivered" (the gateway died between
the commit and the harness getting the response: no phantom ok records after kill -9).
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import logging
import operator
import os
import queue
import sqlite3
import threading
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import Future, InvalidStateError
from dataclasses import asdict
from pathlib import Path
from typing import Any, Self

import orjson
from prometheus_client import Histogram

from polar_pl.gateway.store import layout
from polar_pl.gateway.store.records import SessionInfo, TraceRecord

_STOP = object()
log = logging.getLogger(__name__)
UNDELIVERED = "undelivered"
_UNDELIVERED_NOTE = "response not delivered: the gateway stopped or the harness left after the commit"
WRITE_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0, 5.0)


class StoreUnavailable(RuntimeError):
    """A record could not be committed (disk full, I/O error, store closed)."""


def _settle(fut: Future, exc: BaseException | None = None) -> None:
    """Tell a record's waiter how its commit went. A waiter that left (its call was cancelled:
    the client went away, the gateway stopped) cancelled its future: it is not told, and the
    writer goes on with the rest of its batch."""
    with contextlib.suppress(InvalidStateError):
        if exc is None:
            fut.set_result(None)
        else:
            fut.set_exception(exc)


def _create_private(path: Path) -> None:
    """Create the store file readable by its owner only (it holds every prompt and answer), before
    SQLite would create it under the umask (0644); SQLite gives its -wal and -shm files the mode of
    the database file. An existing store keeps the mode it has."""
    with contextlib.suppress(FileExistsError):
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))


def _open(path: Path, synchronous: str) -> sqlite3.Connection:
    conn = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute(f"PRAGMA synchronous={synchronous}")
    conn.execute("PRAGMA busy_timeout=10000")
    layout.migrate(conn)
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
        _create_private(self.path)
        self.inline = synchronous in ("OFF", "NORMAL")
        self._write_conn = _open(self.path, synchronous)
        _hash_legacy_tokens(self._write_conn)
        self._read_conn = _open(self.path, synchronous)
        self._read_conn.execute(f"PRAGMA mmap_size={layout.MMAP_SIZE}")
        # once, here: the connection is shared by threads and used only under _read_lock after this
        self._cols = layout.record_columns(self._read_conn)
        self._read_lock = threading.Lock()
        self._write_lock = threading.Lock()
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._closed = False
        self.errors = 0  # records that could not be committed
        self.checkpoint_errors = 0
        # not registered: the gateway's metrics collector yields it into its own registry
        self.write_seconds = Histogram(
            "polar_gateway_store_write_seconds",
            "Time of one trace-store commit (one record inline; FULL: the writer's batch)",
            buckets=WRITE_BUCKETS,
            registry=None,
        )
        self._stop = threading.Event()
        if self.inline:
            self._write_conn.execute("PRAGMA wal_autocheckpoint=0")
            target, name = lambda: self._checkpointer(checkpoint_interval), "trace-store-checkpoint"
        else:
            target, name = self._writer, "trace-store-writer"
        self._thread = threading.Thread(target=target, name=name, daemon=True)
        self._thread.start()

    # ---- writing -------------------------------------------------------------------------
    def append(self, record: TraceRecord, *, raw_body: bytes | None = None, pending: bool = False) -> Future:
        """Commit (inline) or queue (FULL) a record; the future resolves once it is committed, or
        fails with StoreUnavailable. raw_body: the request as received, kept in place of the
        parsed one if the record cannot be encoded. pending: see the module docstring (FULL only)."""
        if self._closed:
            raise StoreUnavailable("trace store is closed")
        fut: Future = Future()
        item = (record, fut, raw_body, pending and not self.inline)
        if self.inline:
            with self._write_lock:
                self._commit([item])
        else:
            self._queue.put(item)
        return fut

    @property
    def backlog(self) -> int:
        """Records and delivery marks queued for the writer thread (FULL / EXTRA; inline: 0)."""
        return self._queue.qsize()

    def mark_delivered(self, session_id: str, call_index: int, delivered: bool) -> None:
        """Settle a pending record: its response reached the server (ok) or did not (undelivered)."""
        if not self._closed and not self.inline:
            self._queue.put((session_id, call_index, "ok" if delivered else UNDELIVERED))

    def _checkpointer(self, interval: float) -> None:
        conn = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
        failing = False
        try:
            while not self._stop.wait(interval):
                try:
                    # after a failure (disk full) the WAL has grown: give the space back once it works
                    conn.execute(f"PRAGMA wal_checkpoint({'TRUNCATE' if failing else 'PASSIVE'})")
                    failing = False
                except sqlite3.Error as exc:  # retried on the next tick: the WAL must not grow for good
                    if not failing:
                        log.warning("trace store checkpoint failed (retrying every %.1fs): %s", interval, exc)
                    self.checkpoint_errors += 1
                    failing = True
        finally:
            conn.close()

    def put_session(self, info: SessionInfo) -> None:
        """Raises StoreUnavailable when the row cannot be written (disk full)."""
        data = orjson.dumps(asdict(info))
        try:
            with self._read_lock:
                self._read_conn.execute(
                    "INSERT OR REPLACE INTO sessions(session_id, token, data) VALUES (?, ?, ?)",
                    (info.session_id, info.token_hash, data),
                )
        except sqlite3.Error as exc:
            self.errors += 1
            raise StoreUnavailable(f"trace store write failed: {exc}") from exc

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
            records = [it for it in batch if it is not _STOP and len(it) == 4]
            marks = [it for it in batch if it is not _STOP and len(it) == 3]
            try:
                self._commit(records, marks)
            except Exception as exc:
                log.exception("trace store writer")
                for _, fut, _, _ in records:
                    _settle(fut, StoreUnavailable(f"trace store writer failed: {exc!r}"))
            if stop:
                return

    def _commit(self, batch: list[tuple], marks: Sequence[tuple[str, int, str]] = ()) -> None:
        """One transaction: the records (each waiter learns the outcome) and delivery marks."""
        rows, waiters = [], []
        for rec, fut, raw_body, pending in batch:
            try:
                values = layout.encode(rec, raw_body)
            except (TypeError, ValueError) as exc:  # a record that cannot be serialized fails alone
                self.errors += 1
                _settle(fut, StoreUnavailable(f"record cannot be encoded: {exc}"))
                continue
            status = "pending" if pending else rec.status
            rows.append((rec.session_id, rec.call_index, rec.timestamp, status, *values[1:]))
            waiters.append(fut)
        conn = self._write_conn
        t0 = time.perf_counter()
        try:
            # the inline commit of one call: one statement, its own transaction (not four)
            if len(rows) == 1 and not marks:
                conn.execute(layout.INSERT, rows[0])
            else:
                conn.execute("BEGIN")
                conn.executemany(layout.INSERT, rows)
                if marks:
                    conn.executemany(
                        "UPDATE records SET status=? WHERE session_id=? AND call_index=? AND status='pending'",
                        [(status, sid, idx) for sid, idx, status in marks],
                    )
                conn.execute("COMMIT")
        except sqlite3.Error as exc:  # every waiter learns its record is not durable
            with contextlib.suppress(sqlite3.Error):
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
            self.errors += len(waiters)
            err = StoreUnavailable(f"trace store write failed: {exc}")
            for fut in waiters:
                _settle(fut, err)
            return
        finally:
            self.write_seconds.observe(time.perf_counter() - t0)
        for fut in waiters:
            _settle(fut)

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
            try:
                self._write_conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            except sqlite3.Error as exc:  # the WAL keeps every commit: the next open checkpoints it
                log.warning("trace store: final checkpoint failed: %s", exc)
            self._write_conn.close()
        self._read_conn.close()

    # ---- reading -------------------------------------------------------------------------
    def _rows(self, sql: str, args: tuple = ()) -> list[tuple]:
        with self._read_lock:
            return self._read_conn.execute(sql, args).fetchall()

    def records(self, session_id: str, *, packed: bool = False) -> list[TraceRecord]:
        """A session's records in call order (packed: token fields as arrays, store/layout.py)."""
        rows = self._rows(
            f"SELECT {self._cols} FROM records WHERE session_id=? ORDER BY call_index, id",
            (session_id,),
        )
        return [_decode(r, packed) for r in rows]

    def iter_records(self, batch: int = 256, *, packed: bool = False) -> Iterator[TraceRecord]:
        """Every record in write order, read in pages so a large store is not loaded at once."""
        last = 0
        cols = self._cols
        while True:
            rows = self._rows(f"SELECT id, {cols} FROM records WHERE id>? ORDER BY id LIMIT ?", (last, batch))
            if not rows:
                return
            for row in rows:
                last = row[0]
                yield _decode(row[1:], packed)

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


def _decode(row: tuple, packed: bool = False) -> TraceRecord:
    """A record from a row selected with `layout.record_columns` (status first): a pending one is
    reported undelivered."""
    rec = layout.decode(row, packed)
    if row[0] in ("pending", UNDELIVERED) and rec.status == "ok":
        return dataclasses.replace(rec, status=UNDELIVERED, error=_UNDELIVERED_NOTE)
    return rec


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


class TraceReader:
    """A store file read without a writer (tools, the viewer, the export), either layout: a
    read-only connection, so a gateway writing the same file is never blocked. Use as a context
    manager. packed=True gives token fields as arrays (store/layout.py)."""

    def __init__(self, path: str | Path) -> None:
        self._conn = _read_only(path)
        self._cols = layout.record_columns(self._conn)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._conn.close()

    def sessions(self) -> list[SessionInfo]:
        """Every registered session, oldest first."""
        rows = self._conn.execute("SELECT data FROM sessions ORDER BY rowid").fetchall()
        return [SessionInfo.from_dict(orjson.loads(r[0])) for r in rows]

    def session_ids(self) -> list[str]:
        """Every session with records, in the order of their first record."""
        rows = self._conn.execute("SELECT session_id FROM records GROUP BY session_id ORDER BY MIN(id)")
        return [r[0] for r in rows]

    def records(self, session_id: str | None = None, *, packed: bool = False) -> list[TraceRecord]:
        """One session's records in call order, or every record in write order."""
        if session_id is None:
            rows = self._conn.execute(f"SELECT {self._cols} FROM records ORDER BY id")
        else:
            rows = self._conn.execute(
                f"SELECT {self._cols} FROM records WHERE session_id=? ORDER BY call_index, id", (session_id,)
            )
        return [_decode(r, packed) for r in rows]

    def iter_sessions(
        self, session_ids: list[str] | None = None, *, packed: bool = False
    ) -> Iterator[tuple[str, list[TraceRecord]]]:
        """(session id, its records in call order), one session at a time, in session id order:
        one cursor walking the session index, so a store of any size is read in the memory of
        one session (no list of every session id first)."""
        args: tuple[str, ...]
        where, args = "", ()
        if session_ids is not None:
            where, args = f"WHERE session_id IN ({','.join('?' * len(session_ids))})", tuple(session_ids)
        rows = self._conn.execute(
            f"SELECT session_id, {self._cols} FROM records {where} ORDER BY session_id, call_index, id", args
        )
        for sid, group in itertools.groupby(rows, key=operator.itemgetter(0)):
            yield sid, [_decode(r[1:], packed) for r in group]


def read_sessions(path: str | Path) -> list[SessionInfo]:
    """Every registered session of a store file, oldest first, read-only (for tools and viewers)."""
    with TraceReader(path) as reader:
        return reader.sessions()


def read_records(
    path: str | Path, session_id: str | None = None, *, packed: bool = False
) -> list[TraceRecord]:
    """Read records from a store file without starting a writer (for tools and trainers)."""
    with TraceReader(path) as reader:
        return reader.records(session_id, packed=packed)
