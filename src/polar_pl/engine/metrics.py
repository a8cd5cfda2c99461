"""The embedded engine's Prometheus metrics (`GET /metrics`, utils/metrics.py), read at scrape time
from the backend's `BackendStats`: generation requests, generated tokens (a counter, and a
tokens/s gauge over the last minute of scrapes), decode steps, queue depth, batch size,
prefix-cache lookups and hits, policy version. vLLM serves its own `/metrics` (`vllm:` names)."""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Iterator

from prometheus_client import CollectorRegistry
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from polar_pl.engine.backend import GenerationBackend
from polar_pl.utils.metrics import counter, gauge


class ScrapeRate:
    """The per-second rate of a cumulative count over the last `window` seconds, from the values
    seen at scrape time (nothing on the generation path); since start-up until a window has passed."""

    def __init__(self, window: float = 60.0) -> None:
        self.window = window
        self.seen: deque[tuple[float, float]] = deque([(time.monotonic(), 0.0)])

    def __call__(self, count: float) -> float:
        now = time.monotonic()
        while len(self.seen) > 1 and now - self.seen[1][0] >= self.window:
            self.seen.popleft()  # the oldest kept is the newest one at least a window old
        t0, c0 = self.seen[0]
        self.seen.append((now, count))
        return (count - c0) / (now - t0) if now > t0 else 0.0


class EngineCollector(Collector):
    def __init__(self, backend: GenerationBackend) -> None:
        self.backend = backend
        self.tokens_per_s = ScrapeRate()

    def collect(self) -> Iterator[Metric]:
        s = self.backend.stats
        extra = dict(s.extra)  # written by the scheduler thread: one atomic copy
        yield counter("polar_engine_requests", "Generation requests admitted by the scheduler", s.requests)
        yield counter("polar_engine_generation_tokens", "Tokens sampled", s.tokens_generated)
        yield gauge(
            "polar_engine_generation_tokens_per_second",
            "Tokens sampled per second over the last minute (between scrapes)",
            self.tokens_per_s(s.tokens_generated),
        )
        yield counter("polar_engine_decode_steps", "Batched decode steps (forward passes)", s.steps)
        yield gauge(
            "polar_engine_queue_depth", "Requests waiting for the scheduler", extra.get("waiting_requests", 0)
        )
        yield gauge("polar_engine_running_requests", "Requests in the batch", extra.get("active_requests", 0))
        yield gauge("polar_engine_batch_size", "Sequences in the batch now", extra.get("active_sequences", 0))
        yield gauge("polar_engine_batch_size_max", "The largest batch stepped so far", s.max_batch_size)
        for name, key, doc in (
            ("lookups", "prefix_cache_lookups", "Prompts looked up in the prefix cache"),
            ("hits", "prefix_cache_hits", "Prompts that found a cached prefix"),
            ("query_tokens", "prefix_cache_query_tokens", "Prompt tokens looked up in the prefix cache"),
            ("hit_tokens", "prefix_cache_hit_tokens", "Prompt tokens found cached (their prefill skipped)"),
        ):
            yield counter(f"polar_engine_prefix_cache_{name}", doc, extra.get(key, 0))
        yield gauge(
            "polar_engine_policy_version", "The weights version sampling now", self.backend.policy_version
        )


def engine_registry(backend: GenerationBackend) -> CollectorRegistry:
    """A registry of this engine's own: several engines in one process never clash."""
    registry = CollectorRegistry()
    registry.register(EngineCollector(backend))
    return registry
