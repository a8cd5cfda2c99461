"""Engine replicas: sticky sessions, least-loaded placement, health checks.

A session keeps talking to one replica so its growing prompt hits that replica's prefix cache.
New sessions go to the healthy replica with the fewest requests in flight (ties: fewest
sessions, then an order drawn per pool, so that several gateways in front of the same replicas,
one per rollout worker, do not all start on the first one). A replica that refuses connections or fails its health check is skipped until a later
check finds it healthy again; sessions stuck to it move on their next call. One taken out
(`take_out`: it failed a weight push, so it would sample with stale weights) never comes back.

The model name asked for is the engine's: the first card of its /v1/models, or, when it lists
LoRA adapters of that model (`<served>-lora-v<N>`, as vLLM lists them), the newest adapter. The
name is read again after every weight push (`refresh_models`), so calls go to the adapter just
pushed; a gateway started later (the held-out evaluation's) finds it on its first call. A call
the engine refuses because the adapter it named is gone (404: a push landed after the name was
read) is sent once more under the name read again (`forget_gone_model`).
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from dataclasses import dataclass, field

from polar_pl.gateway.upstream.client import UpstreamClient, UpstreamError
from polar_pl.utils.adapters import adapter_version


@dataclass(slots=True)
class Replica:
    url: str
    healthy: bool = True
    inflight: int = 0
    sessions: set[str] = field(default_factory=set)
    model: str | None = None
    served: int = 0
    removed: bool = False

    def endpoint(self, path: str) -> str:
        return f"{self.url}{path}"


class ReplicaPool:
    def __init__(
        self,
        urls: list[str],
        client: UpstreamClient,
        *,
        model: str | None = None,
        health_interval: float = 2.0,
    ):
        if not urls:
            raise ValueError("gateway upstreams: at least one engine URL is required")
        self.replicas = [Replica(u.rstrip("/").removesuffix("/v1"), model=model) for u in urls]
        self._fixed_model = model
        self._tiebreak = {id(r): i for i, r in enumerate(random.sample(self.replicas, len(self.replicas)))}
        self._placed = {id(r): 0 for r in self.replicas}  # sessions ever placed: idle replicas take turns
        self._client = client
        self._sticky: dict[str, Replica] = {}
        self._health_interval = health_interval
        self._task: asyncio.Task | None = None
        self._context: int | None = None  # the engine's max_model_len; 0: it does not say

    def pick(self, session_id: str) -> Replica:
        rep = self._sticky.get(session_id)
        if rep is not None and rep.healthy:
            return rep
        healthy = [r for r in self.replicas if r.healthy] or [r for r in self.replicas if not r.removed]
        best = min(
            healthy, key=lambda r: (r.inflight, len(r.sessions), self._placed[id(r)], self._tiebreak[id(r)])
        )
        if rep is not None:
            rep.sessions.discard(session_id)
        best.sessions.add(session_id)
        self._placed[id(best)] += 1
        self._sticky[session_id] = best
        return best

    def release(self, session_id: str) -> None:
        rep = self._sticky.pop(session_id, None)
        if rep is not None:
            rep.sessions.discard(session_id)

    def take_out(self, url: str) -> None:
        """Out of rotation for good; its sessions move to another replica on their next call."""
        for rep in self.replicas:
            if rep.url == url.rstrip("/").removesuffix("/v1"):
                rep.removed, rep.healthy = True, False

    def mark_dead(self, rep: Replica) -> None:
        if len(self.replicas) > 1:  # with one replica there is nothing to fail over to
            rep.healthy = False

    async def model_for(self, rep: Replica) -> str:
        """The name the engine serves (harnesses send their own model names; the engine ignores
        nothing, so the gateway always asks for the served one): its newest LoRA adapter if it
        lists any, else its model."""
        if rep.model is None:
            cards = await self._cards(rep)
            base = cards[0]["id"]
            adapters = [(v, c["id"]) for c in cards if (v := adapter_version(c.get("id"), base)) is not None]
            rep.model = max(adapters)[1] if adapters else base
        return rep.model

    def forget_gone_model(self, rep: Replica, exc: UpstreamError) -> bool:
        """After the engine refused a call with 404 (an adapter name it no longer holds: the
        embedded engine keeps one, vLLM two): forget the name, so the next `model_for` reads the
        one it serves now. False when asking again cannot help (a fixed name, another error)."""
        if exc.status != 404 or self._fixed_model is not None:
            return False
        rep.model = None
        return True

    def refresh_models(self) -> None:
        """After a weight push: ask each engine again which name to request (a new adapter)."""
        if self._fixed_model is None:
            for rep in self.replicas:
                rep.model = None

    async def context_limit(self) -> int | None:
        """The engine's context length in tokens (`max_model_len` on vLLM's and the embedded
        engine's model card), asked once; None when the engine does not say or cannot be asked."""
        if self._context is None:
            rep = next((r for r in self.replicas if r.healthy), self.replicas[0])
            try:
                card = await self._card(rep)
            except UpstreamError:
                return None  # the call itself will meet the engine's failure
            self._context = card.get("max_model_len") if isinstance(card.get("max_model_len"), int) else 0
        return self._context or None

    async def _card(self, rep: Replica) -> dict:
        return (await self._cards(rep))[0]

    async def _cards(self, rep: Replica) -> list[dict]:
        data = await self._client.request_json("GET", rep.endpoint("/v1/models"))
        models = data.get("data") if isinstance(data, dict) else None
        if not models or not isinstance(models[0], dict) or not isinstance(models[0].get("id"), str):
            raise UpstreamError("http", "the engine serves no model", 502, rep.url)
        return [m for m in models if isinstance(m, dict)]

    async def check(self, rep: Replica) -> bool:
        if rep.removed:
            return False
        try:
            await self._client.request_json("GET", rep.endpoint("/health"), timeout=2.0)
            rep.healthy = True
        except UpstreamError:
            rep.healthy = False
        return rep.healthy

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(self._health_interval)
            await asyncio.gather(*(self.check(r) for r in self.replicas))

    def start(self) -> None:
        if len(self.replicas) > 1 and self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._loop())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
