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

from polar_pl.gateway.call.gate import PAUSE_MODES
from polar_pl.gateway.runtime import GatewayRuntime


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


async def _json_object(request: Request) -> Any:
    try:
        body = orjson.loads(await request.body() or b"{}")
    except orjson.JSONDecodeError:
        return JSONResponse({"error": "body must be JSON"}, 400)
    return body


@admin.post("/sessions")
async def create_session(request: Request) -> Response:
    body = await _json_object(request)
    if isinstance(body, Response):
        return body
    if not isinstance(body, dict):
        return JSONResponse({"error": "body must be a JSON object"}, 400)
    fields = {k: body.get(k) for k in ("task_id", "group_id", "rollout_id", "harness")}
    bad = [k for k, v in fields.items() if v is not None and not isinstance(v, str)]
    if bad:
        return JSONResponse({"error": f"{', '.join(bad)}: must be strings"}, 400)
    info, token = runtime(request).sessions.create(
        **fields, meta=body.get("meta") if isinstance(body.get("meta"), dict) else None
    )
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
    info = rt.sessions.delete(session_id)
    if info is None:
        return JSONResponse({"error": f"no session {session_id}"}, 404)
    rt.pool.release(session_id)
    rt.proxy.forget(session_id)
    return JSONResponse({"session_id": session_id, "deleted": True})


@admin.post("/pause")
async def pause(request: Request) -> Response:
    """Body {"mode": "drain"|"keep"} (default drain): new engine calls wait at the gate;
    drain answers once the calls in flight have finished."""
    body = await _json_object(request)
    if isinstance(body, Response):
        return body
    mode = body.get("mode", "drain") if isinstance(body, dict) else None
    if mode not in PAUSE_MODES:
        return JSONResponse({"error": f"mode: {mode!r}; allowed: {', '.join(PAUSE_MODES)}"}, 400)
    rt = runtime(request)
    await rt.gate.pause(mode)
    return JSONResponse({"paused": True, "mode": mode, "in_flight": rt.gate.in_flight})


@admin.post("/resume")
async def resume(request: Request) -> Response:
    rt = runtime(request)
    rt.gate.resume()
    return JSONResponse({"paused": False, "in_flight": rt.gate.in_flight})


@admin.get("/stats")
async def stats(request: Request) -> Response:
    rt = runtime(request)
    snap = rt.stats()
    snap["gateway/inflight"] = float(sum(r.inflight for r in rt.pool.replicas))
    return JSONResponse(snap)


@health_router.get("/health")
async def health(request: Request) -> Response:
    reps = [
        {"url": r.url, "healthy": r.healthy, "inflight": r.inflight, "sessions": len(r.sessions)}
        for r in runtime(request).pool.replicas
    ]
    return JSONResponse({"status": "ok", "replicas": reps})
