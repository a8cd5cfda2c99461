"""The two ASGI responses the proxy answers model calls with, both of which report how they ended.

`RelayResponse` streams the relay's bytes with plain ASGI sends and a disconnect watcher;
`DeliveredResponse` is a one-piece JSON answer. Each calls `on_end(delivered)` exactly once,
whatever ends it, so the proxy can give back what the call holds of the engine and mark the
record's delivery (store/traces.py), even when the response never got to start.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable

from starlette.responses import Response


class LastPart(bytes):
    """The relay's final bytes: sent with the end of the body in one write (one syscall less
    per response than a separate empty end-of-body send; bench/gateway.py)."""


class RelayResponse(Response):
    """Streams an async byte iterator with plain ASGI sends (no per-response task group).

    A watcher waits for the client's `http.disconnect`; when it comes first, the streaming task is
    cancelled, which runs the relay's cleanup at once (engine request aborted, partial response
    recorded as "aborted"). The generator is always closed, whatever ends the response, and
    `on_end` runs after it: a generator that never started has no cleanup of its own.
    """

    def __init__(
        self,
        body: AsyncIterator[bytes],
        media_type: str,
        headers: dict[str, str],
        on_end: Callable[[bool], None],
    ):
        self.body_iterator = body
        self.status_code = 200
        self.media_type = media_type
        self.background = None
        self.on_end = on_end
        self.init_headers(headers)

    async def __call__(self, scope, receive, send) -> None:
        task = asyncio.current_task()
        disconnected = False
        delivered = False

        async def watch() -> None:
            nonlocal disconnected
            while (await receive())["type"] != "http.disconnect":
                pass
            disconnected = True
            task.cancel()

        watcher = asyncio.ensure_future(watch())
        try:
            await send({"type": "http.response.start", "status": 200, "headers": self.raw_headers})
            more = True
            async for part in self.body_iterator:
                more = type(part) is not LastPart
                await send({"type": "http.response.body", "body": part, "more_body": more})
            if more:
                await send({"type": "http.response.body", "body": b"", "more_body": False})
            delivered = True
        except asyncio.CancelledError:
            if not disconnected:
                raise
            task.uncancel()  # the client is gone: a normal end for this response
        finally:
            watcher.cancel()
            try:
                await self.body_iterator.aclose()
            finally:
                self.on_end(delivered)


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
