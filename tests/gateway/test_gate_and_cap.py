"""The engine gate (weight-update pause: drain / keep, waiting calls, timeout answer, in-flight and
engine-busy stats) and the per-call response-length cap, against a slow scripted engine."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import anthropic
import httpx
import openai
import pytest

from polar_pl.gateway.call.gate import DrainTimeout
from polar_pl.gateway.handle import Gateway
from polar_pl.testing.scripted import Reply, serve_scripted

LONG = "one two three four five six seven eight nine ten " * 3


@pytest.fixture
def slow_engine(tiny_model_dir):
    """~30 tokens at 40 ms each: a call stays in flight for about a second."""
    with serve_scripted(lambda chat: Reply(LONG), model_dir=tiny_model_dir, token_delay=0.04) as srv:
        yield srv


@pytest.fixture
def gw(slow_engine, tmp_path, tiny_model_dir) -> Iterator[Gateway]:
    with Gateway([slow_engine.url], tmp_path / "t.db", tokenizer_dir=tiny_model_dir, pause_timeout=20) as g:
        yield g


def call_in_thread(gw: Gateway, session_id_out: list, done: list, *, stream: bool = True) -> threading.Thread:
    s = gw.create_session()
    session_id_out.append(s.session_id)

    def run() -> None:
        client = openai.OpenAI(base_url=f"{s.base_url}/v1", api_key="unused", max_retries=0)
        kw = {"model": "m", "messages": [{"role": "user", "content": "count"}]}
        if stream:
            text = "".join(
                ev.choices[0].delta.content or ""
                for ev in client.chat.completions.create(stream=True, **kw)
                if ev.choices
            )
        else:
            text = client.chat.completions.create(**kw).choices[0].message.content
        done.append((time.monotonic(), text))

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


def wait_for(pred, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.01)


def test_drain_waits_for_the_calls_in_flight(gw) -> None:
    sids, done = [], []
    t = call_in_thread(gw, sids, done)
    wait_for(lambda: gw.stats()["gateway/in_flight"] == 1)
    gw.pause("drain")
    # the engine call is over (its record is durable before the harness gets the last bytes)
    assert [r.status for r in gw.records(sids[0])] == ["ok"], "drain returned before the call finished"
    assert gw.paused and gw.stats()["gateway/in_flight"] == 0
    gw.resume()
    t.join(10)
    assert done[0][1].strip() == LONG.strip()
    (rec,) = gw.records(sids[0])
    assert rec.status == "ok" and rec.finish_reason == "stop"


def test_keep_lets_calls_in_flight_run_and_new_calls_wait_until_resume(gw) -> None:
    sids, done = [], []
    first = call_in_thread(gw, sids, done)
    wait_for(lambda: gw.stats()["gateway/in_flight"] == 1)
    gw.pause("keep")
    assert gw.stats()["gateway/in_flight"] == 1 and not done, "keep returned at once"
    late_done: list = []
    late = call_in_thread(gw, sids, late_done, stream=False)
    wait_for(lambda: gw.stats()["gateway/gate_waiting"] == 1)
    first.join(10)
    assert done, "the call in flight ran on while paused"
    time.sleep(0.3)
    assert not late_done and gw.stats()["gateway/in_flight"] == 0, "a new call passed a paused gate"
    resumed = time.monotonic()
    gw.resume()
    late.join(20)
    assert late_done and late_done[0][0] > resumed and late_done[0][1].strip() == LONG.strip()
    assert [r.status for sid in sids for r in gw.records(sid)] == ["ok", "ok"]
    stats = gw.stats()
    assert stats["gateway/gate_held"] == 1 and stats["gateway/paused_s"] > 0.3
    assert 0 < stats["gateway/engine_busy"] < 1
    assert 0 < stats["gateway/engine_busy_s"] < stats["gateway/uptime_s"]


def test_a_call_waiting_past_the_pause_timeout_gets_a_retryable_provider_error(slow_engine, tmp_path) -> None:
    with Gateway([slow_engine.url], tmp_path / "t.db", pause_timeout=0.3) as gw:
        gw.pause("keep")
        s = gw.create_session()
        with pytest.raises(anthropic.InternalServerError) as err:
            anthropic.Anthropic(base_url=s.base_url, api_key="unused", max_retries=0).messages.create(
                model="c", max_tokens=8, messages=[{"role": "user", "content": "hi"}]
            )
        assert err.value.status_code == 529 and err.value.response.headers["retry-after"]
        assert err.value.body["error"]["type"] == "overloaded_error"
        with pytest.raises(openai.InternalServerError) as oerr:
            openai.OpenAI(
                base_url=f"{s.base_url}/v1", api_key="unused", max_retries=0
            ).chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
        assert oerr.value.status_code == 503
        assert [r.status for r in gw.records(s.session_id)] == ["error", "error"]
        assert gw.stats()["gateway/gate_refused"] == 2
        gw.resume()


def test_admin_pause_and_resume_routes(gw) -> None:
    with httpx.Client(base_url=gw.url, headers={"authorization": f"Bearer {gw.admin_token}"}) as admin:
        assert admin.post("/admin/pause", json={"mode": "sideways"}).status_code == 400
        assert httpx.post(f"{gw.url}/admin/pause").status_code == 401
        assert admin.post("/admin/pause", json={"timeout": "soon"}).status_code == 400
        r = admin.post("/admin/pause", json={"mode": "keep"})
        assert r.json() | {"waited_s": 0} == {
            "paused": True,
            "mode": "keep",
            "in_flight": 0,
            "waited_for": 0,
            "waited_s": 0,
        }
        assert gw.paused and admin.get("/admin/stats").json()["gateway/paused"] == 1.0
        assert admin.post("/admin/pause").json()["mode"] == "drain"  # idle engine: drained at once
        assert admin.post("/admin/resume").json()["paused"] is False and not gw.paused


def test_a_drain_past_its_timeout_says_what_it_waited_for(gw) -> None:
    """`pause("drain")` had no timeout: a call that never ended (a leaked in-flight count did the
    same) kept the trainer's weight push waiting for ever."""
    sids, done = [], []
    t = call_in_thread(gw, sids, done)
    wait_for(lambda: gw.stats()["gateway/in_flight"] == 1)
    with httpx.Client(base_url=gw.url, headers={"authorization": f"Bearer {gw.admin_token}"}) as admin:
        r = admin.post("/admin/pause", json={"mode": "drain", "timeout": 0.05})
    assert r.status_code == 504 and r.json()["waited_for"] == 1 and r.json()["in_flight"] == 1
    assert "1 still in flight" in r.json()["error"] and gw.paused
    with pytest.raises(DrainTimeout, match="waited for 1 engine calls"):
        gw.pause("drain", timeout=0.05)
    report = gw.pause("drain", timeout=20)  # the call ends: the drain returns
    assert report.waited_for == 1 and report.in_flight == 0 and report.waited_s > 0
    gw.resume()
    t.join(10)
    assert done and [r.status for r in gw.records(sids[0])] == ["ok"]


