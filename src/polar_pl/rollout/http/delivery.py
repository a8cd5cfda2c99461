"""Finished groups from the rollout client to HTTP readers, none lost on the way.

A group leaves the service's queue only once it was written to a reader still connected: readers
take groups from a `GroupOutbox`, write them, then report them `delivered` (which marks them
consumed where the reader asked for that); a group the reader could not be written to (it left
while waiting, or mid-answer) goes back to the front, ahead of every group not handed out yet.

Readers wait on the event loop, not in worker threads: one pump task asks the client for what
the oldest waiting reader lacks (in one thread, a poll at a time), however many readers wait. The
open streams are bounded (`max_streams`); one more is refused with a 429.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import orjson
from starlette.responses import JSONResponse, Response
from starlette.types import Receive, Scope, Send

from polar_pl.rollout.http.schema import group_json
from polar_pl.rollout.service import Group, PartDown, RolloutsStopped

_NUMPY = orjson.OPT_SERIALIZE_NUMPY  # rows built from packed store records hold numpy arrays


@dataclass(eq=False, slots=True)
class _Waiter:
    n: int
    got: asyncio.Future[list[Group]]


def _by_seq(groups: Sequence[Group]) -> list[Group]:
    return sorted(groups, key=lambda g: g.seq)


class GroupOutbox:
    """client: the `RolloutClient` the groups come from. max_streams: how many
    GET /v1/groups/stream may be open at once. poll_s: how long one ask of the client waits (the
    pump notices readers that came or left between asks). on_delivered: called with each batch of
    groups written to a reader."""

    def __init__(
        self,
        client: Any,
        *,
        max_streams: int,
        poll_s: float = 1.0,
        on_delivered: Callable[[Sequence[Group]], None] | None = None,
    ) -> None:
        if max_streams < 1:
            raise ValueError(f"max_streams={max_streams}: must be >= 1")
        self.client, self.max_streams, self.poll_s = client, max_streams, poll_s
        self.on_delivered = on_delivered
        self.front: list[Group] = []  # handed out by the client, written to nobody yet; by seq
        self.streams = 0
        self._waiters: deque[_Waiter] = deque()
        self._pump: asyncio.Task | None = None

    def metrics(self) -> dict[str, float]:
        return {"http/streams_open": self.streams, "http/groups_held": len(self.front)}

    def open_stream(self) -> bool:
        """A stream slot, or False when `max_streams` are open (`close_stream` gives it back)."""
        if self.streams >= self.max_streams:
            return False
        self.streams += 1
        return True

    def close_stream(self) -> None:
        self.streams -= 1

    async def take(self, n: int, timeout: float | None) -> list[Group]:
        """The next n groups, oldest first, once all n are here: the caller writes them, then calls
        `delivered` or `put_back`. A timeout (TimeoutError) or a cancel takes nothing."""
        waiter = _Waiter(n, asyncio.get_running_loop().create_future())
        self._waiters.append(waiter)
        self._serve()
        try:
            async with asyncio.timeout(timeout):
                return await asyncio.shield(waiter.got)  # shielded: a cancel leaves what it holds
        except BaseException:
            if waiter in self._waiters:
                self._waiters.remove(waiter)
                self._serve()  # the next reader may be served by what this one waited for
            elif not waiter.got.cancelled() and waiter.got.exception() is None:
                self.put_back(waiter.got.result())
            raise

    def put_back(self, groups: Sequence[Group]) -> None:
        """Groups that reached no reader: they go out first again."""
        self.front = _by_seq([*groups, *self.front])
        self._serve()

    async def delivered(self, groups: Sequence[Group], *, consume: bool) -> None:
        """Groups written to a reader; consume: mark them consumed (the resume cursor)."""
        if self.on_delivered is not None:
            self.on_delivered(groups)
        if consume and groups:
            await asyncio.to_thread(self.client.mark_consumed, [g.seq for g in groups])

    def _serve(self) -> None:
        """Hand `front` to the waiting readers, oldest first; start the pump for what they lack."""
        while self._waiters and len(self.front) >= self._waiters[0].n:
            waiter = self._waiters.popleft()
            waiter.got.set_result(self.front[: waiter.n])
            del self.front[: waiter.n]
        if self._waiters and (self._pump is None or self._pump.done()):
            self._pump = asyncio.get_running_loop().create_task(self._fetch())

    async def _fetch(self) -> None:
        while self._waiters:
            need = self._waiters[0].n - len(self.front)
            try:  # consume=False: a group counts as consumed only once written (`delivered`)
                got = await asyncio.to_thread(self.client.next_groups, need, self.poll_s, consume=False)
            except TimeoutError:
                continue
            except Exception as exc:  # the service stopped or failed: every waiting reader hears why
                while self._waiters:
                    self._waiters.popleft().got.set_exception(exc)
                return
            self.front = _by_seq([*self.front, *got])
            self._serve()


def failure(exc: BaseException) -> tuple[int, str, str]:
    """(status, message, error type) for why the service has no group to give."""
    if isinstance(exc, RolloutsStopped | PartDown):
        return 503, str(exc), "unavailable"
    cause = f": {exc.__cause__}" if exc.__cause__ is not None else ""
    return 500, f"{exc}{cause}", "rollout_error"


class _Reader:
    """The reader's side of one answer: `gone` is set once its connection closed. (uvicorn drops
    writes to a closed connection without a word, so this is the only way to know.)"""

    def __init__(self, receive: Receive) -> None:
        self.gone = asyncio.Event()
        self._watch = asyncio.create_task(self._listen(receive))

    async def _listen(self, receive: Receive) -> None:
        while (await receive())["type"] != "http.disconnect":
            pass
        self.gone.set()

    def close(self) -> None:
        self._watch.cancel()

    async def next(self, outbox: GroupOutbox, n: int, timeout: float | None) -> list[Group] | None:
        """n groups from the outbox, or None when the reader left first (nothing taken)."""
        take = asyncio.ensure_future(outbox.take(n, timeout))
        left = asyncio.ensure_future(self.gone.wait())
        try:
            await asyncio.wait((take, left), return_when=asyncio.FIRST_COMPLETED)
        except BaseException:  # this answer was cancelled (server shutdown)
            if take.done() and not take.cancelled() and take.exception() is None:
                outbox.put_back(take.result())
            raise
        finally:
            left.cancel()
            if not take.done():
                take.cancel()  # take() gives back what it was handed
                await asyncio.wait((take,))
        if take.cancelled():
            return None
        groups = take.result()  # or its TimeoutError / the service's error
        if self.gone.is_set():
            outbox.put_back(groups)
            return None
        return groups

    async def write(self, send: Send, body: bytes, *, more: bool) -> bool:
        """Whether `body` went to a connected reader (a reader that left during a paused write
        counts as not written: its groups go back rather than be lost)."""
        if self.gone.is_set():
            return False
        try:
            await send({"type": "http.response.body", "body": body, "more_body": more})
        except OSError:
            return False
        return not self.gone.is_set()


class GroupsAnswer(Response):
    """GET /v1/groups: n groups as one JSON object, or a 408 once `timeout` passed."""

    def __init__(self, outbox: GroupOutbox, n: int, timeout: float, consume: bool) -> None:
        self.outbox, self.n, self.timeout, self.consume = outbox, n, timeout, consume
        self.status_code, self.background = 200, None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        reader = _Reader(receive)
        try:
            try:
                groups = await reader.next(self.outbox, self.n, self.timeout)
            except Exception as exc:
                if isinstance(exc, TimeoutError):
                    status, kind = 408, "timeout"
                    message = f"fewer than {self.n} groups ready after {self.timeout} s; ask again"
                else:
                    status, message, kind = failure(exc)
                error = {"error": {"message": message, "type": kind}}
                return await JSONResponse(error, status_code=status)(scope, receive, send)
            if groups is None:
                return
            body = orjson.dumps({"groups": [group_json(g) for g in groups]}, option=_NUMPY)
            head = Response(body, media_type="application/json").raw_headers
            await send({"type": "http.response.start", "status": 200, "headers": head})
            if not await reader.write(send, body, more=False):
                self.outbox.put_back(groups)
                return
            await self.outbox.delivered(groups, consume=self.consume)
        finally:
            reader.close()


class GroupStream(Response):
    """GET /v1/groups/stream: one group per line as each is finished (consumed once written); a
    last line `{"error": ...}` if the service stops. Holds a slot of `open_stream` until it ends."""

    media_type = "application/x-ndjson"

    def __init__(self, outbox: GroupOutbox, limit: int | None) -> None:
        self.outbox, self.limit = outbox, limit
        self.status_code, self.background = 200, None
        self.init_headers()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        reader = _Reader(receive)
        try:
            await send({"type": "http.response.start", "status": 200, "headers": self.raw_headers})
            sent = 0
            while self.limit is None or sent < self.limit:
                try:
                    groups = await reader.next(self.outbox, 1, None)
                except Exception as exc:
                    _, message, kind = failure(exc)
                    line = orjson.dumps({"error": {"message": message, "type": kind}}) + b"\n"
                    await reader.write(send, line, more=True)
                    break
                if groups is None:
                    return
                line = orjson.dumps(group_json(groups[0]), option=_NUMPY) + b"\n"
                if not await reader.write(send, line, more=True):
                    self.outbox.put_back(groups)
                    return
                await self.outbox.delivered(groups, consume=True)
                sent += 1
            await reader.write(send, b"", more=False)
        finally:
            reader.close()
            self.outbox.close_stream()
