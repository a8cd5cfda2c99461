"""The gateway's FastAPI app: admin routes, probes, and one catch-all route for harness traffic.

Harness traffic is routed by hand rather than by one FastAPI route per provider path: CLIs reach
the same API under `/v1/...`, `/...` and `/s/<token>/...`, and the provider is decided from the
path, then the headers, then the body (detect.py). Thin handlers; the model-call path is in
proxy.py.
"""

from __future__ import annotations

import logging
import secrets
from dataclasses import asdict
from pathlib import Path
from typing import Any

import orjson
from fastapi import FastAPI, Request
from starlette.responses import JSONResponse, Response

from polar_pl.gateway.detect import (
    detect_provider,
    find_token,
    is_count_tokens,
    provider_from_headers,
    provider_from_path,
    split_session_path,
)
from polar_pl.gateway.errors import error_response
from polar_pl.gateway.providers import RequestError, UnknownProvider, get_adapter
from polar_pl.gateway.proxy import Proxy
from polar_pl.gateway.replicas import ReplicaPool
from polar_pl.gateway.sessions import SessionRegistry
from polar_pl.gateway.sidecalls import DEFAULT_SIDE_RULES, SideCallRule
from polar_pl.gateway.store import TraceStore
from polar_pl.gateway.tokencount import TokenCounter
from polar_pl.gateway.upstream import UpstreamError, make_client
from polar_pl.gateway.volatile import strip_volatile

log = logging.getLogger(__name__)


class GatewayRuntime:
    """Everything the routes share: store, sessions, replicas, upstream client, proxy."""

    def __init__(self, upstreams: list[str], store_path: str | Path, *, admin_token: str,
                 tokenizer_dir: str | Path | None = None, model: str | None = None,
                 side_rules: tuple[SideCallRule, ...] | None = None, client: str = "aiohttp",
                 store_synchronous: str = "FULL", public_url: str | None = None,
                 health_interval: float = 2.0, connect_timeout: float = 5.0, read_timeout: float = 600.0):
        self.admin_token = admin_token
        self.public_url = public_url.rstrip("/") if public_url else None
        self.store = TraceStore(store_path, synchronous=store_synchronous)
        self.sessions = SessionRegistry(self.store)
        # read_timeout bounds the wait for each engine chunk (a stuck engine -> 504), not the call
        self.client = make_client(client, connect_timeout=connect_timeout, read_timeout=read_timeout)
        self.pool = ReplicaPool(upstreams, self.client, model=model, health_interval=health_interval)
        self.counter = TokenCounter(tokenizer_dir, self.client)
        self.proxy = Proxy(store=self.store, sessions=self.sessions, pool=self.pool, client=self.client,
                           side_rules=tuple(DEFAULT_SIDE_RULES if side_rules is None else side_rules))

    async def aclose(self) -> None:
        await self.pool.stop()
        await self.client.close()
        self.store.close()


def _session_json(info, base: str) -> dict[str, Any]:
    d = asdict(info)
    d.pop("token")
    d["base_url"] = f"{base}/s/{info.token}"
    return d