def test_pause_rejects_an_unknown_mode(gw) -> None:
    with pytest.raises(ValueError, match="drain, keep"):
        gw.pause("later")


# ---- max_tokens_cap -------------------------------------------------------------------------


@pytest.mark.parametrize("faithful", [False, True])
def test_max_tokens_cap_clips_requests_and_notes_it(slow_engine, tmp_path, tiny_model_dir, faithful) -> None:
    """Claude Code asks for 32000 tokens; the run's budget wins, and the record says so."""
    slow_engine.backend.token_delay = 0.0
    with Gateway(
        [slow_engine.url],
        tmp_path / "t.db",
        tokenizer_dir=tiny_model_dir,
        token_faithful=faithful,
        max_tokens_cap=6,
    ) as gw:
        s = gw.create_session()
        client = anthropic.Anthropic(base_url=s.base_url, api_key="unused", max_retries=0)
        big = client.messages.create(
            model="c", max_tokens=32000, messages=[{"role": "user", "content": "hi"}], timeout=60
        )
        small = client.messages.create(model="c", max_tokens=3, messages=[{"role": "user", "content": "hi"}])
        oa = openai.OpenAI(base_url=f"{s.base_url}/v1", api_key="unused", max_retries=0)
        unset = oa.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
        records = gw.records(s.session_id)
    assert big.stop_reason == "max_tokens" and big.usage.output_tokens == 6
    assert small.usage.output_tokens == 3 and unset.usage.completion_tokens == 6
    assert [r.params.max_tokens for r in slow_engine.backend.requests] == [6, 3, 6]

    rb, rs, ru = records
    assert (
        "max_tokens capped: requested 32000, sent 6" in rb.notes and rb.normalized_request["max_tokens"] == 6
    )
    assert not any("capped" in n for n in rs.notes + ru.notes)
    assert len(rb.response_ids) == 6 and rb.finish_reason == "length"


