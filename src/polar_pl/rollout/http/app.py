"""The rollout service's routes: polar_pl as an RL environment for any trainer (verl, TRL, NeMo RL,
a notebook, a plain PyTorch loop). Thin handlers over a `RolloutServer` (server.py); the schema
is at /openapi.json, the docs at /docs.

    POST /v1/tasks              submit task rows (a `--feed queue` service): one group each
    GET  /v1/groups?n=&timeout= the next n finished groups, with rows and rewards (long poll)
    GET  /v1/groups/stream      finished groups as they come, one JSON object per line (at most
                                `max_streams` open at once; one more gets a 429)
    POST /v1/groups/consumed    mark groups trained on (with consume=false: the resume cursor)
    POST /v1/weights            push new weights from a directory of safetensors to the engines
    POST /v1/policy_version     report a version the trainer pushed by itself (vLLM NCCL)
    GET  /v1/policy_version     the version the engines sample with now (staleness reference)
    GET  /v1/stats, /v1/state   gauges; the resume cursor
    GET  /metrics               Prometheus text (metrics.py); open unless a metrics token is set

Every /v1 route needs `Authorization: Bearer <token>`; errors are `{"error": {"message", "type"}}`.
A group counts as consumed only once it was written to a reader still connected (delivery.py).
"""

from __future__ import annotations

import secrets
from typing import TYPE_CHECKING, Any

from fastapi import Depends, FastAPI, Query, Request
from fastapi.exceptions import RequestValidationError
from starlette.responses import JSONResponse, Response

from polar_pl.rollout.http.delivery import GroupOutbox, GroupsAnswer, GroupStream
from polar_pl.rollout.http.metrics import rollout_registry
from polar_pl.rollout.http.schema import (
    ConsumedRequest,
    ErrorResponse,
    GroupsResponse,
    TasksRequest,
    TasksResponse,
    VersionRequest,
    VersionResponse,
    WeightsRequest,
)
from polar_pl.utils.metrics import serve_metrics

if TYPE_CHECKING:
    from polar_pl.rollout.http.server import RolloutServer


class ApiError(Exception):
    def __init__(self, status: int, message: str, kind: str = "invalid_request_error") -> None:
        super().__init__(message)
        self.status, self.message, self.kind = status, message, kind


def _error(status: int, message: str, kind: str) -> JSONResponse:
    return JSONResponse({"error": {"message": message, "type": kind}}, status_code=status)


def _validation_message(exc: RequestValidationError) -> str:
    parts = []
    for e in exc.errors():
        where = ".".join(str(x) for x in e.get("loc", ()) if x not in ("body", "query"))
        parts.append(f"{where}: {e.get('msg')}" if where else str(e.get("msg")))
    return "; ".join(parts) or "invalid request"


def create_app(
    server: RolloutServer, *, token: str, max_streams: int = 64, metrics_token: str | None = None
) -> FastAPI:
    """server: a `RolloutServer`. token: the bearer token every /v1 route requires. max_streams:
    how many GET /v1/groups/stream may be open at once. metrics_token: the bearer token
    GET /metrics needs (None: open)."""
    outbox = GroupOutbox(server.client, max_streams=max_streams)
    app = FastAPI(title="polar_pl rollout service", version="1", summary=__doc__.split("\n")[0],
                  responses={401: {"model": ErrorResponse}, 422: {"model": ErrorResponse}})  # fmt: skip
    app.add_exception_handler(ApiError, lambda _, exc: _error(exc.status, exc.message, exc.kind))
    app.add_exception_handler(
        RequestValidationError, lambda _, exc: _error(422, _validation_message(exc), "invalid_request_error")
    )

    def authorized(request: Request) -> None:
        given = request.headers.get("authorization", "").removeprefix("Bearer ").strip()
        if not secrets.compare_digest(given.encode(), token.encode()):
            raise ApiError(401, "missing or wrong bearer token (Authorization: Bearer <token>)", "auth_error")

    v1 = [Depends(authorized)]

    @app.get("/health")
    def health() -> dict[str, str]:
        return {"status": "ok"}

    @app.post(
        "/v1/tasks", dependencies=v1, response_model=TasksResponse, responses={409: {"model": ErrorResponse}}
    )
    def submit(req: TasksRequest) -> TasksResponse:
        try:
            tasks = server.tasks_from_rows(req.tasks)
        except ValueError as exc:  # TaskFormatError names the task and the field
            raise ApiError(422, str(exc)) from None
        try:
            return TasksResponse(seqs=server.client.submit_tasks(tasks))
        except TypeError as exc:
            raise ApiError(409, f"{exc} (start the service with --feed queue)", "conflict") from None

    @app.get(
        "/v1/groups",
        dependencies=v1,
        response_model=GroupsResponse,
        responses={408: {"model": ErrorResponse}, 503: {"model": ErrorResponse}},
    )
    async def groups(
        n: int = Query(1, ge=1, le=1024, description="groups to wait for"),
        timeout: float = Query(60.0, gt=0, le=3600, description="seconds to wait for them"),
        consume: bool = Query(True, description="false: mark them consumed later (POST /v1/groups/consumed)"),
    ) -> Response:
        return GroupsAnswer(outbox, n, timeout, consume)

    @app.get("/v1/groups/stream", dependencies=v1,
             responses={200: {"content": {"application/x-ndjson": {}}}, 429: {"model": ErrorResponse}})  # fmt: skip
    async def stream(
        limit: int | None = Query(None, ge=1, description="stop after this many groups"),
    ) -> Response:
        if not outbox.open_stream():
            raise ApiError(429, f"{max_streams} streams are open already (--max-streams): close one, "
                           "or poll GET /v1/groups", "rate_limit_error")  # fmt: skip
        return GroupStream(outbox, limit)

    @app.post("/v1/groups/consumed", dependencies=v1)
    def consumed(req: ConsumedRequest) -> dict[str, bool]:
        server.client.mark_consumed(req.seqs)
        return {"ok": True}

    @app.post("/v1/weights", dependencies=v1, response_model=VersionResponse,
              responses={400: {"model": ErrorResponse}, 502: {"model": ErrorResponse}})  # fmt: skip
    def weights(req: WeightsRequest) -> VersionResponse:
        try:
            return VersionResponse(policy_version=server.push_from_disk(req.path))
        except FileNotFoundError as exc:
            raise ApiError(400, f"path: {exc}") from None
        except (ValueError, KeyError) as exc:  # the engine refused the weights and kept its own
            raise ApiError(400, f"weights refused: {exc}") from None
        except Exception as exc:
            raise ApiError(502, f"weight push failed: {type(exc).__name__}: {exc}", "engine_error") from None

    @app.post("/v1/policy_version", dependencies=v1, response_model=VersionResponse)
    def policy_version(req: VersionRequest) -> VersionResponse:
        server.client.set_policy_version(req.version)
        return VersionResponse(policy_version=req.version)

    @app.get("/v1/policy_version", dependencies=v1, response_model=VersionResponse)
    def current_version() -> VersionResponse:
        return VersionResponse(policy_version=server.policy_version())

    @app.get("/v1/stats", dependencies=v1)
    def stats() -> dict[str, float]:
        return {**server.client.metrics(), **outbox.metrics()}

    @app.get("/v1/state", dependencies=v1)
    def state() -> dict[str, Any]:
        return server.client.state_dict()

    serve_metrics(app, rollout_registry(server, outbox), token=metrics_token, namespace="polar_rollout")
    return app
