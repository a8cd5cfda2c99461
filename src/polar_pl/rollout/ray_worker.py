"""A rollout worker: one Ray actor on a node that offers `sandbox`, owning its stage pools, its
sandboxes and its own gateway (so harness traffic stays on the node) with its own trace store.

The controller submits jobs and long-polls finished `RolloutResult`s; trajectory rows are built
here (POSTRUN) and travel to the controller through Ray's object store. Raw records stay in this
worker's store, reachable by session id (`records`).

The class is a plain async class; `ray_controller.py` makes it an actor (`ray.remote(...)`), so
importing this module needs no Ray.
"""

from __future__ import annotations

import asyncio
import os
import socket
from pathlib import Path
from typing import Any

from polar_pl.gateway.call.gate import PauseMode
from polar_pl.rollout.pools import RolloutJob, RolloutResult, StagePools
from polar_pl.rollout.protocol import RolloutSetup


class RolloutWorker:
    """See module docstring. `name` names its trace store (traces-<name>.db)."""

    def __init__(self, name: str, setup: RolloutSetup) -> None:
        self.name, self.setup = name, setup
        self.gateway: Any = None
        self.pools: StagePools | None = None
        self._submits: set[asyncio.Task] = set()

    async def start(self) -> dict[str, Any]:
        """Gateway up (when there are engines), pools running; returns where this worker lives."""
        store = None
        if self.setup.engine_urls:
            from polar_pl.gateway.handle import Gateway

            store = self.setup.store_for(self.name)
            Path(store).parent.mkdir(parents=True, exist_ok=True)
            self.gateway = await asyncio.to_thread(
                lambda: Gateway(list(self.setup.engine_urls), store, **self.setup.gateway_options).start()
            )
        self.pools = StagePools(self.setup.stages(self.gateway), self.setup.sizes)
        self.pools.start()
        return {"name": self.name, "node": _node_id(), "host": socket.gethostname(),
                "pid": os.getpid(), "store": store}  # fmt: skip

    async def submit(self, jobs: list[RolloutJob]) -> None:
        """Queue jobs without waiting for room in INIT (the controller bounds what each worker
        holds); the pools take queued jobs in submission order."""
        assert self.pools is not None, "start() first"
        for job in jobs:
            task = asyncio.get_running_loop().create_task(self.pools.submit(job))
            self._submits.add(task)
            task.add_done_callback(self._submits.discard)

    async def poll(self, timeout: float, linger: float = 0.0) -> list[RolloutResult]:
        """Results finished since the last poll; waits up to `timeout` for the first one, then
        `linger` for more (one answer for several results)."""
        assert self.pools is not None, "start() first"
        q = self.pools.results
        try:
            async with asyncio.timeout(timeout):
                out = [await q.get()]
        except TimeoutError:
            return []
        if linger > 0:
            await asyncio.sleep(linger)
        while not q.empty():
            out.append(q.get_nowait())
        return out

    def metrics(self) -> dict[str, float]:
        m = self.pools.metrics() if self.pools is not None else {}
        if self.gateway is not None:
            m.update({k: float(v) for k, v in self.gateway.stats().items() if isinstance(v, int | float)})
        return m

    def records(self, session_id: str) -> list[Any]:
        return self.gateway.records(session_id) if self.gateway is not None else []

    async def pause(self, mode: PauseMode) -> None:
        if self.gateway is not None:
            await asyncio.to_thread(self.gateway.pause, mode)

    async def resume(self) -> None:
        if self.gateway is not None:
            await asyncio.to_thread(self.gateway.resume)

    def set_policy_version(self, version: int) -> None:
        if self.gateway is not None:
            self.gateway.set_policy_version(version)

    def take_out_engine(self, url: str) -> None:
        if self.gateway is not None:
            self.gateway.take_out_upstream(url)

    async def stop(self) -> None:
        """Every job cleaned up (sandboxes stopped, sessions ended), then the gateway."""
        for t in list(self._submits):
            t.cancel()
        if self.pools is not None:
            await self.pools.stop()
            self.pools = None
        if self.gateway is not None:
            await asyncio.to_thread(self.gateway.stop)
            self.gateway = None


def _node_id() -> str:
    import ray

    return ray.get_runtime_context().get_node_id()
