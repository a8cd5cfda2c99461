"""The engine's FastAPI app: the engine contract of docs/architecture.md over any `GenerationBackend`.

`create_app` puts the backend, the served model name, the reasoning parser and the admin token
on `app.state`,
installs the error handlers (every error in vLLM's error shape, with `x-policy-version`),
includes the module-level router of `engine/routes.py`, whose handlers read that state, and
serves Prometheus `GET /metrics` (engine/metrics.py).
"""

from __future__ import annotations

from contextlib import asynccontextmanager
from http import HTTPStatus

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError

from polar_pl.chat.reasoning import check_reasoning_parser
from polar_pl.engine.backend import GenerationBackend
from polar_pl.engine.errors import EngineError, error_response
from polar_pl.engine.metrics import engine_registry
from polar_pl.engine.routes import backend_of, router, version_headers
from polar_pl.utils.metrics import serve_metrics


@asynccontextmanager
async def lifespan(app: FastAPI):
    backend = app.state.backend
    backend.start()
    try:
        yield
    finally:
        backend.close()


async def engine_error(request: Request, exc: EngineError):
    return error_response(exc, version_headers(backend_of(request)))


async def validation_error(request: Request, exc: RequestValidationError):
    first = exc.errors()[0] if exc.errors() else {}
    loc = ".".join(str(p) for p in first.get("loc", ()) if p != "body")
    msg = f"{loc}: {first.get('msg', 'invalid request')}" if loc else first.get("msg", "invalid request")
    error = EngineError(msg, HTTPStatus.BAD_REQUEST, param=loc or None)
    return error_response(error, version_headers(backend_of(request)))


async def internal_error(request: Request, exc: Exception):
    error = EngineError(f"{type(exc).__name__}: {exc}", 500)
    return error_response(error, version_headers(backend_of(request)))


def create_app(
    backend: GenerationBackend,
    served_model_name: str | None = None,
    reasoning_parser: str | None = None,
    admin_token: str | None = None,
    metrics_token: str | None = None,
) -> FastAPI:
    """Build the app. The backend is started and closed with the app's lifespan.
    reasoning_parser: None or "qwen3" (vLLM's `--reasoning-parser qwen3`, see chat/reasoning.py).
    admin_token: the bearer token weight updates need; None turns the weight route off.
    metrics_token: the bearer token GET /metrics needs (engine/metrics.py); None: open."""
    app = FastAPI(title="polar_pl engine", lifespan=lifespan)
    app.state.backend = backend
    app.state.model_name = served_model_name or backend.model_name
    app.state.reasoning_parser = check_reasoning_parser(reasoning_parser)
    app.state.admin_token = admin_token
    # starlette types handlers as taking any Exception; each of these only gets its own class
    app.add_exception_handler(EngineError, engine_error)  # type: ignore[arg-type]
    app.add_exception_handler(RequestValidationError, validation_error)  # type: ignore[arg-type]
    app.add_exception_handler(Exception, internal_error)
    app.include_router(router)
    serve_metrics(app, engine_registry(backend), token=metrics_token, namespace="polar_engine")
    return app
