"""Token-faithful mode in the request path: per-session chain state, prompt building, counters.

`TokenFaithful` keeps, per session, the tips of the session's successful calls (incremental.py's
`Tip`: request messages, tools, packed prompt and sampled ids; in memory: the prompt of call n is
built from calls < n, so a store read per call is not needed; a session first seen by this
process, e.g. after a gateway restart, is read from the store once). A call that extends one of
them is built incrementally; any other (the session's first call, an edited or compacted history,
a side call, a template that is not suffix-local) is rendered in full, and counted by why, in the
merge's break kinds. Prompts are built off the event loop (a full render of a long conversation
takes milliseconds; the first use may load the tokenizer), refusing a prompt longer than the
engine's context before tokenizing all of it (context.py). The engine's token-in stream is shown to the proxy as chat chunks in
completion.py.

check=True also builds every incremental prompt the full way and compares the two (a mismatch is
logged, counted and answered with the full path's ids); it costs a full render per call again, and
keeps the plain re-render for drift diagnostics (`rendered_prompt_ids`).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections import Counter, deque
from collections.abc import Callable
from typing import Any

import numpy as np

from polar_pl.gateway.faithful.context import ContextTooLong, check_fits, needs_check
from polar_pl.gateway.faithful.incremental import TEMPLATE, classify_fallback, extend
from polar_pl.gateway.faithful.prompt import FaithfulPrompt, Tip, faithful_prompt
from polar_pl.gateway.store.chains import FIRST, BreakKind
from polar_pl.gateway.store.records import TraceRecord

# A harness session rarely makes more calls than this; older ones are only needed as anchors of a
# conversation that has moved on (their successors carry the same spliced tokens).
MAX_HISTORY = 1024
FALLBACKS = (FIRST, TEMPLATE, *(k.value for k in BreakKind))
log = logging.getLogger(__name__)


class _Session:
    """One session's tips, by number of request messages, and what the fallback rule needs."""

    __slots__ = ("by_len", "failures", "nearest", "order")

    def __init__(self) -> None:
        self.by_len: dict[int, list[Tip]] = {}
        self.order: deque[Tip] = deque()
        self.nearest: Tip | None = None  # the latest main tip
        self.failures: list[tuple[int, str]] = []  # calls failed after `nearest`: (index, error)

    def add(self, tip: Tip, main: bool) -> None:
        self.by_len.setdefault(len(tip.messages), []).append(tip)
        self.order.append(tip)
        if len(self.order) > MAX_HISTORY:
            old = self.order.popleft()
            self.by_len[len(old.messages)].remove(old)
        if main and (self.nearest is None or tip.call_index > self.nearest.call_index):
            self.nearest = tip
            self.failures = [f for f in self.failures if f[0] > tip.call_index]

    def failed(self, call_index: int, error: str) -> None:
        if self.nearest is None or call_index > self.nearest.call_index:
            self.failures.append((call_index, error))


