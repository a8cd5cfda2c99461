"""`Gateway`: the gateway app on its own thread, for in-process use (the RolloutDataModule, tests).

    with Gateway(["http://127.0.0.1:8000"], "traces.db") as gw:
        s = gw.create_session(task_id="t1", harness="claude_code")
        ...  # point the harness at s.base_url
        records = gw.records(s.session_id)

`stop()` aborts the model calls in flight (each recorded "aborted: gateway shut down", its engine
request aborted upstream), lets uvicorn finish what is left, then closes the upstream client and
flushes the trace store, so no record is lost on a clean shutdown.

Around a weight push (from the trainer's thread):

    gw.pause("drain")   # new engine calls wait at the gate; returns when none is in flight
    sync.push(model)
    gw.resume()         # the waiting calls go on, sampled by the new weights
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import secrets
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Self

from polar_pl.gateway.call.gate import PAUSE_MODES, PauseMode, PauseReport
from polar_pl.gateway.http.app import create_app
from polar_pl.gateway.runtime import GatewayRuntime
from polar_pl.gateway.store.records import SessionInfo, TraceRecord
from polar_pl.utils.serving import ServerThread, free_port


@dataclass(frozen=True, slots=True)
class SessionHandle:
    """A registered session as a harness launcher needs it."""

    session_id: str
    token: str
    base_url: str
    info: SessionInfo


class Gateway:
    def __init__(
        self,
        upstreams: list[str] | str,
        store_path: str | Path,
        *,
        host: str = "127.0.0.1",
        port: int | None = None,
        admin_token: str | None = None,
        **options: Any,
    ):
        self.admin_token = admin_token or os.environ.get("POLAR_ADMIN_TOKEN") or secrets.token_urlsafe(24)
        self.host = host
        self.port = port or free_port(host)
        options.setdefault("public_url", f"http://{host}:{self.port}")
        self.url = options["public_url"].rstrip("/")
        upstreams = [upstreams] if isinstance(upstreams, str) else list(upstreams)
        self.app = create_app(upstreams, store_path, admin_token=self.admin_token, **options)
        self.runtime: GatewayRuntime = self.app.state.runtime
        self._server: ServerThread | None = None

    def start(self, timeout: float = 120.0) -> Self:
        """Serve; returns once the app has started. Start-up loads the served model's tokenizer
        (transformers' import alone took > 30 s in a Ray worker on a loaded 2-core machine)."""
        self._server = ServerThread(
            self.app, host=self.host, port=self.port, on_shutdown=self.app.harness.stop
        ).start(timeout)
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.stop()
            self._server = None
        self.runtime.store.close()  # idempotent; covers a gateway that never started

    @property
    def alive(self) -> bool:
        """Whether the server is serving (its thread has not ended)."""
        return self._server is not None and self._server.thread.is_alive()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    # ---- in-process session API (same effect as the admin routes) -----------------------
    def create_session(
        self,
        *,
        task_id: str | None = None,
        group_id: str | None = None,
        rollout_id: str | None = None,
        harness: str | None = None,
    ) -> SessionHandle:
        info, token = self.runtime.sessions.create(
            task_id=task_id, group_id=group_id, rollout_id=rollout_id, harness=harness
        )
        return SessionHandle(info.session_id, token, f"{self.url}/s/{token}", info)

    def delete_session(self, session_id: str) -> None:
        self.runtime.sessions.delete(session_id)
        self.runtime.pool.release(session_id)
        self.runtime.proxy.forget(session_id)

    def stats(self) -> dict[str, float]:
        """Counters and latency percentiles with slash keys (gateway/calls, gateway/latency_ms_p99),
        gateway/in_flight (engine calls now), gateway/engine_busy (share of wall time since start
        with at least one engine call in flight; gateway/engine_busy_s and gateway/uptime_s to
        difference for a window), gateway/paused, gateway/gate_waiting."""
        return self.runtime.stats()  # plain reads: no loop hop, safe from any thread

    # ---- weight-update pause (callable from any thread, e.g. the trainer's) ----------------
    def pause(self, mode: PauseMode = "drain", timeout: float | None = None) -> PauseReport:
        """New engine calls wait at the gate until `resume()`. mode="drain" returns once the
        calls in flight have finished (the engine is idle); "keep" returns at once and lets them
        run on. timeout: seconds to wait for the drain (None: the gateway's pause_timeout);
        past it `DrainTimeout` (a TimeoutError) says what is still in flight, and the gateway
        stays paused."""
        if mode not in PAUSE_MODES:
            raise ValueError(f"pause mode: {mode!r}; allowed: {', '.join(PAUSE_MODES)}")
        slack = None if timeout is None else timeout + 10.0  # the loop answers with DrainTimeout first
        return self._on_loop(self.runtime.gate.pause(mode, timeout), slack)

    def resume(self) -> None:
        """Let waiting and new engine calls through."""
        self._on_loop(self._async(self.runtime.gate.resume), timeout=10.0)

    def set_policy_version(self, version: int) -> None:
        """The version to record for engines that do not report one in their answers (vLLM does
        not): call it after a weight push, before `resume()`. The engines are also asked again
        which model name to request (a LoRA push adds an adapter name)."""
        self.runtime.proxy.version_hint = int(version)
        self.runtime.pool.refresh_models()

    def take_out_upstream(self, url: str) -> None:
        """Stop routing to this engine replica for good (it failed a weight push)."""
        pool = self.runtime.pool
        self._on_loop(self._async(lambda: pool.take_out(url)), timeout=10.0)

    @property
    def paused(self) -> bool:
        return self.runtime.gate.paused

    @staticmethod
    async def _async(fn):
        return fn()

    def _on_loop(self, coro, timeout: float | None):
        """Run a coroutine on the gateway's event loop (its state lives there) and wait for it."""
        loop = self.runtime.loop
        if self._server is None or loop is None or loop.is_closed():
            return asyncio.run(coro)  # not serving: no other thread touches the gate
        fut = asyncio.run_coroutine_threadsafe(coro, loop)
        done, _ = concurrent.futures.wait([fut], timeout)
        if not done:
            fut.cancel()
            raise TimeoutError(f"gateway: no answer from its event loop in {timeout}s")
        return fut.result()  # the coroutine's own TimeoutError (DrainTimeout) is its answer

    def records(self, session_id: str, *, packed: bool = False) -> list[TraceRecord]:
        """A session's records in call order (packed: token fields as arrays, store/layout.py)."""
        return self.runtime.store.records(session_id, packed=packed)
