"""Live gateway counters for logging (slash keys, as the trainer's loggers expect)."""

from __future__ import annotations

from collections import Counter, deque

from polar_pl.gateway.store.records import TraceRecord


class GatewayStats:
    """Counts every recorded call; latency percentiles over the most recent `window` calls."""

    def __init__(self, window: int = 2048):
        self.counts: Counter[str] = Counter()
        self.latencies_ms: deque[float] = deque(maxlen=window)
        self.tokens: Counter[str] = Counter()

    def observe(self, rec: TraceRecord) -> None:
        self.counts["calls"] += 1
        self.counts[f"status_{rec.status}"] += 1
        self.counts[f"kind_{rec.call_kind}"] += 1
        self.tokens["prompt"] += len(rec.prompt_ids)
        self.tokens["response"] += len(rec.response_ids)
        if rec.status == "ok":
            self.latencies_ms.append(1000 * rec.latency_s)

    def snapshot(self) -> dict[str, float]:
        lat = sorted(self.latencies_ms)

        def pct(q: float) -> float:
            return lat[min(len(lat) - 1, int(q * len(lat)))] if lat else 0.0

        out = {f"gateway/{k}": float(v) for k, v in self.counts.items()}
        out |= {f"gateway/{k}_tokens": float(v) for k, v in self.tokens.items()}
        out["gateway/latency_ms_p50"] = pct(0.5)
        out["gateway/latency_ms_p99"] = pct(0.99)
        return out