class TokenFaithful:
    def __init__(
        self,
        tokenizer: Callable[[], Any],
        reasoning_parser: str | None = None,
        load: Callable[[str], list[TraceRecord]] | None = None,
        *,
        check: bool = False,
    ) -> None:
        self._tokenizer = tokenizer  # loads lazily, once
        self.reasoning_parser = reasoning_parser
        self._load = load  # the store's records(session_id), for sessions this process has not seen
        self.check = check
        self._sessions: dict[str, _Session] = {}
        self._loaded: set[str] = set()
        self.counts: Counter[str] = Counter()

    async def prompt(
        self,
        session_id: str,
        chat: dict[str, Any],
        *,
        call_kind: str = "main",
        limit: int | None = None,
        body_size: int = 0,
    ) -> FaithfulPrompt:
        """Raises ValueError: RenderError on messages the template cannot render, ContextTooLong
        on a prompt of `limit` (the engine's context) tokens or more. body_size: the request's
        bytes (a small one cannot hold a prompt that long, faithful/context.py)."""
        if session_id not in self._loaded:
            self._loaded.add(session_id)
            if self._load is not None:
                stored = await asyncio.to_thread(self._load, session_id)
                sess = self._sessions.get(session_id)
                have = {t.call_index for t in sess.order} if sess else set()
                for rec in stored:
                    if rec.call_index not in have:
                        self.remember(rec)
        return await asyncio.to_thread(self.build, session_id, chat, call_kind, limit, body_size)

    def build(
        self,
        session_id: str,
        chat: dict[str, Any],
        call_kind: str = "main",
        limit: int | None = None,
        body_size: int = 0,
    ) -> FaithfulPrompt:
        tok = self._tokenizer()  # here, off the event loop: the first call may load it
        if limit is not None and needs_check(body_size, limit):
            check_fits(tok, chat, limit)
        fp = self._build(tok, session_id, chat, call_kind)
        if limit is not None and len(fp.prompt_ids) >= limit:
            raise ContextTooLong(len(fp.prompt_ids), limit)
        return fp

    def _build(self, tok: Any, session_id: str, chat: dict[str, Any], call_kind: str) -> FaithfulPrompt:
        """The prompt of a call, incremental where it extends a tip (see the module docstring)."""
        sess = self._sessions.get(session_id)
        if sess is None or not sess.order:
            return self._full(tok, chat, (), FIRST)
        got = extend(tok, chat, sess.by_len)
        if isinstance(got, FaithfulPrompt):
            self.counts["incremental"] += 1
            return self._checked(tok, chat, sess, got) if self.check else got
        if call_kind == "side":
            reason = BreakKind.SIDE_CALL.value
        elif got in (TEMPLATE, BreakKind.DRIFT.value):
            reason = got
        else:
            failures = " ".join(f"{e} error" for _, e in sess.failures)
            reason = classify_fallback(chat, sess.nearest, failures or None)
        return self._full(tok, chat, sess.order, reason)

    def _full(self, tok: Any, chat: dict[str, Any], tips, reason: str) -> FaithfulPrompt:
        self.counts[f"full/{reason}"] += 1
        fp = faithful_prompt(tok, chat, list(tips))
        return dataclasses.replace(fp, fallback=reason) if reason != FIRST else fp

    def _checked(self, tok: Any, chat: dict[str, Any], sess: _Session, fp: FaithfulPrompt) -> FaithfulPrompt:
        full = faithful_prompt(tok, chat, list(sess.order))
        if full.anchor == fp.anchor and np.array_equal(full.prompt_ids, fp.prompt_ids):
            return dataclasses.replace(fp, rendered_ids=full.rendered_ids)
        self.counts["mismatch"] += 1
        log.warning(
            "token-faithful: incremental prompt (anchor %s, %d ids) differs from the full render "
            "(anchor %s, %d ids); the full render is used",
            fp.anchor,
            len(fp.prompt_ids),
            full.anchor,
            len(full.prompt_ids),
        )
        return dataclasses.replace(full, fallback="mismatch")

    def remember(self, rec: TraceRecord, prompt: np.ndarray | None = None) -> None:
        """Keep what later prompts need of a finished call. prompt: its prompt ids as an array,
        when the caller has them (the faithful prompt the engine was given)."""
        sess = self._sessions.setdefault(rec.session_id, _Session())
        tip = Tip.of(rec, prompt)
        if tip is None:
            if rec.status != "ok":
                sess.failed(rec.call_index, f"{rec.error or ''} {rec.status}")
            return
        sess.add(tip, rec.call_kind == "main")

    def forget(self, session_id: str) -> None:
        self._sessions.pop(session_id, None)
        self._loaded.discard(session_id)

    def sessions(self) -> int:
        return len(self._sessions)

    def snapshot(self) -> dict[str, float]:
        """`gateway/faithful/incremental`, `gateway/faithful/full/<why>` (every kind), `.../mismatch`."""
        out = {"gateway/faithful/incremental": float(self.counts["incremental"])}
        out |= {f"gateway/faithful/full/{k}": float(self.counts[f"full/{k}"]) for k in FALLBACKS}
        out["gateway/faithful/mismatch"] = float(self.counts["mismatch"])
        return out
