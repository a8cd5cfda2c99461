"""`rollout=local`: one in-process gateway in front of the engine replicas and the stage pools on a
background event loop of this process (the CPU default; what the DataModule always did)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from polar_pl.gateway.call.gate import PauseMode
from polar_pl.gateway.handle import Gateway
from polar_pl.rollout.protocol import RolloutSetup
from polar_pl.rollout.service import Group, RolloutService
from polar_pl.rollout.tasks import TaskQueue


def submit_to(feed: Any, tasks: Sequence[Any]) -> list[int]:
    if not isinstance(feed, TaskQueue):
        raise TypeError(
            "this rollout feed is a fixed task source; tasks can be submitted to a TaskQueue feed"
        )
    return feed.put(tasks)


class ServiceCalls:
    """The calls the in-process client and the Ray controller pass straight to their service."""

    service: RolloutService | None
    setup: RolloutSetup
    owner = "rollout client"

    def _service(self) -> RolloutService:
        if self.service is None:
            raise RuntimeError(f"{self.owner}: start_groups(cursor) before asking for groups")
        return self.service

    def next_groups(self, n: int, timeout: float | None = None, consume: bool = True) -> list[Group]:
        return self._service().next_groups(n, timeout=timeout, consume=consume)

    def mark_consumed(self, seqs: Sequence[int]) -> None:
        self._service().mark_consumed(seqs)

    def submit_tasks(self, tasks: Sequence[Any]) -> list[int]:
        return submit_to(self.setup.tasks, tasks)

    def state_dict(self) -> dict[str, Any]:
        return self._service().state_dict()

    def last_failure(self) -> str | None:
        return self.service.last_failure if self.service is not None else None


class LocalRollout:
    """The `rollout=local` backend (conf/rollout/local.yaml)."""

    def engine(self) -> None:
        return None  # the `engine` group's

    def connect(self, setup: RolloutSetup) -> LocalClient:
        return LocalClient(setup)


class LocalClient(ServiceCalls):
    """`RolloutClient` in this process. `gateway` is the running gateway (records, sessions)."""

    def __init__(self, setup: RolloutSetup) -> None:
        self.setup = setup
        self.gateway = Gateway(list(setup.engine_urls), setup.store_path, **setup.gateway_options).start()
        self.service: RolloutService | None = None
        self.health: Callable[[], str | None] | None = None  # see RolloutClient
        self._stopping = False

    def start_groups(self, cursor: dict[str, Any]) -> None:
        if self.service is None:
            self.service = RolloutService(
                self.setup.stages(self.gateway), self.setup.tasks, **self.setup.service_kwargs(), **cursor
            )
            self.service.health = self.health
            if self._stopping:
                self.service.stop_feeding()
            self.service.start()

    def metrics(self) -> dict[str, float]:
        m = self.service.metrics() if self.service is not None else {}
        m.update({k: float(v) for k, v in self.gateway.stats().items() if isinstance(v, int | float)})
        return m

    def pause(self, mode: PauseMode) -> None:
        self.gateway.pause(mode)

    def resume(self) -> None:
        self.gateway.resume()

    def set_policy_version(self, version: int) -> None:
        self.gateway.set_policy_version(version)

    def take_out_engine(self, url: str) -> None:
        self.gateway.take_out_upstream(url)

    def stop_feeding(self) -> None:
        self._stopping = True
        if self.service is not None:
            self.service.stop_feeding()

    def close(self, timeout: float = 60.0) -> None:
        """Pools first (every sandbox and session cleaned), then the gateway (flushes the store)."""
        try:
            if self.service is not None:
                self.service.stop(timeout)
                self.service = None
        finally:
            self.gateway.stop()
