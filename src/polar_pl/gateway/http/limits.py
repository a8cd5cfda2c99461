"""Bounds on what the gateway reads: the body size, checked while reading, and the JSON nesting
depth, checked at parse time. Both are answered 413 / 400 in the caller's error shape.

An answer given before the body was read to its end (413, or 401 for an unknown token) goes out
as `AnsweredEarly`: most clients (urllib, requests, httpx) write the whole body before they read
any answer, and a server that closes a socket with unread bytes makes the kernel reset the
connection, so urllib got ECONNRESET instead of the 413 for a 64 MiB body. (40 MiB got through
only because it fit in the loopback socket buffers, 32 MiB receive + 4 MiB send here.)

Why a depth bound: orjson parses 1,024 levels but encodes at most 254, and everything the gateway
writes (the engine body, the trace record, a session's row) nests the harness's JSON a few levels
deeper. A body that parses but cannot be encoded again would fail half-way through a call.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import orjson
from starlette.responses import Response

DEFAULT_MAX_BODY_BYTES = 32 * 2**20
DEFAULT_MAX_DEPTH = 128
# How long an early answer keeps reading a body it refused before the connection is closed anyway.
DRAIN_TIMEOUT_S = 60.0
# orjson's encoder limit, and the levels the gateway's own JSON adds around a request (record,
# engine body, tool schemas inside it), with room to spare
_ENCODE_LIMIT = 254
_MAX_ALLOWED_DEPTH = 200


class BodyTooLarge(Exception):
    """ended: the body was read to its end all the same (nothing left to drain)."""

    def __init__(self, limit: int, size: int | None = None, ended: bool = False):
        got = f"{size} bytes" if size is not None else "more"
        super().__init__(f"request body too large: {got}, the limit is {limit} bytes")
        self.ended = ended


class TooDeep(ValueError):
    def __init__(self, limit: int):
        super().__init__(f"request JSON nested deeper than {limit} levels")


def check_limits(max_body_bytes: int, max_depth: int) -> None:
    if isinstance(max_body_bytes, bool) or not isinstance(max_body_bytes, int) or max_body_bytes < 1:
        raise ValueError(f"max_body_bytes: {max_body_bytes!r}; allowed: a positive number of bytes")
    if (
        isinstance(max_depth, bool)
        or not isinstance(max_depth, int)
        or not 1 <= max_depth <= _MAX_ALLOWED_DEPTH
    ):
        raise ValueError(f"max_json_depth: {max_depth!r}; allowed: 1 to {_MAX_ALLOWED_DEPTH}")


async def read_body(receive, limit: int, headers: dict[str, str] | None = None) -> bytes:
    """The request body, refused (BodyTooLarge) as soon as it passes `limit`: a declared length
    over it is refused before any byte is read, and a body without one stops being read."""
    declared = (headers or {}).get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise BodyTooLarge(limit, int(declared))
    parts, size = [], 0
    while True:
        msg = await receive()
        if msg["type"] == "http.disconnect":
            break
        chunk = msg.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise BodyTooLarge(limit, ended=not msg.get("more_body"))
        parts.append(chunk)
        if not msg.get("more_body"):
            break
    return parts[0] if len(parts) == 1 else b"".join(parts)


def check_depth(value: Any, limit: int) -> None:
    """Raises TooDeep if `value` (parsed JSON) nests more than `limit` containers.

    The check is orjson's own encoder limit: `value` wrapped in 254 - limit one-element lists
    encodes if and only if it nests at most `limit` levels (a C-speed walk; a Python one cost as
    much as the parse itself on a large request)."""
    wrapped = value
    for _ in range(_ENCODE_LIMIT - limit):
        wrapped = [wrapped]
    try:
        orjson.dumps(wrapped)
    except TypeError:  # orjson's "Recursion limit reached" (JSONEncodeError is a TypeError)
        raise TooDeep(limit) from None


def parse_json(body: bytes, max_depth: int) -> Any:
    """orjson.loads with the depth bound (TooDeep); invalid JSON raises orjson.JSONDecodeError."""
    try:
        value = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        if "depth limit" in str(exc):  # past orjson's own 1,024 levels
            raise TooDeep(max_depth) from None
        raise
    # nesting needs an opening bracket per level: a body with no more than `max_depth` of them
    # (most requests are far below: counted at C speed) cannot be too deep, and is not re-encoded
    if isinstance(value, dict | list) and body.count(b"[") + body.count(b"{") > max_depth:
        check_depth(value, max_depth)
    return value


class AnsweredEarly(Response):
    """An answer to a request whose body was not read to its end (module docstring): the answer
    goes out at once, for clients that read early; then the rest of the body is read and dropped
    (for at most DRAIN_TIMEOUT_S), then the response ends and the connection closes. A client
    that sent `Expect: 100-continue` sends no body after an answer: nothing to drain."""

    def __init__(self, answer: Response, headers: dict[str, str]):
        self.answer = answer
        self.drain = headers.get("expect", "").lower() != "100-continue"
        self.background = None

    async def __call__(self, scope, receive, send) -> None:
        answer = self.answer
        headers = [*answer.raw_headers, (b"connection", b"close")]
        await send({"type": "http.response.start", "status": answer.status_code, "headers": headers})
        await send({"type": "http.response.body", "body": answer.body, "more_body": True})
        if self.drain:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(DRAIN_TIMEOUT_S):
                    while (msg := await receive())["type"] != "http.disconnect" and msg.get("more_body"):
                        pass
        await send({"type": "http.response.body", "body": b"", "more_body": False})
