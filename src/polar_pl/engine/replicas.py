"""EngineReplicas: N engines (`engine.replicas: N`) behind one `Engine` handle.

The gateway routes to every replica URL (`urls`) with its `ReplicaPool` (sticky sessions,
least-loaded placement, dead replicas skipped). A weight push goes to every replica in rotation
at once, and the handle's policy version is the lowest any replica in rotation runs, so it
advances only when all have the new weights. A replica that is not healthy when a push comes, or
whose push fails, is taken out of rotation for good (it would sample with stale weights): it is
stopped, reported in `taken_out`, and the `on_take_out` callbacks (the gateways) stop routing
to it. The run goes on with the others; with none left the push raises.

A push that every replica refuses after checking it (engine/weights.py `REFUSED`: each is unchanged)
was a bad push, not bad replicas: its error is raised and every replica stays in rotation, on the
weights and version it had.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Self

import torch

from polar_pl.engine.weights import REFUSED

log = logging.getLogger(__name__)


class EngineReplicas:
    """See module docstring. engines: `Engine` handles, not yet started."""

    def __init__(self, engines: list[Any]) -> None:
        if not engines:
            raise ValueError("engine.replicas: at least one replica is required")
        self.engines = list(engines)
        self.taken_out: dict[str, str] = {}  # url -> why
        self.on_take_out: list[Callable[[str], None]] = []

    # ---- the Engine handle --------------------------------------------------------------
    @property
    def live(self) -> list[Any]:
        return [e for e in self.engines if e.url not in self.taken_out]

    @property
    def urls(self) -> list[str]:
        """Every replica in rotation (what the gateways route to)."""
        return [e.url for e in self.live]

    @property
    def url(self) -> str:
        return self._first().url

    @property
    def base_url(self) -> str:
        return f"{self.url}/v1"

    @property
    def model(self) -> str:
        return self._first().model

    @property
    def model_dir(self) -> Path | None:
        return self.engines[0].model_dir

    def __getattr__(self, name: str) -> Any:
        # model_dir, pad_token_id, ...: what the replicas share, from the first one
        if name.startswith("_") or name in ("engines", "taken_out", "on_take_out"):
            raise AttributeError(name)
        return getattr(self.engines[0], name)

    def start(self) -> Self:
        """Every replica at once; if one fails to start, all are stopped and the error raised."""
        try:
            self._each(lambda e: e.start(), self.engines)
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        for e in self.engines:
            try:
                e.stop()
            except Exception:  # every replica gets its chance to stop
                log.exception("engine replica %s: stop failed", getattr(e, "url", e))

    def health(self) -> bool:
        return any(e.health() for e in self.live)

    def policy_version(self) -> int:
        return min(int(e.policy_version()) for e in self._live_or_raise())

    def update_weights_from_state_dict(self, state_dict: Mapping[str, torch.Tensor]) -> int:
        return self._push(lambda e: e.update_weights_from_state_dict(state_dict))

    def update_weights_from_disk(self, path: str) -> int:
        return self._push(lambda e: e.update_weights_from_disk(path))

    def update_adapter(self, tensors: Mapping[str, torch.Tensor], config: Mapping) -> int:
        return self._push(lambda e: e.update_adapter(tensors, config))

    def update_adapter_from_disk(self, path: str) -> int:
        return self._push(lambda e: e.update_adapter_from_disk(path))

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    # ---- push to all --------------------------------------------------------------------
    def _push(self, update: Callable[[Any], int]) -> int:
        for e in self._live_or_raise():
            if not e.health():
                self.take_out(e, "not healthy at a weight push")

        def one(e: Any) -> int | BaseException:
            try:
                return int(update(e))
            except Exception as exc:
                return exc

        results = self._each(one, self._live_or_raise())
        if all(isinstance(res, REFUSED) for _, res in results):
            raise results[0][1]  # refused whole by each: all of them still serve the old weights
        for e, res in results:
            if isinstance(res, BaseException):
                self.take_out(e, f"weight push failed: {type(res).__name__}: {res}")
        return self.policy_version()

    def take_out(self, engine: Any, why: str) -> None:
        """Out of rotation for good: reported, stopped, and the gateways stop routing to it."""
        url = engine.url
        if url in self.taken_out:
            return
        self.taken_out[url] = why
        log.error("engine replica %s taken out of rotation: %s", url, why)
        for notify in self.on_take_out:
            try:
                notify(url)
            except Exception:  # a gateway that is gone has nothing to route
                log.exception("engine replica %s: take-out notification failed", url)
        try:
            engine.stop()
        except Exception:
            log.exception("engine replica %s: stop failed", url)

    def _live_or_raise(self) -> list[Any]:
        live = self.live
        if not live:
            raise RuntimeError(f"engine replicas: none left in rotation ({self.taken_out})")
        return live

    def _first(self) -> Any:
        live = self.live
        return live[0] if live else self.engines[0]

    @staticmethod
    def _each(fn: Callable[[Any], Any], engines: list[Any]) -> list[tuple[Any, Any]]:
        """fn on every engine in parallel threads; (engine, result) in order; raises the first error."""
        if len(engines) == 1:
            return [(engines[0], fn(engines[0]))]
        with ThreadPoolExecutor(len(engines), thread_name_prefix="replica") as pool:
            futures = [pool.submit(fn, e) for e in engines]
            return [(e, f.result()) for e, f in zip(engines, futures, strict=True)]
