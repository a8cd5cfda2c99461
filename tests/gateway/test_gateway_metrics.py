"""`GET /metrics` on the gateway: Prometheus text the official parser reads, with calls by provider,
route and status, latency histograms, tokens, calls in flight, trace-store writes and the policy
version; no token needed unless the gateway has a metrics token; never recorded as a call."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import httpx
import openai
import pytest

from polar_pl.gateway.handle import Gateway
from polar_pl.testing.metrics import scrape
from polar_pl.utils.serving import free_port

HI = [{"role": "user", "content": "say hi"}]


def _client(base_url: str, key: str = "unused") -> openai.OpenAI:
    return openai.OpenAI(base_url=base_url, api_key=key, max_retries=0, timeout=30)


def test_metrics_count_calls_tokens_latency_and_store_writes(gateway):
    """Nothing to scrape (issue 58): GET /metrics was a 404 and what the gateway counts reached
    only W&B through the trainer."""
    s = gateway.create_session()
    client = _client(f"{s.base_url}/v1")
    client.chat.completions.create(model="m", messages=HI)
    list(client.chat.completions.create(model="m", messages=HI, stream=True))
    with pytest.raises(openai.AuthenticationError):
        _client(f"{gateway.url}/v1", key="not-a-session").chat.completions.create(model="m", messages=HI)

    m = scrape(gateway.url)
    recs = gateway.records(s.session_id)
    chat = {"provider": "openai_chat", "route": "chat_completions"}
    assert m.value("polar_gateway_requests_total", **chat, status="200") == 2
    assert m.value("polar_gateway_requests_total", **chat, status="401") == 1
    assert m.value("polar_gateway_calls_total", provider="openai_chat", status="ok", kind="main") == 2
    assert m.value("polar_gateway_prompt_tokens_total", provider="openai_chat") == sum(
        len(r.prompt_ids) for r in recs
    )
    assert m.value("polar_gateway_completion_tokens_total") == sum(len(r.response_ids) for r in recs) > 0
    for hist in ("polar_gateway_time_to_first_token_seconds", "polar_gateway_request_duration_seconds"):
        assert m.value(f"{hist}_count", provider="openai_chat") == 2
        assert m.value(f"{hist}_bucket", provider="openai_chat", le="+Inf") == 2
    assert m.value("polar_gateway_store_write_seconds_count") >= 2
    assert {
        "polar_gateway_calls_in_flight",
        "polar_gateway_requests_in_flight",
        "polar_gateway_store_backlog",
        "polar_gateway_policy_version",
        "polar_gateway_replica_healthy",
    } <= m.families
    assert m.value("polar_gateway_calls_in_flight") == 0
    assert m.value("polar_gateway_policy_version") == 0
    assert m.value("polar_gateway_replica_healthy") == 1
    # no prompt or completion text, and the scrape is no model call
    assert "say hi" not in m.text and "Hello from the engine" not in m.text
    assert gateway.runtime.store.count() == 2


def test_metrics_token_when_given_and_never_a_session_token(engine, tmp_path):
    """With a metrics token, /metrics answers 401 without it (a session token does not open it)."""
    gw = Gateway([engine.url], tmp_path / "t.db", token_faithful=False, metrics_token="scrape-me").start()
    try:
        s = gw.create_session()
        assert httpx.get(f"{gw.url}/metrics").status_code == 401
        for wrong in (s.token, gw.admin_token, "scrape-m"):
            assert (
                httpx.get(f"{gw.url}/metrics", headers={"authorization": f"Bearer {wrong}"}).status_code
                == 401
            )
        assert scrape(gw.url, token="scrape-me").value("polar_gateway_requests_total") == 0
        # under a session's path it is a harness route like any other, recorded nowhere
        assert httpx.get(f"{s.base_url}/metrics").status_code == 404
        assert gw.runtime.store.count() == 0
    finally:
        gw.stop()


def test_two_gateways_in_one_process_count_apart(gateway, engine, tmp_path):
    """Each gateway has its own registry: a second one neither clashes nor shares counts."""
    other = Gateway([engine.url], tmp_path / "other.db", token_faithful=False).start()
    try:
        s = gateway.create_session()
        _client(f"{s.base_url}/v1").chat.completions.create(model="m", messages=HI)
        assert scrape(gateway.url).value("polar_gateway_calls_total") == 1
        assert scrape(other.url).value("polar_gateway_calls_total") == 0
    finally:
        other.stop()


def test_gateway_cli_metrics_token(engine, tmp_path, tiny_model_dir):
    """`polar-pl gateway --metrics-token T`: /metrics needs T; health and harness traffic do not."""
    port = free_port()
    cmd = [sys.executable, "-m", "polar_pl.cli", "gateway", "--upstream", engine.url, "--port", str(port),
           "--store", str(tmp_path / "cli.db"), "--tokenizer-dir", str(tiny_model_dir),
           "--metrics-token", "cli-scrape"]  # fmt: skip
    env = {**os.environ, "POLAR_ADMIN_TOKEN": "admin-secret"}
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                httpx.get(f"{url}/health", timeout=1).raise_for_status()
                break
            except httpx.HTTPError:
                assert proc.poll() is None and time.monotonic() < deadline, proc.stdout and proc.stdout.read()
                time.sleep(0.2)
        assert httpx.get(f"{url}/metrics").status_code == 401
        assert "polar_gateway_requests" in scrape(url, token="cli-scrape").families
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(30)
