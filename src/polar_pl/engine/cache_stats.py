"""Prefix-cache counters of running engines, read over HTTP: how many prompt tokens were looked up
and how many of them were found cached (their prefill skipped).

The embedded engine reports them at `GET /stats` (`prefix_cache_query_tokens`,
`prefix_cache_hit_tokens`), vLLM at `GET /metrics` (Prometheus counters `vllm:prefix_cache_queries`
and `vllm:prefix_cache_hits`, in tokens, one series per engine core). Both are cumulative since
the engine started; the per-step hit rate is the ratio of their increments (`PrefixCacheRate`).
"""

from __future__ import annotations

import re
from collections.abc import Iterable

import httpx

# `vllm:prefix_cache_hits_total{engine="0",model_name="m"} 1234.0` (labels optional)
_VLLM = re.compile(r"^vllm:prefix_cache_(queries|hits)_total(?:\{[^}]*\})?\s+([0-9.eE+-]+)\s*$", re.M)


def vllm_counters(metrics_text: str) -> tuple[float, float] | None:
    """(queried, hit) tokens summed over engine cores from vLLM's Prometheus text; None when the
    counters are absent (prefix caching off, or not vLLM)."""
    samples = _VLLM.findall(metrics_text)
    if not samples:
        return None
    queried = sum(float(v) for name, v in samples if name == "queries")
    return queried, sum(float(v) for name, v in samples if name == "hits")


def _one(client: httpx.Client, url: str) -> tuple[float, float] | None:
    r = client.get(f"{url}/stats")
    if r.status_code == 200:  # the embedded engine (no counters before its first prefill)
        s = r.json()
        return float(s.get("prefix_cache_query_tokens", 0)), float(s.get("prefix_cache_hit_tokens", 0))
    r = client.get(f"{url}/metrics")
    return vllm_counters(r.text) if r.status_code == 200 else None


def prefix_cache_counters(urls: Iterable[str], timeout: float = 2.0) -> tuple[float, float] | None:
    """(queried, hit) prompt tokens summed over the engines at `urls` (replicas), or None when any
    of them does not answer or does not report a prefix cache: a metric, never a reason to fail."""
    total_q = total_h = 0.0
    try:
        with httpx.Client(timeout=timeout) as client:
            for url in urls:
                counts = _one(client, url.rstrip("/"))
                if counts is None:
                    return None
                total_q, total_h = total_q + counts[0], total_h + counts[1]
    except (httpx.HTTPError, httpx.InvalidURL, ValueError):  # not started, gone, or not an engine
        return None
    return total_q, total_h


class PrefixCacheRate:
    """engine/prefix_cache_hit_rate (share of prompt tokens looked up since the last call that were
    cached) and engine/prefix_cache_hit_tokens (how many), for the step metrics."""

    def __init__(self) -> None:
        self._last: tuple[float, float] | None = None

    def since_last(self, urls: Iterable[str]) -> dict[str, float]:
        now = prefix_cache_counters(urls)
        last, self._last = self._last, now
        if now is None or last is None or now[0] < last[0]:  # unreadable, or an engine restarted
            return {}
        queried, hit = now[0] - last[0], now[1] - last[1]
        if queried <= 0:
            return {}
        return {"engine/prefix_cache_hit_rate": hit / queried, "engine/prefix_cache_hit_tokens": hit}
