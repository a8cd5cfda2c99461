"""Session registry: unguessable tokens, per-session call counters, persisted in the trace store.

A token is the only credential a harness holds; it maps to exactly one live session. The registry
and the store know a session by the token's hash only: the token is returned once, by `create`, so
whoever can read the store (or this process's session list) cannot act as a session. Deleted
sessions keep their records but their token stops working.
"""

from __future__ import annotations

import secrets
import time
import uuid
from dataclasses import replace

from polar_pl.gateway.store.records import SessionInfo, hash_token
from polar_pl.gateway.store.traces import TraceStore


class SessionRegistry:
    def __init__(self, store: TraceStore):
        self._store = store
        self._by_id: dict[str, SessionInfo] = {}
        self._by_hash: dict[str, str] = {}
        self._next_call: dict[str, int] = {}
        for info in store.sessions():  # a restarted gateway keeps serving its sessions
            self._by_id[info.session_id] = info
            if not info.deleted:
                self._by_hash[info.token_hash] = info.session_id

    def create(
        self,
        *,
        task_id: str | None = None,
        group_id: str | None = None,
        rollout_id: str | None = None,
        harness: str | None = None,
        meta: dict | None = None,
    ) -> tuple[SessionInfo, str]:
        """(the session, its token): the token is not kept anywhere but in the caller's hands."""
        token = f"plr-{secrets.token_urlsafe(24)}"
        info = SessionInfo(
            session_id=f"sess-{uuid.uuid4().hex[:16]}",
            token_hash=hash_token(token),
            task_id=task_id,
            group_id=group_id,
            rollout_id=rollout_id,
            harness=harness,
            created=time.time(),
            meta=dict(meta or {}),
        )
        self._store.put_session(info)
        self._by_id[info.session_id] = info
        self._by_hash[info.token_hash] = info.session_id
        self._next_call[info.session_id] = 0
        return info, token

    def get(self, session_id: str) -> SessionInfo | None:
        return self._by_id.get(session_id)

    def by_token(self, token: str | None) -> SessionInfo | None:
        if not token:
            return None
        sid = self._by_hash.get(hash_token(token))
        return self._by_id.get(sid) if sid else None

    def delete(self, session_id: str) -> SessionInfo | None:
        info = self._by_id.get(session_id)
        if info is None:
            return None
        info = replace(info, deleted=True)
        self._store.put_session(info)  # first: a store that cannot take it leaves the session as it was
        self._by_id[session_id] = info
        self._by_hash.pop(info.token_hash, None)
        return info

    def next_call_index(self, session_id: str) -> int:
        """Call indices are assigned at request start, so concurrent calls never share one."""
        n = self._next_call.get(session_id)
        if n is None:
            n = self._store.next_call_index(session_id)
        self._next_call[session_id] = n + 1
        return n

    def all(self) -> list[SessionInfo]:
        return list(self._by_id.values())
