"""Harness traffic as a raw ASGI handler: probes, model lists, count_tokens and model calls.

This is the gateway's hot path, so it bypasses FastAPI's router and middleware (measured in
bench/gateway.py). Routing is by hand because CLIs reach the same API under `/v1/...`, `/...`
and `/s/<token>/...`: the provider comes from the path, then the headers, then the body. An
unknown or missing token is refused with 401 in the provider's shape before anything is recorded
(and, where the path names the provider, before the body is read). Bodies are bounded while they
are read (413) and JSON nesting at parse time (400, http/limits.py); such refusals of a valid
session's call are recorded like any failed call. An answer given before the body was read to its
end reads the rest after it (limits.AnsweredEarly), or the client would get a reset instead. Any unexpected exception becomes a
provider-shaped 500, never a traceback.

When the gateway stops (`stop`, from the server's shutdown hook), every harness request in flight
is cancelled at once: a model call aborts its engine request and is recorded "aborted" with the
reason (call/proxy.py), and a client that got nothing yet gets the provider's retryable error, as
does any request that arrives while the gateway stops. Without this, uvicorn's graceful shutdown
waited for the longest generation (50-55 s, issue 32).
"""

from __future__ import annotations

import asyncio
import logging
from urllib.parse import parse_qsl

import orjson
from starlette.responses import JSONResponse, Response

from polar_pl.gateway.call.proxy import STOPPING
from polar_pl.gateway.call.volatile import strip_volatile
from polar_pl.gateway.http.detect import (
    detect_provider,
    find_token,
    is_count_tokens,
    provider_for_models,
    provider_from_headers,
    provider_from_path,
    route_name,
    split_session_path,
)
from polar_pl.gateway.http.errors import error_response, retryable_response
from polar_pl.gateway.http.limits import AnsweredEarly, BodyTooLarge, TooDeep, parse_json, read_body
from polar_pl.gateway.providers import RequestError, UnknownProvider, get_adapter, normalize
from polar_pl.gateway.runtime import GatewayRuntime
from polar_pl.gateway.upstream.client import UpstreamError

log = logging.getLogger(__name__)
UNAUTHORIZED = "invalid or missing session token (API key)"


def _provider(sub: str, headers: dict[str, str]) -> str | None:
    """The provider as far as the path and headers tell, for an answer the route did not give."""
    return provider_from_path(sub) or provider_from_headers(headers)