def test_max_tokens_cap_must_be_positive(slow_engine, tmp_path) -> None:
    with pytest.raises(ValueError, match="max_tokens_cap"):
        Gateway([slow_engine.url], tmp_path / "t.db", max_tokens_cap=0)


def test_cap_policy_end_turn_tells_the_harness_a_normal_stop_and_merges_exactly(
    slow_engine, tmp_path, tiny_model_dir
) -> None:
    """With a small cap Claude Code exits 1 ("response exceeded the output token maximum") and
    Codex too ("Incomplete response ... max_output_tokens"); end_turn reports the cut as a normal
    end of turn while the record keeps finish_reason length, the harness's own smaller max_tokens
    still reports max_tokens, and the continued conversation prefix-merges into one row."""
    from polar_pl.trajectory import PrefixBuilder

    slow_engine.backend.token_delay = 0.0
    with Gateway(
        [slow_engine.url],
        tmp_path / "t.db",
        tokenizer_dir=tiny_model_dir,
        max_tokens_cap=6,
        cap_policy="end_turn",
    ) as gw:
        s = gw.create_session()
        client = anthropic.Anthropic(base_url=s.base_url, api_key="unused", max_retries=0)
        first = [{"role": "user", "content": "hi"}]
        big = client.messages.create(model="c", max_tokens=32000, messages=first, timeout=60)
        with client.messages.stream(model="c", max_tokens=32000, messages=first) as stream:
            streamed = stream.get_final_message()
        own = client.messages.create(model="c", max_tokens=3, messages=first)
        second = [
            *first,
            {"role": "assistant", "content": big.content[0].text},
            {"role": "user", "content": "go on"},
        ]
        client.messages.create(model="c", max_tokens=32000, messages=second, timeout=60)
        oa = openai.OpenAI(base_url=f"{s.base_url}/v1", api_key="unused", max_retries=0)
        chat = oa.chat.completions.create(model="m", messages=first)
        chat_stream = list(oa.chat.completions.create(model="m", messages=first, stream=True))
        records = gw.records(s.session_id)
    assert big.stop_reason == streamed.stop_reason == "end_turn" and big.usage.output_tokens == 6
    assert own.stop_reason == "max_tokens"  # the harness's own limit is reported as it is
    assert chat.choices[0].finish_reason == "stop"
    assert [c.choices[0].finish_reason for c in chat_stream if c.choices and c.choices[0].finish_reason] == [
        "stop"
    ]
    assert all(r.finish_reason == "length" for r in records), [r.finish_reason for r in records]
    noted = [any("cap_policy end_turn" in n for n in r.notes) for r in records]
    assert noted == [True, True, False, True, True, True]
    # the cut turn comes back closed by an <|im_end|> the policy never sampled: masked glue
    result = PrefixBuilder().build([records[0], records[3]], reward=1.0)
    assert result.stats.rows == 1 and result.stats.num_breaks == 0
    (row,) = result.rows
    assert sum(row.loss_mask) == len(records[0].response_ids) + len(records[3].response_ids)


def test_cap_policy_must_be_known(slow_engine, tmp_path) -> None:
    with pytest.raises(ValueError, match="cap_policy"):
        Gateway([slow_engine.url], tmp_path / "t.db", cap_policy="truncate")
