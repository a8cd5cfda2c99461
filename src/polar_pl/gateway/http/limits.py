"""Bounds on what the gateway reads: the body size, checked while reading, and the JSON nesting
depth, checked at parse time. Both are answered 413 / 400 in the caller's error shape.

Why a depth bound: orjson parses 1,024 levels but encodes at most 254, and everything the gateway
writes (the engine body, the trace record, a session's row) nests the harness's JSON a few levels
deeper. A body that parses but cannot be encoded again would fail half-way through a call.
"""

from __future__ import annotations

from typing import Any

import orjson

DEFAULT_MAX_BODY_BYTES = 32 * 2**20
DEFAULT_MAX_DEPTH = 128
# orjson's encoder limit, and the levels the gateway's own JSON adds around a request (record,
# engine body, tool schemas inside it), with room to spare
_ENCODE_LIMIT = 254
_MAX_ALLOWED_DEPTH = 200


class BodyTooLarge(Exception):
    def __init__(self, limit: int, size: int | None = None):
        got = f"{size} bytes" if size is not None else "more"
        super().__init__(f"request body too large: {got}, the limit is {limit} bytes")


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
            raise BodyTooLarge(limit)
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
