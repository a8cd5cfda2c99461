"""CallCapture keeps the engine's matched stop string: a non-streaming Anthropic request stopped by
one of its stop sequences must say `stop_sequence` (it said `end_turn` when the capture dropped it)."""

from __future__ import annotations

import anthropic
import pytest

from polar_pl.gateway.call.capture import CallCapture


def test_completion_keeps_the_last_choice_stop_reason() -> None:
    cap = CallCapture()
    cap.add({"id": "x", "choices": [{"index": 0, "delta": {"content": "Hi"}, "finish_reason": None}]})
    cap.add(
        {"id": "x", "choices": [{"index": 0, "delta": {}, "finish_reason": "stop", "stop_reason": "END"}]}
    )
    choice = cap.completion()["choices"][0]
    assert (choice["finish_reason"], choice["stop_reason"]) == ("stop", "END")


@pytest.mark.parametrize("which", ["gateway", "faithful_gateway"])
def test_non_streaming_anthropic_request_reports_its_stop_sequence(engine, script, request, which) -> None:
    gw = request.getfixturevalue(which)
    script.default = lambda chat: "Counting: one two STOP three four"
    s = gw.create_session()
    client = anthropic.Anthropic(base_url=s.base_url, api_key="unused", max_retries=0)
    kw = {
        "model": "c",
        "max_tokens": 64,
        "stop_sequences": ["STOP"],
        "messages": [{"role": "user", "content": "count"}],
    }
    msg = client.messages.create(**kw)
    assert (msg.stop_reason, msg.stop_sequence) == ("stop_sequence", "STOP")
    assert "three" not in msg.content[0].text
    with client.messages.stream(**kw) as st:  # the streaming answer says the same
        streamed = st.get_final_message()
    assert (streamed.stop_reason, streamed.stop_sequence) == ("stop_sequence", "STOP")
    assert [r.finish_reason for r in gw.records(s.session_id)] == ["stop", "stop"]
