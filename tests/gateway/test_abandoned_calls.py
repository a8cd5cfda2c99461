"""Calls nobody will receive: a non-streamed call whose harness went away, and calls in flight when
the gateway is told to stop. Each is aborted upstream at once (the engine stops generating) and
recorded `aborted`, whatever the store's sync mode."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

import anthropic
import httpx
import openai
import pytest

from polar_pl.gateway.handle import Gateway
from polar_pl.gateway.store.traces import read_records
from polar_pl.testing.scripted import Reply, serve_scripted
from polar_pl.utils.serving import free_port

USER = [{"role": "user", "content": "count"}]
LONG = Reply("word " * 3000)  # ~30 s of generation at 10 ms a token


def wait_for(pred, timeout: float = 15.0) -> bool:
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


@pytest.mark.parametrize("sync", ["OFF", "NORMAL", "FULL", "EXTRA"])
def test_a_non_streamed_call_whose_client_left_is_aborted_upstream_and_recorded(
    tiny_model_dir, tmp_path, sync
):
    """The engine generated to the end after the client left (~34 s for max_tokens 30000; one
    abandoned fuzz call generated for 244 s), and under NORMAL the record said `ok`."""
    with (
        serve_scripted(lambda chat: LONG, model_dir=tiny_model_dir, token_delay=0.01) as eng,
        Gateway([eng.url], tmp_path / "t.db", tokenizer_dir=tiny_model_dir, store_synchronous=sync) as gw,
    ):
        s = gw.create_session()
        client = openai.OpenAI(base_url=f"{s.base_url}/v1", api_key="unused", max_retries=0, timeout=1.0)
        with pytest.raises(openai.APITimeoutError):
            client.chat.completions.create(model="m", messages=USER, max_tokens=30000)
        left = time.monotonic()  # the SDK closed its connection when its timeout fired
        assert wait_for(lambda: eng.backend.abandoned), "the engine generated on"
        abort_s = eng.backend.abandoned[0] - left
        print(f"store-sync {sync}: engine request aborted {abort_s:.3f} s after the client left")
        assert abort_s < 2.0
        assert wait_for(lambda: gw.runtime.store.count(s.session_id) == 1)
        (rec,) = gw.records(s.session_id)
        assert rec.status == "aborted" and "client" in rec.error, (rec.status, rec.error)
        assert 0 < len(rec.response_ids) < 3000 and len(rec.response_logprobs) == len(rec.response_ids)
        stats = gw.stats()
        assert stats["gateway/in_flight"] == 0 and stats["gateway/inflight"] == 0


def start_gateway_process(
    engine_url: str, store, tiny_model_dir, *extra: str
) -> tuple[subprocess.Popen, str]:
    """`polar-pl gateway` as a real process, once it answers /health."""
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "polar_pl.cli", "gateway", "--upstream", engine_url, "--port", str(port),
         "--store", str(store), "--tokenizer-dir", str(tiny_model_dir), "--log-level", "info", *extra],
        env={**os.environ, "POLAR_ADMIN_TOKEN": "admin-secret"},
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while True:
        try:
            httpx.get(f"{url}/health", timeout=1).raise_for_status()
            return proc, url
        except httpx.HTTPError:
            assert proc.poll() is None and time.monotonic() < deadline, proc.stdout.read()
            time.sleep(0.2)


def in_thread(fn) -> tuple[threading.Thread, list]:
    """Run a client call on its own thread; its result or exception lands in the list."""
    out: list = []

    def run() -> None:
        try:
            out.append(fn())
        except Exception as exc:
            out.append(exc)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t, out


def test_sigterm_with_calls_in_flight_exits_within_5s_and_records_them_aborted(tiny_model_dir, tmp_path):
    """SIGTERM to a gateway with such calls in flight took 50-55 s ("timeout graceful shutdown
    exceeded"), the engine generating for them all the while."""
    store = tmp_path / "traces.db"
    with serve_scripted(lambda chat: LONG, model_dir=tiny_model_dir, token_delay=0.01) as eng:
        proc, url = start_gateway_process(eng.url, store, tiny_model_dir)
        try:
            r = httpx.post(f"{url}/admin/sessions", headers={"authorization": "Bearer admin-secret"}, json={})
            base, token = r.json()["base_url"], r.json()["token"]
            chat = openai.OpenAI(base_url=f"{base}/v1", api_key=token, max_retries=0, timeout=60)
            claude = anthropic.Anthropic(base_url=base, api_key=token, max_retries=0, timeout=60)
            calls = [
                in_thread(lambda: chat.chat.completions.create(model="m", messages=USER)),
                in_thread(lambda: claude.messages.create(model="m", max_tokens=30000, messages=USER)),
                in_thread(lambda: list(chat.chat.completions.create(model="m", messages=USER, stream=True))),
                in_thread(lambda: list(chat.responses.create(model="m", input="count", stream=True))),
            ]
            assert wait_for(
                lambda: eng.backend.stats.requests == 4 and eng.backend.stats.tokens_generated > 40
            )
            t0 = time.monotonic()
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=60)
            exit_s = time.monotonic() - t0
        finally:
            if proc.poll() is None:
                proc.kill()
        output = proc.stdout.read()
        print(f"SIGTERM with 4 calls in flight: gateway exited in {exit_s:.2f} s")
        assert exit_s <= 5.0, output
        assert "Traceback" not in output and "timeout graceful shutdown exceeded" not in output, output
        assert len(eng.backend.abandoned) == 4, "the engine generated on"
        print(
            f"engine requests aborted {max(eng.backend.abandoned) - t0:.2f} s after the SIGTERM at the latest"
        )
        for t, _ in calls:
            t.join(timeout=30)
        got = [out[0] for _, out in calls]
        # each client got its provider's retryable error, as an answer or as the stream's last event
        assert isinstance(got[0], openai.InternalServerError) and got[0].status_code == 503, got[0]
        assert isinstance(got[1], anthropic.APIStatusError) and got[1].status_code == 529, got[1]
        assert isinstance(got[2], openai.APIError) and "shutting down" in str(got[2]), got[2]
        assert got[3][-1].type == "response.failed" and "shutting down" in got[3][-1].response.error.message
    records = read_records(store)
    assert len(records) == 4 and {r.status for r in records} == {"aborted"}, [
        (r.status, r.error) for r in records
    ]
    assert {r.error for r in records} == {"gateway shut down"}
    assert all(0 < len(r.response_ids) < 3000 for r in records)
