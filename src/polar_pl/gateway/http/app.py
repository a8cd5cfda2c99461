"""The gateway's FastAPI app: admin routes and health here; harness traffic in harness_routes.py;
the state both share in ../runtime.py.

Harness traffic (every path outside /admin and /health) skips FastAPI's routing and middleware:
`GatewayFastAPI.__call__` hands it to the raw-ASGI handler, the hot path measured in
bench/gateway.py. CLIs reach the same API under `/v1/...`, `/...` and `/s/<token>/...`, so that
handler routes by hand (detect.py).
"""

from __future__ import annotations

import asyncio
import logging
import secrets
from dataclasses import asdict
from pathlib import Path
from typing import Any

import orjson
from fastapi import FastAPI, Request
from starlette.responses import JSONResponse, Response

from polar_pl.gateway.call.gate import PAUSE_MODES
from polar_pl.gateway.http.detect import provider_from_headers, provider_from_path, split_session_path
from polar_pl.gateway.http.errors import error_response
from polar_pl.gateway.http.harness_routes import HarnessRoutes
from polar_pl.gateway.runtime import GatewayRuntime

log = logging.getLogger(__name__)
ADMIN_PATHS = ("/admin/", "/health")


class GatewayFastAPI(FastAPI):
    """FastAPI for the admin side; harness paths go straight to `self.harness` (raw ASGI)."""

    harness: HarnessRoutes

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "http" and not scope["path"].startswith(ADMIN_PATHS):
            await self.harness(scope, receive, send)
        else:
            await super().__call__(scope, receive, send)


def _session_json(info) -> dict[str, Any]:
    d = asdict(info)
    d.pop("token_hash")  # the token went to whoever created the session, and only to them
    return d


def create_app(
    upstreams: list[str], store_path: str | Path, *, admin_token: str | None = None, **options: Any
) -> FastAPI:
    """Build the gateway app. options: tokenizer_dir, model, side_rules, client ("aiohttp" or
    "httpx"), store_synchronous, public_url, health_interval, connect_timeout, read_timeout,
    token_faithful, max_tokens_cap, cap_policy, sampling, pause_timeout, reasoning_parser (see GatewayRuntime)."""
    rt = GatewayRuntime(
        upstreams, store_path, admin_token=admin_token or secrets.token_urlsafe(24), **options
    )

    from contextlib import asynccontextmanager

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        rt.loop = asyncio.get_running_loop()
        rt.pool.start()
        try:
            yield
        finally:
            await rt.aclose()  # uvicorn has drained in-flight requests; flush the store last

    app = GatewayFastAPI(
        title="polar_pl gateway", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None
    )
    app.state.runtime = rt
    app.harness = HarnessRoutes(rt)

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
        info, token = rt.sessions.create(
            **fields, meta=body.get("meta") if isinstance(body.get("meta"), dict) else None
        )
        return JSONResponse(
            {
                "session_id": info.session_id,
                "token": token,
                "base_url": f"{base_of(request)}/s/{token}",
            }
        )

    @app.get("/admin/sessions")
    async def list_sessions(request: Request) -> Response:
        if denied := admin_denied(request):
            return denied
        return JSONResponse([_session_json(s) for s in rt.sessions.all()])

    @app.get("/admin/sessions/{session_id}")
    async def get_session(session_id: str, request: Request) -> Response:
        if denied := admin_denied(request):
            return denied
        info = rt.sessions.get(session_id)
        if info is None:
            return JSONResponse({"error": f"no session {session_id}"}, 404)
        d = _session_json(info)
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
        rt.proxy.forget(session_id)
        return JSONResponse({"session_id": session_id, "deleted": True})

    @app.post("/admin/pause")
    async def pause(request: Request) -> Response:
        """Body {"mode": "drain"|"keep"} (default drain): new engine calls wait at the gate;
        drain answers once the calls in flight have finished."""
        if denied := admin_denied(request):
            return denied
        try:
            body = orjson.loads(await request.body() or b"{}")
        except orjson.JSONDecodeError:
            return JSONResponse({"error": "body must be JSON"}, 400)
        mode = body.get("mode", "drain") if isinstance(body, dict) else None
        if mode not in PAUSE_MODES:
            return JSONResponse({"error": f"mode: {mode!r}; allowed: {', '.join(PAUSE_MODES)}"}, 400)
        await rt.gate.pause(mode)
        return JSONResponse({"paused": True, "mode": mode, "in_flight": rt.gate.in_flight})

    @app.post("/admin/resume")
    async def resume(request: Request) -> Response:
        if denied := admin_denied(request):
            return denied
        rt.gate.resume()
        return JSONResponse({"paused": False, "in_flight": rt.gate.in_flight})

    @app.get("/admin/stats")
    async def stats(request: Request) -> Response:
        if denied := admin_denied(request):
            return denied
        snap = rt.stats()
        snap["gateway/inflight"] = float(sum(r.inflight for r in rt.pool.replicas))
        return JSONResponse(snap)

    @app.get("/health")
    async def health() -> Response:
        reps = [
            {"url": r.url, "healthy": r.healthy, "inflight": r.inflight, "sessions": len(r.sessions)}
            for r in rt.pool.replicas
        ]
        return JSONResponse({"status": "ok", "replicas": reps})

    return app
