"""The ASGI responses the proxy answers model calls with, each of which reports how it ended.

A call that holds the engine is answered while its client is watched (`ClientWatch`): when the
client disconnects, the work is cancelled at once, which runs the call's cleanup (engine request
aborted, partial response recorded "aborted"). `RelayResponse` streams; `CollectResponse` collects
the engine's answer first and sends it in one piece; `DeliveredResponse` is a one-piece answer
whose record waits for its delivery (store/traces.py). When the gateway stops, it cancels the
calls in flight the same way (http/harness_routes.py); `stopped()` then gives what the client
is told instead: the provider's retryable error, as an answer or as the event that ends a stream.
Each calls its end callback exactly once, whatever ends it, so the proxy can give back what the
call holds of the engine and settle its record, even when the response never got to start.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Awaitable, Callable
from typing import Self, TypeVar

from starlette.responses import Response

T = TypeVar("T")


class LastPart(bytes):
    """The relay's final bytes: sent with the end of the body in one write (one syscall less
    per response than a separate empty end-of-body send; bench/gateway.py)."""


class ClientWatch:
    """`async with ClientWatch(receive) as watch:` cancels the block as soon as the client's
    `http.disconnect` arrives; such an end leaves the block normally with `watch.gone` set. Any
    other cancellation (the gateway stopping) goes on. The request body must have been read."""

    def __init__(self, receive):
        self.receive = receive
        self.gone = False

    async def __aenter__(self) -> Self:
        task = asyncio.current_task()
        assert task is not None  # entered from a coroutine: always inside a task
        self._task = task
        self._watcher = asyncio.ensure_future(self._watch())
        return self

    async def _watch(self) -> None:
        while (await self.receive())["type"] != "http.disconnect":
            pass
        self.gone = True
        self._task.cancel()

    async def __aexit__(self, exc_type, exc, tb) -> bool:
        self._watcher.cancel()
        if exc_type is asyncio.CancelledError and self.gone:
            self._task.uncancel()  # the client is gone: a normal end for this response
            return True
        return False


def _stopping(stopped: Callable[[], T | None]) -> T | None:
    """What to tell the client when a cancellation is the gateway stopping (None: any other one)."""
    answer = stopped()
    if answer is not None:
        task = asyncio.current_task()
        assert task is not None  # called from a coroutine: always inside a task
        task.uncancel()
    return answer


class RelayResponse(Response):
    """Streams an async byte iterator with plain ASGI sends (no per-response task group), the
    client watched. The generator is always closed, whatever ends the response, and `on_end`
    runs after it: a generator that never started has no cleanup of its own."""

    def __init__(
        self,
        body: AsyncGenerator[bytes, None],
        media_type: str,
        headers: dict[str, str],
        on_end: Callable[[bool], None],
        stopped: Callable[[], bytes | None],
    ):
        """stopped: the event that ends the stream when the gateway stops (None: not stopping)."""
        self.body_iterator = body
        self.status_code = 200
        self.media_type = media_type
        self.background = None
        self.on_end = on_end
        self.stopped = stopped
        self.init_headers(headers)

    async def __call__(self, scope, receive, send) -> None:
        delivered = started = False
        try:
            async with ClientWatch(receive):
                await send({"type": "http.response.start", "status": 200, "headers": self.raw_headers})
                started = True
                more = True
                async for part in self.body_iterator:
                    more = type(part) is not LastPart
                    await send({"type": "http.response.body", "body": part, "more_body": more})
                if more:
                    await send({"type": "http.response.body", "body": b"", "more_body": False})
                delivered = True
        except asyncio.CancelledError:
            if (tail := _stopping(self.stopped)) is None:
                raise
            await self.body_iterator.aclose()  # recorded "aborted" before anything else is sent
            if not started:
                await send({"type": "http.response.start", "status": 200, "headers": self.raw_headers})
            await send({"type": "http.response.body", "body": tail, "more_body": False})
        finally:
            try:
                await self.body_iterator.aclose()
            finally:
                self.on_end(delivered)


class CollectResponse(Response):
    """A non-streamed answer, collected while the client is watched: `collect()` consumes the
    engine stream and returns the Response to send. When the client leaves (or the gateway
    stops) first, the collection is cancelled, which aborts the engine request, and
    `on_abandoned()` records the call "aborted" with what was sampled so far."""

    def __init__(
        self,
        collect: Callable[[], Awaitable[Response]],
        on_abandoned: Callable[[], None],
        stopped: Callable[[], Response | None],
    ):
        self.collect = collect
        self.on_abandoned = on_abandoned
        self.stopped = stopped
        self.background = None

    async def __call__(self, scope, receive, send) -> None:
        collected = answer = None
        try:
            async with ClientWatch(receive):
                collected = answer = await self.collect()
        except asyncio.CancelledError:
            if (answer := _stopping(self.stopped)) is None:
                raise
        finally:
            if collected is None:  # recorded before the client hears anything
                self.on_abandoned()
        if answer is not None:  # None: the client is gone
            await answer(scope, receive, send)


class DeliveredResponse(Response):
    """A JSON response that reports, once sent (or not), whether the server took its body."""

    def __init__(self, body: bytes, on_end: Callable[[bool], None]):
        super().__init__(body, media_type="application/json")
        self.on_end = on_end

    async def __call__(self, scope, receive, send) -> None:
        delivered = False
        try:
            await super().__call__(scope, receive, send)
            delivered = True
        finally:
            self.on_end(delivered)
