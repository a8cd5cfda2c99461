"""`GET /metrics` on the embedded engine: requests by route and status, generated tokens (a counter
and a tokens/s gauge), queue depth, batch size, prefix-cache lookups and hits, policy version;
no token needed unless `--metrics-token` is given."""

from __future__ import annotations

import httpx
import openai

from polar_pl.engine.embedded import EmbeddedEngine
from polar_pl.testing.metrics import scrape

MSGS = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Count to three."}]


def test_metrics_count_requests_tokens_and_prefix_cache_hits(engine):
    """Nothing to scrape (issue 58): GET /metrics was a 404 on the embedded engine."""
    before = scrape(engine.url)
    client = openai.OpenAI(base_url=engine.base_url, api_key="x", max_retries=0)
    for _ in range(2):  # the second prompt is found in the prefix cache
        client.chat.completions.create(
            model="tiny", messages=MSGS, max_tokens=4, temperature=0, extra_body={"ignore_eos": True}
        )
    after = scrape(engine.url)

    def grew(name: str, **labels: str) -> float:
        return after.value(name, **labels) - before.value(name, **labels)

    assert grew("polar_engine_http_requests_total", route="/v1/chat/completions", status="200") == 2
    assert grew("polar_engine_requests_total") == 2
    assert grew("polar_engine_generation_tokens_total") == 8
    assert grew("polar_engine_decode_steps_total") >= 4
    assert grew("polar_engine_prefix_cache_lookups_total") == 2
    assert grew("polar_engine_prefix_cache_hits_total") >= 1
    assert (
        grew("polar_engine_prefix_cache_query_tokens_total")
        > grew("polar_engine_prefix_cache_hit_tokens_total")
        > 0
    )
    stats = httpx.get(f"{engine.url}/stats").json()
    assert after.value("polar_engine_generation_tokens_total") == stats["tokens_generated"]
    assert after.value("polar_engine_batch_size_max") >= 1
    assert after.value("polar_engine_queue_depth") == 0
    assert after.value("polar_engine_generation_tokens_per_second") > 0
    assert after.value("polar_engine_policy_version") == engine.policy_version()
    assert {"polar_engine_batch_size", "polar_engine_running_requests"} <= after.families
    assert "Count to three" not in after.text  # no prompt text


def test_metrics_token_through_the_engine_cli(tiny_model_dir):
    """`polar-pl engine --metrics-token` (the subprocess engine passes it on): 401 without it."""
    with EmbeddedEngine(tiny_model_dir, mode="subprocess", metrics_token="scrape-me", num_threads=1) as eng:
        assert httpx.get(f"{eng.url}/metrics").status_code == 401
        bad = httpx.get(f"{eng.url}/metrics", headers={"authorization": f"Bearer {eng.admin_token}"})
        assert bad.status_code == 401 and "metrics token" in bad.json()["error"]["message"]
        assert scrape(eng.url, token="scrape-me").value("polar_engine_policy_version") == 0
        assert httpx.get(f"{eng.url}/health").status_code == 200
