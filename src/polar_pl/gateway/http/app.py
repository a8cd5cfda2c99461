"""The gateway's FastAPI app: admin routes and health here; harness traffic in harness_routes.py.

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

from polar_pl.chat.reasoning import check_reasoning_parser
from polar_pl.gateway.call.gate import PAUSE_MODES, EngineGate
from polar_pl.gateway.call.proxy import Proxy
from polar_pl.gateway.call.sidecalls import DEFAULT_SIDE_RULES, SideCallRule
from polar_pl.gateway.faithful.history import TokenFaithful
from polar_pl.gateway.http.detect import provider_from_headers, provider_from_path, split_session_path
from polar_pl.gateway.http.errors import error_response
from polar_pl.gateway.http.harness_routes import HarnessRoutes
from polar_pl.gateway.store.sessions import SessionRegistry
from polar_pl.gateway.store.traces import TraceStore
from polar_pl.gateway.upstream.client import make_client
from polar_pl.gateway.upstream.replicas import ReplicaPool
from polar_pl.gateway.upstream.tokencount import TokenCounter

log = logging.getLogger(__name__)
ADMIN_PATHS = ("/admin/", "/health")


class GatewayRuntime:
    """Everything the routes share: store, sessions, replicas, upstream client, proxy."""

    def __init__(
        self,
        upstreams: list[str],
        store_path: str | Path,
        *,
        admin_token: str,
        tokenizer_dir: str | Path | None = None,
        model: str | None = None,
        side_rules: tuple[SideCallRule, ...] | None = None,
        client: str = "aiohttp",
        store_synchronous: str = "NORMAL",
        public_url: str | None = None,
        health_interval: float = 2.0,
        connect_timeout: float = 5.0,
        read_timeout: float = 600.0,
        token_faithful: bool | None = None,
        max_tokens_cap: int | None = None,
        pause_timeout: float = 300.0,
        reasoning_parser: str | None = None,
    ):
        """token_faithful: splice sampled tokens into prompts and call the engine's token-in
        route (faithful/); None = on when the gateway has a tokenizer (tokenizer_dir), since
        both engines (vLLM, embedded) accept token prompts. max_tokens_cap: upper bound on each
        call's response length (None: the harness's request). pause_timeout: how long a call
        waits at a paused gate before a 503 / 529 with Retry-After. reasoning_parser: the
        engine's (vLLM `--reasoning-parser`, "qwen3"), applied to token-in answers as the engine
        applies it to chat answers."""
        self.admin_token = admin_token
        self.public_url = public_url.rstrip("/") if public_url else None
        self.store = TraceStore(store_path, synchronous=store_synchronous)
        self.sessions = SessionRegistry(self.store)
        # read_timeout bounds the wait for each engine chunk (a stuck engine -> 504), not the call
        self.client = make_client(client, connect_timeout=connect_timeout, read_timeout=read_timeout)
        self.pool = ReplicaPool(upstreams, self.client, model=model, health_interval=health_interval)
        self.counter = TokenCounter(tokenizer_dir, self.client)
        if token_faithful is None:
            token_faithful = tokenizer_dir is not None
        if token_faithful and tokenizer_dir is None:
            raise ValueError("token_faithful: needs tokenizer_dir (the served model's directory)")
        self.gate = EngineGate(wait_timeout=pause_timeout)
        self.loop: asyncio.AbstractEventLoop | None = None  # the serving loop, set at startup
        self.proxy = Proxy(
            store=self.store,
            sessions=self.sessions,
            pool=self.pool,
            client=self.client,
            side_rules=tuple(DEFAULT_SIDE_RULES if side_rules is None else side_rules),
            faithful=TokenFaithful(
                self.counter.tokenizer, check_reasoning_parser(reasoning_parser), load=self.store.records
            )
            if token_faithful
            else None,
            max_tokens_cap=max_tokens_cap,
            gate=self.gate,
        )

    def stats(self) -> dict[str, float]:
        snap = self.proxy.stats.snapshot() | self.gate.snapshot()
        snap["gateway/token_faithful"] = float(self.proxy.faithful is not None)
        snap["gateway/healthy_replicas"] = float(sum(r.healthy for r in self.pool.replicas))
        return snap

    async def aclose(self) -> None:
        await self.pool.stop()
        await self.client.close()
        self.store.close()


class GatewayFastAPI(FastAPI):
    """FastAPI for the admin side; harness paths go straight to `self.harness` (raw ASGI)."""

    harness: HarnessRoutes

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "http" and not scope["path"].startswith(ADMIN_PATHS):
            await self.harness(scope, receive, send)
        else:
            await super().__call__(scope, receive, send)


def _session_json(info, base: str) -> dict[str, Any]:
    d = asdict(info)
    d.pop("token")
    d["base_url"] = f"{base}/s/{info.token}"
    return d


def create_app(
    upstreams: list[str], store_path: str | Path, *, admin_token: str | None = None, **options: Any
) -> FastAPI:
    """Build the gateway app. options: tokenizer_dir, model, side_rules, client ("aiohttp" or
    "httpx"), store_synchronous, public_url, health_interval, connect_timeout, read_timeout,
    token_faithful, max_tokens_cap, pause_timeout, reasoning_parser (see GatewayRuntime)."""
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
        info = rt.sessions.create(
            **fields, meta=body.get("meta") if isinstance(body.get("meta"), dict) else None
        )
        return JSONResponse(
            {
                "session_id": info.session_id,
                "token": info.token,
                "base_url": f"{base_of(request)}/s/{info.token}",
            }
        )

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
