"""Prefix-cache counters read from running engines (engine/cache_stats.py): vLLM's Prometheus text,
the embedded engine's /stats, and the per-step hit rate a training run logs."""

from __future__ import annotations

import httpx

from polar_pl.engine.cache_stats import PrefixCacheRate, prefix_cache_counters, vllm_counters
from polar_pl.engine.embedded import EmbeddedEngine

# The shape of vLLM 0.32's /metrics (two engine cores; _created samples and other counters beside)
VLLM_METRICS = """\
# HELP vllm:prefix_cache_queries_total Prefix cache queries, in terms of number of queried tokens.
# TYPE vllm:prefix_cache_queries_total counter
vllm:prefix_cache_queries_total{engine="0",model_name="tool"} 800.0
vllm:prefix_cache_queries_total{engine="1",model_name="tool"} 200.0
vllm:prefix_cache_queries_created{engine="0",model_name="tool"} 1.7e+09
# HELP vllm:prefix_cache_hits_total Prefix cache hits, in terms of number of cached tokens.
vllm:prefix_cache_hits_total{engine="0",model_name="tool"} 672.0
vllm:prefix_cache_hits_total{engine="1",model_name="tool"} 96.0
vllm:external_prefix_cache_hits_total{engine="0",model_name="tool"} 5.0
"""


def test_vllm_counters_sum_the_engine_cores() -> None:
    assert vllm_counters(VLLM_METRICS) == (1000.0, 768.0)
    assert vllm_counters("# no prefix cache\nvllm:num_requests_running 0.0\n") is None


def test_an_engine_that_does_not_answer_gives_no_metric() -> None:
    rate = PrefixCacheRate()
    assert prefix_cache_counters(["http://127.0.0.1:9"]) is None
    assert rate.since_last(["http://127.0.0.1:9"]) == {} and rate.since_last(["http://127.0.0.1:9"]) == {}


def test_the_embedded_engine_counts_a_repeated_prompt_as_cached(tiny_model_dir) -> None:
    """One long prompt sent four times: the first is computed, the next three reuse all but its
    last token (the engine always computes the last position's logits)."""
    rate = PrefixCacheRate()
    with EmbeddedEngine(tiny_model_dir, served_model_name="tiny", max_model_len=2048) as engine:
        assert rate.since_last(engine.urls) == {}
        body = {
            "model": "tiny",
            "messages": [{"role": "user", "content": "count the words in this line " * 20}],
            "max_tokens": 1,
            "return_token_ids": True,
        }
        sizes = []
        for _ in range(4):
            r = httpx.post(f"{engine.base_url}/chat/completions", json=body, timeout=60)
            sizes.append(len(r.json()["prompt_token_ids"]))
        m = rate.since_last(engine.urls)
    n = sizes[0]
    assert m["engine/prefix_cache_hit_tokens"] == 3 * (n - 1)
    assert abs(m["engine/prefix_cache_hit_rate"] - 3 * (n - 1) / (4 * n)) < 1e-9
