"""The gateway's admin API and health, as a module-level router: thin handlers reading the
`GatewayRuntime` from `request.app.state.runtime`, every /admin route behind the `require_admin`
dependency (the admin token as `Authorization: Bearer`).

  POST /admin/sessions                 register a session -> {session_id, token, base_url}
  GET  /admin/sessions[/{id}]          list / one session (with its call count)
  GET  /admin/sessions/{id}/records    the session's trace records
  DELETE /admin/sessions/{id}          forget a session (its records stay in the store)
  POST /admin/pause, /admin/resume     hold new engine calls around a weight push
  GET  /admin/stats, GET /health       gateway metrics; liveness with the replicas' state
"""

from __future__ import annotations

import asyncio
import secrets
from dataclasses import asdict
from typing import Any

import orjson
from fastapi import APIRouter, Depends, Request
from starlette.responses import JSONResponse, Response

from polar_pl.gateway.call.gate import PAUSE_MODES, DrainTimeout
from polar_pl.gateway.http.errors import RETRY_AFTER_S
from polar_pl.gateway.http.limits import BodyTooLarge, TooDeep, parse_json, read_body
from polar_pl.gateway.runtime import GatewayRuntime
from polar_pl.gateway.store.traces import StoreUnavailable


class AdminDenied(Exception):
    """Raised by `require_admin`; answered 401 by `admin_denied` (installed by create_app)."""


def runtime(request: Request) -> GatewayRuntime:
    return request.app.state.runtime


def require_admin(request: Request) -> None:
    auth = request.headers.get("authorization", "")
    if auth[:7].lower() == "bearer " and secrets.compare_digest(
        auth[7:].strip(), runtime(request).admin_token
    ):
        return
    raise AdminDenied


async def admin_denied(request: Request, exc: AdminDenied) -> Response:
    return JSONResponse({"error": "admin token required (Authorization: Bearer <admin token>)"}, 401)


admin = APIRouter(prefix="/admin", dependencies=[Depends(require_admin)])
health_router = APIRouter()


def base_of(request: Request) -> str:
    return runtime(request).public_url or str(request.base_url).rstrip("/")


def _session_json(info) -> dict[str, Any]:
    d = asdict(info)
    d.pop("token_hash")  # the token went to whoever created the session, and only to them
    return d


async def _json_object(request: Request) -> dict[str, Any] | Response:
    """The request's JSON object, bounded like harness bodies (size, nesting); or the 400 / 413."""
    rt = runtime(request)
    try:
        raw = await read_body(request.receive, rt.max_body_bytes, dict(request.headers))
        body = parse_json(raw, rt.max_json_depth) if raw else {}
    except BodyTooLarge as exc:
        return JSONResponse({"error": str(exc)}, 413)
    except (TooDeep, orjson.JSONDecodeError) as exc:
        return JSONResponse({"error": f"body must be JSON: {exc}"}, 400)
    if not isinstance(body, dict):
        return JSONResponse({"error": "body must be a JSON object"}, 400)
    return body


def _store_unavailable(exc: StoreUnavailable) -> Response:
    return JSONResponse({"error": str(exc)}, 503, headers={"retry-after": str(RETRY_AFTER_S)})


@admin.post("/sessions")
async def create_session(request: Request) -> Response:
    body = await _json_object(request)
    if isinstance(body, Response):
        return body
    fields = {k: body.get(k) for k in ("task_id", "group_id", "rollout_id", "harness")}
    bad = [k for k, v in fields.items() if v is not None and not isinstance(v, str)]
    if bad:
        return JSONResponse({"error": f"{', '.join(bad)}: must be strings"}, 400)
    meta = body.get("meta")
    if meta is not None and not isinstance(meta, dict):
        return JSONResponse({"error": "meta: must be an object"}, 400)
    try:
        info, token = runtime(request).sessions.create(**fields, meta=meta)
    except StoreUnavailable as exc:
        return _store_unavailable(exc)
    return JSONResponse(
        {"session_id": info.session_id, "token": token, "base_url": f"{base_of(request)}/s/{token}"}
    )


@admin.get("/sessions")
async def list_sessions(request: Request) -> Response:
    return JSONResponse([_session_json(s) for s in runtime(request).sessions.all()])


@admin.get("/sessions/{session_id}")
async def get_session(session_id: str, request: Request) -> Response:
    rt = runtime(request)
    info = rt.sessions.get(session_id)
    if info is None:
        return JSONResponse({"error": f"no session {session_id}"}, 404)
    d = _session_json(info)
    d["calls"] = rt.store.count(session_id)
    return JSONResponse(d)


@admin.get("/sessions/{session_id}/records")
async def get_records(session_id: str, request: Request) -> Response:
    rt = runtime(request)
    if rt.sessions.get(session_id) is None:
        return JSONResponse({"error": f"no session {session_id}"}, 404)
    records = await asyncio.to_thread(rt.store.records, session_id)
    return Response(orjson.dumps([r.to_dict() for r in records]), media_type="application/json")


@admin.delete("/sessions/{session_id}")
async def delete_session(session_id: str, request: Request) -> Response:
    rt = runtime(request)
    try:
        info = rt.sessions.delete(session_id)
    except StoreUnavailable as exc:
        return _store_unavailable(exc)
    if info is None:
        return JSONResponse({"error": f"no session {session_id}"}, 404)
    rt.pool.release(session_id)
    rt.proxy.forget(session_id)
    return JSONResponse({"session_id": session_id, "deleted": True})


@admin.post("/pause")
async def pause(request: Request) -> Response:
    """Body {"mode": "drain"|"keep", "timeout": seconds} (default drain, the pause timeout):
    new engine calls wait at the gate; drain answers once the calls in flight have finished, or
    504 when they did not within the timeout (the gateway stays paused). Either answer says what
    it waited for."""
    body = await _json_object(request)
    if isinstance(body, Response):
        return body
    mode, timeout = body.get("mode", "drain"), body.get("timeout")
    if mode not in PAUSE_MODES:
        return JSONResponse({"error": f"mode: {mode!r}; allowed: {', '.join(PAUSE_MODES)}"}, 400)
    if timeout is not None and (
        isinstance(timeout, bool) or not isinstance(timeout, int | float) or timeout < 0
    ):
        return JSONResponse({"error": f"timeout: {timeout!r}; allowed: seconds >= 0"}, 400)
    try:
        report = await runtime(request).gate.pause(mode, timeout)
    except DrainTimeout as exc:
        return JSONResponse({"error": str(exc), "paused": True, **exc.report.to_dict()}, 504)
    return JSONResponse({"paused": True, **report.to_dict()})


@admin.post("/resume")
async def resume(request: Request) -> Response:
    rt = runtime(request)
    rt.gate.resume()
    return JSONResponse({"paused": False, "in_flight": rt.gate.in_flight})


@admin.get("/stats")
async def stats(request: Request) -> Response:
    return JSONResponse(runtime(request).stats())


@health_router.get("/health")
async def health(request: Request) -> Response:
    reps = [
        {"url": r.url, "healthy": r.healthy, "inflight": r.inflight, "sessions": len(r.sessions)}
        for r in runtime(request).pool.replicas
    ]
    return JSONResponse({"status": "ok", "replicas": reps})
