"""The gateway's FastAPI app: the admin router, health (admin.py) and Prometheus `/metrics`
(metrics.py) on FastAPI; harness traffic on the raw-ASGI handler (harness_routes.py); the state
both share in ../runtime.py, on `app.state.runtime`. `/metrics` is not a harness route: no
session token applies to it and nothing is recorded; it needs the metrics token when one is set.

Harness traffic (every path outside /admin and /health) skips FastAPI's routing and middleware:
`GatewayFastAPI.__call__` hands it to the raw-ASGI handler, the hot path measured in
bench/gateway.py. CLIs reach the same API under `/v1/...`, `/...` and `/s/<token>/...`, so that
handler routes by hand (detect.py).
"""

from __future__ import annotations

import asyncio
import logging
import secrets
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
from starlette.responses import Response

from polar_pl.gateway.http.admin import AdminDenied, admin, admin_denied, health_router
from polar_pl.gateway.http.detect import provider_from_headers, provider_from_path, split_session_path
from polar_pl.gateway.http.errors import error_response
from polar_pl.gateway.http.harness_routes import HarnessRoutes
from polar_pl.gateway.http.metrics import gateway_registry
from polar_pl.gateway.runtime import GatewayRuntime
from polar_pl.utils.metrics import serve_metrics

log = logging.getLogger(__name__)
ADMIN_PATHS = ("/admin/", "/health")
METRICS_PATH = "/metrics"


class GatewayFastAPI(FastAPI):
    """FastAPI for the admin side; harness paths go straight to `self.harness` (raw ASGI)."""

    harness: HarnessRoutes

    async def __call__(self, scope, receive, send) -> None:
        path = scope.get("path", "")
        if scope["type"] == "http" and not (path.startswith(ADMIN_PATHS) or path == METRICS_PATH):
            await self.harness(scope, receive, send)
        else:
            await super().__call__(scope, receive, send)


@asynccontextmanager
async def lifespan(app: FastAPI):
    rt: GatewayRuntime = app.state.runtime
    rt.loop = asyncio.get_running_loop()
    if rt.proxy.faithful is not None:  # every call needs it: loaded before serving, off the loop
        await asyncio.to_thread(rt.counter.load)
    rt.pool.start()
    try:
        yield
    finally:
        await rt.aclose()  # uvicorn has drained in-flight requests; flush the store last


async def unhandled(request: Request, exc: Exception) -> Response:
    log.exception("gateway error on %s %s", request.method, request.url.path)
    _, sub = split_session_path(request.url.path)
    provider = provider_from_path(sub) or provider_from_headers(request.headers)
    return error_response(provider, 500, f"internal gateway error: {type(exc).__name__}")


def create_app(
    upstreams: list[str],
    store_path: str | Path,
    *,
    admin_token: str | None = None,
    metrics_token: str | None = None,
    **options: Any,
) -> GatewayFastAPI:
    """Build the gateway app. metrics_token: the bearer token GET /metrics needs (None: open).
    options: tokenizer_dir, model, side_rules, client ("aiohttp" or "httpx"), store_synchronous,
    public_url, health_interval, connect_timeout, read_timeout, token_faithful, max_tokens_cap,
    cap_policy, sampling, pause_timeout, reasoning_parser, max_body_bytes, max_json_depth (see
    GatewayRuntime)."""
    rt = GatewayRuntime(
        upstreams, store_path, admin_token=admin_token or secrets.token_urlsafe(24), **options
    )
    app = GatewayFastAPI(
        title="polar_pl gateway", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None
    )
    app.state.runtime = rt
    app.harness = HarnessRoutes(rt)
    app.add_exception_handler(AdminDenied, admin_denied)  # type: ignore[arg-type]  # starlette: typed for Exception
    app.add_exception_handler(Exception, unhandled)
    app.include_router(admin)
    app.include_router(health_router)
    registry = gateway_registry(rt, app.harness.in_flight)
    serve_metrics(app, registry, token=metrics_token, namespace="polar_gateway")
    return app
