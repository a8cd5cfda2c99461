"""Prometheus `GET /metrics` for polar_pl's servers: the gateway, the embedded engine and the
rollout service.

Each server has its own `CollectorRegistry` (several servers share a process: tests, a rollout
service with its gateway and engine), whose collectors mostly read, at scrape time, the state the
server keeps anyway. `serve_metrics` mounts the route on a server's FastAPI app and counts the
app's requests by route template and status. The route needs no token unless the server was given
a metrics token (`--metrics-token`, $POLAR_METRICS_TOKEN); it exposes counts and timings, never a
prompt or a completion.
"""

from __future__ import annotations

import argparse
import os
import secrets
from collections.abc import Iterable, Mapping
from typing import Any

from fastapi import APIRouter, FastAPI, Request
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from starlette.responses import JSONResponse, Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

TOKEN_ENV = "POLAR_METRICS_TOKEN"

router = APIRouter()


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """A server CLI's `--metrics-token`."""
    parser.add_argument(
        "--metrics-token",
        default=os.environ.get(TOKEN_ENV),
        help=f"bearer token GET /metrics needs (default: ${TOKEN_ENV}, which keeps it off the command "
        "line; neither: /metrics is open, it holds no prompt or completion text)",
    )


@router.get("/metrics", include_in_schema=False)
def metrics(request: Request) -> Response:
    # a plain def: FastAPI runs it on a worker thread, so a slow collector never stalls the loop
    state = request.app.state
    token = state.metrics_token
    if token is not None:
        auth = request.headers.get("authorization", "")
        given = auth[7:].strip() if auth[:7].lower() == "bearer " else ""
        if not secrets.compare_digest(given.encode(), token.encode()):
            message = "the metrics token is required (Authorization: Bearer <metrics token>)"
            body = {"error": {"message": message, "type": "auth_error"}}
            return JSONResponse(body, 401, headers={"www-authenticate": "Bearer"})
    return Response(generate_latest(state.metrics_registry), media_type=CONTENT_TYPE_LATEST)


class CountRequests:
    """ASGI middleware: the app's requests by route template (never the raw path, whose values
    have no bound) and status. Outside the exception handlers' 500, which it counts as 500."""

    def __init__(self, app: ASGIApp, counter: Counter) -> None:
        self.app, self.counter = app, counter

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        status = 500

        async def send_status(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_status)
        finally:
            route = getattr(scope.get("route"), "path", "unmatched")
            self.counter.labels(route, str(status)).inc()


def serve_metrics(app: FastAPI, registry: CollectorRegistry, *, token: str | None, namespace: str) -> None:
    """Mount GET /metrics (behind `token` when given) and count the app's requests in `registry`
    as `<namespace>_http_requests_total{route, status}`."""
    app.state.metrics_registry = registry
    app.state.metrics_token = token or None
    requests = Counter(
        "http_requests",
        "HTTP requests answered, by route template and status",
        ["route", "status"],
        namespace=namespace,
        registry=registry,
    )
    app.add_middleware(CountRequests, counter=requests)
    app.include_router(router)


def counter(name: str, doc: str, value: float | Mapping[Any, float], labels: Iterable[str] = ()):
    """A counter family read at scrape time: one value, or values by label tuple."""
    family = CounterMetricFamily(name, doc, labels=list(labels))
    for key, v in value.items() if isinstance(value, Mapping) else [((), value)]:
        family.add_metric(list(key), v)
    return family


def gauge(name: str, doc: str, value: float | Mapping[Any, float], labels: Iterable[str] = ()):
    """A gauge family read at scrape time: one value, or values by label tuple."""
    family = GaugeMetricFamily(name, doc, labels=list(labels))
    for key, v in value.items() if isinstance(value, Mapping) else [((), value)]:
        family.add_metric(list(key), v)
    return family
