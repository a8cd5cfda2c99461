"""Provider-shaped error responses and the engine-failure -> HTTP status map.

Every error a harness sees comes from here, in its provider's shape (the adapter's `error_body`),
with `Retry-After` where retrying can help. Engine down or broken -> 502 (or the status the API's
clients retry: the adapter's `retryable_status`, Anthropic's 529), engine timeout -> 504, an engine 4xx
(prompt too long, bad parameter) -> the same 4xx.
"""

from __future__ import annotations

import contextlib
from typing import Any

import orjson
from starlette.responses import Response

from polar_pl.gateway.providers import ProviderAdapter
from polar_pl.gateway.upstream.client import UpstreamError

RETRY_AFTER_S = 2
_RETRYABLE = frozenset({429, 500, 502, 503, 504, 529})


def generic_error_body(status: int, message: str) -> dict[str, Any]:
    """For requests whose provider is unknown: OpenAI's shape, the most widely parsed one."""
    return {
        "error": {
            "message": message,
            "type": "invalid_request_error" if status < 500 else "server_error",
            "param": None,
            "code": None,
        }
    }


def error_body_for(provider: str | None, status: int, message: str) -> dict[str, Any]:
    if provider:
        from polar_pl.gateway.providers import UnknownProvider, get_adapter

        try:
            return get_adapter(provider).error_body(status, message)
        except UnknownProvider:
            pass
    return generic_error_body(status, message)


def error_response(provider: str | None, status: int, message: str) -> Response:
    headers = {"retry-after": str(RETRY_AFTER_S)} if status in _RETRYABLE else None
    return Response(
        orjson.dumps(error_body_for(provider, status, message)),
        status_code=status,
        media_type="application/json",
        headers=headers,
    )


def retryable_response(provider: str | None, message: str) -> Response:
    """A 503 with Retry-After, or the status this API's clients retry instead (Anthropic's 529)."""
    status = 503
    if provider:
        from polar_pl.gateway.providers import UnknownProvider, get_adapter

        with contextlib.suppress(UnknownProvider):
            status = get_adapter(provider).retryable_status(503)
    return error_response(provider, status, message)


def upstream_status(adapter: ProviderAdapter, err: UpstreamError) -> int:
    if err.kind == "timeout":
        return 504
    if err.kind == "http" and err.status is not None and 400 <= err.status < 500 and err.status != 404:
        return 400 if err.status == 422 else err.status
    return adapter.retryable_status(502)
