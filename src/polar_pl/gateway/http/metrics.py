"""The gateway's Prometheus metrics (`GET /metrics`, utils/metrics.py), read at scrape time from the
runtime: harness requests by provider, route and status; recorded calls; tokens in and out;
latency histograms (first token, whole call); calls in flight; the replicas; trace-store writes
and backlog; the policy version. Counts and timings only, never a prompt or a completion."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from polar_pl.gateway.runtime import GatewayRuntime
from polar_pl.utils.metrics import counter, gauge


class GatewayCollector(Collector):
    def __init__(self, rt: GatewayRuntime, in_flight: set) -> None:
        """in_flight: the harness requests being served (HarnessRoutes.in_flight)."""
        self.rt, self.in_flight = rt, in_flight

    def collect(self) -> Iterator[Metric]:
        rt, stats = self.rt, self.rt.proxy.stats
        yield counter(
            "polar_gateway_requests",
            "Harness requests answered, by provider API, route and HTTP status",
            dict(stats.requests),
            ["provider", "route", "status"],
        )
        yield counter(
            "polar_gateway_calls",
            "Model calls recorded, by provider API, record status and call kind (main / side)",
            dict(stats.calls),
            ["provider", "status", "kind"],
        )
        yield counter(
            "polar_gateway_prompt_tokens",
            "Prompt tokens of the recorded calls",
            {(p,): n for p, n in dict(stats.prompt_tokens).items()},
            ["provider"],
        )
        yield counter(
            "polar_gateway_completion_tokens",
            "Sampled tokens of the recorded calls",
            {(p,): n for p, n in dict(stats.completion_tokens).items()},
            ["provider"],
        )
        yield from stats.ttft.collect()
        yield from stats.duration.collect()
        gate = rt.gate
        yield gauge("polar_gateway_requests_in_flight", "Harness requests being served", len(self.in_flight))
        yield gauge("polar_gateway_calls_in_flight", "Engine calls in flight (past the gate)", gate.in_flight)
        yield gauge("polar_gateway_calls_waiting", "Engine calls held at the gate by a pause", gate.waiting)
        yield gauge(
            "polar_gateway_paused", "1 while a weight push holds new engine calls", float(gate.paused)
        )
        yield counter("polar_gateway_gate_refused", "Calls refused after waiting out a pause", gate.refused)
        replicas = list(rt.pool.replicas)
        yield gauge(
            "polar_gateway_replica_in_flight",
            "Engine calls in flight per engine replica",
            {(r.url,): r.inflight for r in replicas},
            ["replica"],
        )
        yield gauge(
            "polar_gateway_replica_healthy",
            "1 while the replica answers its health check",
            {(r.url,): float(r.healthy) for r in replicas},
            ["replica"],
        )
        store = rt.store
        yield from store.write_seconds.collect()
        yield gauge(
            "polar_gateway_store_backlog", "Records waiting for the store's writer thread", store.backlog
        )
        yield counter("polar_gateway_store_errors", "Records the store could not commit", store.errors)
        yield gauge(
            "polar_gateway_policy_version",
            "The newest policy version of a recorded call (or the one the trainer set, if newer)",
            max(stats.policy_version, rt.proxy.version_hint),
        )


def gateway_registry(rt: GatewayRuntime, in_flight: set) -> CollectorRegistry:
    """A registry of this gateway's own: several gateways in one process never clash."""
    registry = CollectorRegistry()
    registry.register(GatewayCollector(rt, in_flight))
    return registry