class HarnessRoutes:
    def __init__(self, rt: GatewayRuntime):
        self.rt = rt
        self.in_flight: set[asyncio.Task] = set()  # the tasks of the harness requests being served

    def stop(self, reason: str = "gateway shut down") -> int:
        """Cancel every harness request in flight (module docstring); returns how many. Called
        on the gateway's loop."""
        self.rt.proxy.stopping = reason
        for task in self.in_flight:
            task.cancel()
        return len(self.in_flight)

    async def __call__(self, scope, receive, send) -> None:
        headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}
        path_token, sub = split_session_path(scope["path"])
        task = asyncio.current_task()
        assert task is not None  # an ASGI call runs in a task
        self.in_flight.add(task)
        # the status the client was sent (a collected answer's is known only once it is sent);
        # nginx's 499 when none was: the client left first
        status = 499

        async def send_status(message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            resp = await self._answer(scope, sub, path_token, headers, receive)
            await resp(scope, receive, send_status)
        except asyncio.CancelledError:
            if self.rt.proxy.stopping is None:
                raise
            task.uncancel()  # a plain answer cut by the stop: the call's own cleanup has run
        finally:
            self.in_flight.discard(task)
            self._count(scope["method"], sub, headers, status)

    def _count(self, method: str, sub: str, headers: dict[str, str], status: int) -> None:
        """One harness request answered, for GET /metrics."""
        route = route_name(method, sub)
        if route == "models":  # answered in OpenAI's shape unless the path or headers say otherwise
            provider = provider_for_models(sub, headers) or "openai_chat"
        else:
            provider = _provider(sub, headers) or "unknown"
        self.rt.proxy.stats.answered(provider, route, status)

    async def _answer(
        self, scope, sub: str, path_token: str | None, headers: dict[str, str], receive
    ) -> Response:
        """The response to send: the route's, or the provider's error (a bug, or the gateway stopping)."""
        if self.rt.proxy.stopping is not None:
            return retryable_response(_provider(sub, headers), STOPPING)
        try:
            return await self.route(
                scope["method"], sub, path_token, headers, scope.get("query_string", b""), receive
            )
        except asyncio.CancelledError:
            if self.rt.proxy.stopping is None:
                raise
            asyncio.current_task().uncancel()
            return retryable_response(_provider(sub, headers), STOPPING)
        except Exception as exc:  # the last line of defence: a provider-shaped 500, logged
            log.exception("gateway error on %s %s", scope["method"], sub)
            return error_response(
                _provider(sub, headers), 500, f"internal gateway error: {type(exc).__name__}"
            )

    async def route(
        self,
        method: str,
        sub: str,
        path_token: str | None,
        headers: dict[str, str],
        query_string: bytes,
        receive,
    ) -> Response:
        if method == "HEAD":  # Claude Code's reachability probes (HEAD / and HEAD /api/hello)
            return Response(status_code=200)
        if method == "GET" and sub.rstrip("/").endswith("/models"):
            return await self.list_models(sub, headers)
        provider = provider_from_path(sub) or provider_from_headers(headers)
        if method != "POST":
            return error_response(provider, 404, f"no route for {method} {sub}")
        query = dict(parse_qsl(query_string.decode("latin-1"))) if query_string else {}
        session = self.rt.sessions.by_token(find_token(path_token, headers, query))
        if session is None and provider is not None:  # nothing is read or recorded for an unknown token
            return AnsweredEarly(error_response(provider, 401, UNAUTHORIZED), headers)
        try:
            body = await read_body(receive, self.rt.max_body_bytes, headers)
        except BodyTooLarge as exc:
            if session is None or provider is None:
                answer = error_response(provider, 401 if session is None else 413, str(exc))
            else:
                answer = await self.refuse(session, provider, sub, 413, str(exc))
            return answer if exc.ended else AnsweredEarly(answer, headers)
        parsed, refusal = None, None
        try:
            parsed = parse_json(body, self.rt.max_json_depth) if body else None
        except TooDeep as exc:
            refusal = str(exc)
        except orjson.JSONDecodeError:
            pass  # the proxy answers (and records) invalid JSON
        provider = provider or detect_provider(sub, headers, parsed)
        if session is None:
            return error_response(provider, 401, UNAUTHORIZED)
        if provider is None:
            return error_response(None, 404, f"no provider API at POST {sub}")
        if refusal is not None:
            return await self.refuse(session, provider, sub, 400, f"invalid request: {refusal}", body)
        try:
            adapter = get_adapter(provider)
        except UnknownProvider as exc:
            return error_response(provider, 501, str(exc))
        if is_count_tokens(sub):
            return await self.count_tokens(session, adapter, sub, query, parsed)
        return await self.rt.proxy.model_call(
            session=session,
            provider=provider,
            adapter=adapter,
            path=sub,
            query=query,
            body=body,
            parsed=parsed,
        )

    async def refuse(
        self, session, provider: str, path: str, status: int, message: str, body: bytes = b""
    ) -> Response:
        """A valid session's call refused at the door (too large, too deep): recorded all the same."""
        if is_count_tokens(path):  # not a model call: nothing to record
            return error_response(provider, status, message)
        return await self.rt.proxy.refuse(
            session=session, provider=provider, path=path, status=status, message=message, body=body
        )

    async def count_tokens(self, session, adapter, path, query, raw) -> Response:
        """Not a model call (nothing recorded): the prompt rendered and tokenized as the engine would."""
        rt = self.rt
        try:
            if not isinstance(raw, dict):
                raise RequestError("request body must be a JSON object")
            norm = normalize(adapter, adapter.count_tokens_body(raw), path=path, query=query)
        except (RequestError, KeyError, TypeError, ValueError) as exc:
            return error_response(adapter.name, 400, f"invalid request: {exc}")
        chat = dict(norm.chat)
        strip_volatile(chat)
        rep = rt.pool.pick(session.session_id)
        try:
            n = await rt.counter.count(
                chat, rep.url, await rt.pool.model_for(rep), await rt.pool.context_limit()
            )
        except UpstreamError as exc:
            return error_response(adapter.name, 502, f"token count failed: {exc.message}")
        except ValueError as exc:  # the template cannot render these messages
            return error_response(adapter.name, 400, f"token count failed: {exc}")
        return JSONResponse(adapter.count_tokens_answer(n))

    async def list_models(self, sub: str, headers: dict[str, str]) -> Response:
        """The served model, in the shape of the API that asks (no token needed: read-only)."""
        pool = self.rt.pool
        rep = next((r for r in pool.replicas if r.healthy), pool.replicas[0])
        provider = provider_for_models(sub, headers)
        try:
            name = await pool.model_for(rep)
        except UpstreamError as exc:
            return error_response(provider, 502, exc.message)
        return JSONResponse(get_adapter(provider or "openai_chat").models_body(name))