def create_app(upstreams: list[str], store_path: str | Path, *, admin_token: str | None = None,
               **options: Any) -> FastAPI:
    """Build the gateway app. options: tokenizer_dir, model, side_rules, client ("aiohttp" or
    "httpx"), store_synchronous, public_url, health_interval, connect_timeout, read_timeout
    (see GatewayRuntime)."""
    rt = GatewayRuntime(upstreams, store_path, admin_token=admin_token or secrets.token_urlsafe(24), **options)

    from contextlib import asynccontextmanager

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        rt.pool.start()
        try:
            yield
        finally:
            await rt.aclose()  # uvicorn has drained in-flight requests; flush the store last

    app = FastAPI(title="polar_pl gateway", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)
    app.state.runtime = rt

    def base_of(request: Request) -> str:
        return rt.public_url or str(request.base_url).rstrip("/")

    def admin_denied(request: Request) -> Response | None:
        auth = request.headers.get("authorization", "")
        if auth[:7].lower() == "bearer " and secrets.compare_digest(auth[7:].strip(), rt.admin_token):
            return None
        return JSONResponse({"error": "admin token required (Authorization: Bearer <admin token>)"}, 401)

    @app.exception_handler(Exception)
    async def unhandled(request: Request, exc: Exception) -> Response:
        log.exception("gateway error on %s %s", request.method, request.url.path)
        _, sub = split_session_path(request.url.path)
        provider = provider_from_path(sub) or provider_from_headers(request.headers)
        return error_response(provider, 500, f"internal gateway error: {type(exc).__name__}")

    @app.post("/admin/sessions")
    async def create_session(request: Request) -> Response:
        if denied := admin_denied(request):
            return denied
        try:
            body = orjson.loads(await request.body() or b"{}")
        except orjson.JSONDecodeError:
            return JSONResponse({"error": "body must be JSON"}, 400)
        if not isinstance(body, dict):
            return JSONResponse({"error": "body must be a JSON object"}, 400)
        fields = {k: body.get(k) for k in ("task_id", "group_id", "rollout_id", "harness")}
        bad = [k for k, v in fields.items() if v is not None and not isinstance(v, str)]
        if bad:
            return JSONResponse({"error": f"{', '.join(bad)}: must be strings"}, 400)
        info = rt.sessions.create(**fields, meta=body.get("meta") if isinstance(body.get("meta"), dict) else None)
        return JSONResponse({"session_id": info.session_id, "token": info.token,
                             "base_url": f"{base_of(request)}/s/{info.token}"})

    @app.get("/admin/sessions")
    async def list_sessions(request: Request) -> Response:
        if denied := admin_denied(request):
            return denied
        return JSONResponse([_session_json(s, base_of(request)) for s in rt.sessions.all()])

    @app.get("/admin/sessions/{session_id}")
    async def get_session(session_id: str, request: Request) -> Response:
        if denied := admin_denied(request):
            return denied
        info = rt.sessions.get(session_id)
        if info is None:
            return JSONResponse({"error": f"no session {session_id}"}, 404)
        d = _session_json(info, base_of(request))
        d["calls"] = rt.store.count(session_id)
        return JSONResponse(d)

    @app.get("/admin/sessions/{session_id}/records")
    async def get_records(session_id: str, request: Request) -> Response:
        if denied := admin_denied(request):
            return denied
        if rt.sessions.get(session_id) is None:
            return JSONResponse({"error": f"no session {session_id}"}, 404)
        import asyncio

        records = await asyncio.to_thread(rt.store.records, session_id)
        return Response(orjson.dumps([r.to_dict() for r in records]), media_type="application/json")

    @app.delete("/admin/sessions/{session_id}")
    async def delete_session(session_id: str, request: Request) -> Response:
        if denied := admin_denied(request):
            return denied
        info = rt.sessions.delete(session_id)
        if info is None:
            return JSONResponse({"error": f"no session {session_id}"}, 404)
        rt.pool.release(session_id)
        return JSONResponse({"session_id": session_id, "deleted": True})

    @app.get("/health")
    async def health() -> Response:
        reps = [{"url": r.url, "healthy": r.healthy, "inflight": r.inflight, "sessions": len(r.sessions)}
                for r in rt.pool.replicas]
        return JSONResponse({"status": "ok", "replicas": reps})

    @app.api_route("/{full_path:path}", methods=["GET", "POST", "HEAD", "PUT", "PATCH", "DELETE", "OPTIONS"])
    async def harness(request: Request, full_path: str) -> Response:
        path_token, sub = split_session_path(request.url.path)
        method = request.method
        if method == "HEAD":  # Claude Code's reachability probes (HEAD / and HEAD /api/hello)
            return Response(status_code=200)
        if method == "GET" and sub.rstrip("/").endswith("/models"):
            return await list_models(request, sub)
        provider = provider_from_path(sub) or provider_from_headers(request.headers)
        if method != "POST":
            return error_response(provider, 404, f"no route for {method} {sub}")
        body = await request.body()
        if provider is None:
            try:
                provider = detect_provider(sub, request.headers, orjson.loads(body))
            except orjson.JSONDecodeError:
                provider = None
        query = dict(request.query_params)
        session = rt.sessions.by_token(find_token(path_token, request.headers, query))
        if session is None:  # nothing is recorded under an unknown token
            return error_response(provider, 401, "invalid or missing session token (API key)")
        if provider is None:
            return error_response(None, 404, f"no provider API at POST {sub}")
        try:
            adapter = get_adapter(provider)
        except UnknownProvider as exc:
            return error_response(provider, 501, str(exc))
        if is_count_tokens(sub) or ":countTokens" in sub:
            return await count_tokens(session, provider, adapter, sub, query, body)
        return await rt.proxy.model_call(session=session, provider=provider, adapter=adapter,
                                         path=sub, query=query, body=body)

    async def count_tokens(session, provider, adapter, path, query, body) -> Response:
        try:
            raw = orjson.loads(body)
            if not isinstance(raw, dict):
                raise RequestError("request body must be a JSON object")
            if provider == "google" and isinstance(raw.get("generateContentRequest"), dict):
                raw = raw["generateContentRequest"]
            raw = {"max_tokens": 1, **raw} if provider == "anthropic" else raw
            norm = adapter.to_chat(raw, path=path, query=query)
        except (RequestError, orjson.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
            return error_response(provider, 400, f"invalid request: {exc}")
        chat = dict(norm.chat)
        strip_volatile(chat)
        rep = rt.pool.pick(session.session_id)
        try:
            n = await rt.counter.count(chat, rep.url, await rt.pool.model_for(rep))
        except UpstreamError as exc:
            return error_response(provider, 502, f"token count failed: {exc.message}")
        except ValueError as exc:  # the template cannot render these messages
            return error_response(provider, 400, f"token count failed: {exc}")
        return JSONResponse({"totalTokens": n} if provider == "google" else {"input_tokens": n})

    async def list_models(request: Request, sub: str) -> Response:
        rep = next((r for r in rt.pool.replicas if r.healthy), rt.pool.replicas[0])
        provider = "google" if "/v1beta/" in sub else provider_from_headers(request.headers)
        try:
            name = await rt.pool.model_for(rep)
        except UpstreamError as exc:
            return error_response(provider, 502, exc.message)
        if provider == "google":
            return JSONResponse({"models": [{"name": f"models/{name}", "displayName": name,
                                             "supportedGenerationMethods": ["generateContent", "countTokens"]}]})
        if provider == "anthropic":
            return JSONResponse({"data": [{"type": "model", "id": name, "display_name": name,
                                           "created_at": "1970-01-01T00:00:00Z"}],
                                 "has_more": False, "first_id": name, "last_id": name})
        return JSONResponse({"object": "list",
                             "data": [{"id": name, "object": "model", "created": 0, "owned_by": "polar_pl"}]})

    return app
