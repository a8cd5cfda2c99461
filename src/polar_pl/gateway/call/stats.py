"""Live gateway counters: slash keys for the trainer's loggers (`snapshot`), and what the gateway's
`/metrics` reads at scrape time (http/metrics.py), with the latency histograms it exposes."""

from __future__ import annotations

from collections import Counter, deque

from prometheus_client import Histogram

from polar_pl.gateway.store.records import TraceRecord

# seconds; vLLM's buckets for the same two quantities (vllm/v1/metrics/loggers.py)
TTFT_BUCKETS = (
    0.001,
    0.005,
    0.01,
    0.02,
    0.04,
    0.06,
    0.08,
    0.1,
    0.25,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
    160.0,
    640.0,
    2560.0,
)
DURATION_BUCKETS = (
    0.3,
    0.5,
    0.8,
    1.0,
    1.5,
    2.0,
    2.5,
    5.0,
    10.0,
    15.0,
    20.0,
    30.0,
    40.0,
    50.0,
    60.0,
    120.0,
    240.0,
    480.0,
    960.0,
    1920.0,
    7680.0,
)


class GatewayStats:
    """Counts every harness request and every recorded call; latency percentiles over the most
    recent `window` ok calls. Updated on the gateway's loop; a scrape reads copies (dict copies
    are atomic under the GIL)."""

    def __init__(self, window: int = 2048):
        self.requests: Counter[tuple[str, str, str]] = Counter()  # (provider, route, http status)
        self.calls: Counter[tuple[str, str, str]] = Counter()  # (provider, status, call kind)
        self.prompt_tokens: Counter[str] = Counter()  # by provider
        self.completion_tokens: Counter[str] = Counter()
        self.policy_version = 0  # the newest version a recorded call was sampled with
        self.latencies_ms: deque[float] = deque(maxlen=window)
        # not registered: the gateway's metrics collector yields them into its own registry
        self.ttft = Histogram(
            "polar_gateway_time_to_first_token_seconds",
            "Time from a model call's arrival to its first sampled token (ok calls)",
            ["provider"],
            buckets=TTFT_BUCKETS,
            registry=None,
        )
        self.duration = Histogram(
            "polar_gateway_request_duration_seconds",
            "Time from a model call's arrival to its record (ok calls)",
            ["provider"],
            buckets=DURATION_BUCKETS,
            registry=None,
        )
        # each provider's two labelled children: labels() takes a lock, halving observe's cost
        self._timers: dict[str, tuple[Histogram, Histogram]] = {}

    def answered(self, provider: str, route: str, status: int) -> None:
        self.requests[(provider, route, str(status))] += 1

    def observe(self, rec: TraceRecord, ttft_s: float | None = None) -> None:
        """One recorded call; ttft_s: seconds to its first sampled token (None: none came)."""
        self.calls[(rec.provider, rec.status, rec.call_kind)] += 1
        self.prompt_tokens[rec.provider] += len(rec.prompt_ids)
        self.completion_tokens[rec.provider] += len(rec.response_ids)
        self.policy_version = max(self.policy_version, rec.policy_version)
        if rec.status == "ok":
            self.latencies_ms.append(1000 * rec.latency_s)
            timers = self._timers.get(rec.provider)
            if timers is None:
                timers = self._timers[rec.provider] = (
                    self.ttft.labels(rec.provider),
                    self.duration.labels(rec.provider),
                )
            timers[1].observe(rec.latency_s)
            if ttft_s is not None:
                timers[0].observe(ttft_s)

    def snapshot(self) -> dict[str, float]:
        lat = sorted(self.latencies_ms)

        def pct(q: float) -> float:
            return lat[min(len(lat) - 1, int(q * len(lat)))] if lat else 0.0

        counts: Counter[str] = Counter()
        for (_, status, kind), n in dict(self.calls).items():
            counts["calls"] += n
            counts[f"status_{status}"] += n
            counts[f"kind_{kind}"] += n
        out = {f"gateway/{k}": float(v) for k, v in counts.items()}
        out["gateway/prompt_tokens"] = float(sum(self.prompt_tokens.values()))
        out["gateway/response_tokens"] = float(sum(self.completion_tokens.values()))
        out["gateway/latency_ms_p50"] = pct(0.5)
        out["gateway/latency_ms_p99"] = pct(0.99)
        return out
