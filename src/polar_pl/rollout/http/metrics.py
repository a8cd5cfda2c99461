"""The rollout service's Prometheus metrics (`GET /metrics`, utils/metrics.py), read at scrape time
from the rollout client's slash-keyed gauges (`RolloutClient.metrics`, the same for rollout=local
and rollout=ray): stage-pool occupancy and capacity per stage, queues, sessions by status, groups
produced and delivered, the policy version; with rollout=local also the in-process gateway's
`polar_gateway_*` metrics (its own port is local to the service's machine)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

import httpx
from prometheus_client import CollectorRegistry, Counter
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from polar_pl.rollout.http.delivery import GroupOutbox
from polar_pl.utils.metrics import counter, gauge

if TYPE_CHECKING:
    from polar_pl.rollout.http.server import RolloutServer

QUEUES = ("init", "ready", "postrun")
RAY_GAUGES = ("workers", "workers_alive", "nodes_alive", "jobs_in_flight")
RAY_COUNTERS = ("workers_lost", "sessions_retried", "sessions_masked", "results_dropped")


def _by_stage(m: dict[str, float], suffix: str) -> dict[tuple[str], float]:
    """`pool/<stage><suffix>` keys by stage."""
    return {(k[5 : -len(suffix)],): v for k, v in m.items() if k.startswith("pool/") and k.endswith(suffix)}


def _by_name(m: dict[str, float], prefix: str) -> dict[tuple[str], float]:
    return {(k[len(prefix) :],): v for k, v in m.items() if k.startswith(prefix)}


class RolloutCollector(Collector):
    def __init__(self, server: RolloutServer, outbox: GroupOutbox) -> None:
        """server: a `RolloutServer`; outbox: where HTTP readers take groups from."""
        self.server, self.outbox = server, outbox

    def collect(self) -> Iterator[Metric]:
        client = self.server.client
        try:
            m = client.metrics()
        except TimeoutError:  # the service's loop did not answer: the rest is still worth a scrape
            m = {}
        yield gauge(
            "polar_rollout_stage_active",
            "Jobs a stage's workers hold now",
            _by_stage(m, "_active"),
            ["stage"],
        )
        yield gauge("polar_rollout_stage_capacity", "A stage's workers", _by_stage(m, "_capacity"), ["stage"])
        yield counter(
            "polar_rollout_stage_busy_seconds",
            "Worker-seconds a stage spent on jobs (its busy fraction: rate / capacity)",
            _by_stage(m, "_busy_s"),
            ["stage"],
        )
        queues = {(q,): m[f"pool/{q}_queue"] for q in QUEUES if f"pool/{q}_queue" in m}
        yield gauge("polar_rollout_queue_length", "Jobs waiting for a stage", queues, ["queue"])
        yield counter(
            "polar_rollout_sessions",
            "Attempts finished, by status",
            _by_name(m, "pool/sessions_"),
            ["status"],
        )
        yield counter(
            "polar_rollout_failures", "Failed attempts, by stage", _by_name(m, "pool/failures_"), ["stage"]
        )
        yield counter(
            "polar_rollout_groups_produced",
            "Groups released (complete, or at their deadline)",
            m.get("pool/groups_released", 0),
        )
        yield gauge(
            "polar_rollout_groups_ready", "Groups released, not taken yet", m.get("pool/groups_ready", 0)
        )
        yield gauge(
            "polar_rollout_groups_held", "Groups taken, written to no reader yet", len(self.outbox.front)
        )
        yield gauge(
            "polar_rollout_streams_open", "Open GET /v1/groups/stream connections", self.outbox.streams
        )
        for name in RAY_GAUGES:
            if f"rollout/{name}" in m:
                yield gauge(
                    f"polar_rollout_{name}", f"rollout=ray: {name.replace('_', ' ')}", m[f"rollout/{name}"]
                )
        for name in RAY_COUNTERS:
            if f"rollout/{name}" in m:
                yield counter(
                    f"polar_rollout_{name}", f"rollout=ray: {name.replace('_', ' ')}", m[f"rollout/{name}"]
                )
        try:
            yield gauge(
                "polar_rollout_policy_version",
                "The version the engines sample with",
                self.server.policy_version(),
            )
        except (httpx.HTTPError, OSError, RuntimeError):  # the engine is down: the scrape says the rest
            pass
        gateway = getattr(client, "gateway", None)
        if gateway is not None:  # rollout=local: the gateway in this process
            yield from gateway.app.state.metrics_registry.collect()


def rollout_registry(server: RolloutServer, outbox: GroupOutbox) -> CollectorRegistry:
    """This service's registry; counts the groups `outbox` writes to readers (its `on_delivered`)."""
    registry = CollectorRegistry()
    registry.register(RolloutCollector(server, outbox))
    delivered = Counter(
        "polar_rollout_groups_delivered", "Groups written to a reader still connected", registry=registry
    )
    outbox.on_delivered = lambda groups: delivered.inc(len(groups))
    return registry
