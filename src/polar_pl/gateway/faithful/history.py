"""Token-faithful mode in the request path: per-session history, prompt building, stream view.

`TokenFaithful` keeps, per session, slim copies of the session's successful records (in memory:
the prompt of call n is built from calls < n, so a store read per call is not needed; a session
first seen by this process, e.g. after a gateway restart, is read from the store once), builds the
prompt with `faithful.faithful_prompt` off the event loop (rendering a long conversation takes
milliseconds; the first use may load the tokenizer), refusing a prompt longer than the engine's
context before tokenizing all of it (context.py). The engine's token-in stream is shown to the proxy as chat chunks in completion.py.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable
from typing import Any

from polar_pl.gateway.faithful.context import ContextTooLong, check_fits, needs_check
from polar_pl.gateway.faithful.prompt import FaithfulPrompt, faithful_prompt
from polar_pl.gateway.store.records import TraceRecord

# A harness session rarely makes more calls than this; older ones are only needed as anchors of a
# conversation that has moved on (their successors carry the same spliced tokens).
MAX_HISTORY = 1024


class TokenFaithful:
    def __init__(
        self,
        tokenizer: Callable[[], Any],
        reasoning_parser: str | None = None,
        load: Callable[[str], list[TraceRecord]] | None = None,
    ) -> None:
        self._tokenizer = tokenizer  # loads lazily, once
        self.reasoning_parser = reasoning_parser
        self._load = load  # the store's records(session_id), for sessions this process has not seen
        self._history: dict[str, list[TraceRecord]] = {}
        self._loaded: set[str] = set()

    async def prompt(
        self, session_id: str, chat: dict[str, Any], *, limit: int | None = None, body_size: int = 0
    ) -> FaithfulPrompt:
        """Raises ValueError: RenderError on messages the template cannot render, ContextTooLong
        on a prompt of `limit` (the engine's context) tokens or more. body_size: the request's
        bytes (a small one cannot hold a prompt that long, faithful/context.py)."""
        if session_id not in self._loaded:
            self._loaded.add(session_id)
            if self._load is not None:
                stored = await asyncio.to_thread(self._load, session_id)
                have = {r.call_index for r in self._history.get(session_id, ())}
                for rec in stored:
                    if rec.call_index not in have:
                        self.remember(rec)
        history = list(self._history.get(session_id, ()))
        return await asyncio.to_thread(self._build, chat, history, limit, body_size)

    def _build(
        self, chat: dict[str, Any], history: list[TraceRecord], limit: int | None, body_size: int
    ) -> FaithfulPrompt:
        tokenizer = self._tokenizer()  # here, off the event loop: the first call may load it
        if needs_check(body_size, limit):
            check_fits(tokenizer, chat, limit)
        prompt = faithful_prompt(tokenizer, chat, history)
        if limit is not None and len(prompt.prompt_ids) >= limit:
            raise ContextTooLong(len(prompt.prompt_ids), limit)
        return prompt

    def remember(self, rec: TraceRecord) -> None:
        if rec.status != "ok" or not rec.response_ids:
            return
        slim = dataclasses.replace(rec, raw_request={}, raw_response="", response_logprobs=[])
        hist = self._history.setdefault(rec.session_id, [])
        hist.append(slim)
        if len(hist) > MAX_HISTORY:
            del hist[0]

    def forget(self, session_id: str) -> None:
        self._history.pop(session_id, None)
        self._loaded.discard(session_id)

    def sessions(self) -> int:
        return len(self._history)
