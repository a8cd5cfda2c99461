"""The chat form: a record's normalized request plus its sampled tokens, read back with the engine's
parser, as TRL reads conversations (object arguments, reasoning_content, tools)."""

from __future__ import annotations

import pytest

from polar_pl.gateway.store.records import TraceRecord
from polar_pl.harness.mini_agent import TOOLS
from polar_pl.sft.conversation import conversation, sampled_message, split_reasoning, turn_counts
from polar_pl.testing.scripted import Reply, ScriptedBackend, ToolCall


@pytest.fixture(scope="module")
def backend(tiny_model_dir):
    return ScriptedBackend.from_model_dir(tiny_model_dir, [])


def record(messages, response_ids, tools=TOOLS) -> TraceRecord:
    return TraceRecord(
        session_id="s", call_index=3, timestamp=0.0, provider="openai_chat", raw_request={}, raw_response="",
        normalized_request={"model": "m", "messages": messages, "tools": tools}, prompt_ids=[1, 2],
        response_ids=response_ids, response_logprobs=[-0.1] * len(response_ids), finish_reason="stop",
        policy_version=0, latency_s=0.1,
    )  # fmt: skip


def test_sampled_tool_call_turn_becomes_an_assistant_message(backend):
    reply = Reply("Let me look.", tool_calls=[ToolCall("bash", {"command": "ls -la", "n": 2})])
    msg = sampled_message(backend.tokenizer, backend.render_reply(reply, None))
    assert msg["role"] == "assistant" and msg["content"].strip() == "Let me look."
    (call,) = msg["tool_calls"]
    assert call["type"] == "function" and call["id"].startswith("chatcmpl-tool-")
    assert call["function"] == {"name": "bash", "arguments": {"command": "ls -la", "n": 2}}


def test_reasoning_is_split_from_the_answer(backend):
    ids = backend.render_reply(Reply("42", reasoning="six times seven"), None)
    msg = sampled_message(backend.tokenizer, ids)
    assert msg == {"role": "assistant", "content": "42", "reasoning_content": "six times seven"}
    assert split_reasoning("no thinking here") == (None, "no thinking here")


def test_conversation_is_the_request_history_plus_the_sampled_turn(backend):
    history = [
        {"role": "system", "content": [{"type": "text", "text": "be brief"}]},
        {"role": "user", "content": "fix it"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "bash", "arguments": '{"command": "ls"}'}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "a.py"},
    ]  # fmt: skip
    conv = conversation(backend.tokenizer, record(history, backend.render_reply("Fixed.", None)))
    msgs = conv["messages"]
    assert msgs[0] == {"role": "system", "content": "be brief"}  # text parts joined
    assert msgs[2]["tool_calls"][0]["function"]["arguments"] == {"command": "ls"}  # object, as TRL wants
    assert msgs[3] == {"role": "tool", "content": "a.py", "tool_call_id": "c1"}
    assert msgs[-1] == {"role": "assistant", "content": "Fixed."}
    assert [t["function"]["name"] for t in conv["tools"]] == ["bash", "write_file", "str_replace"]
    assert turn_counts(msgs) == (4, 2)
    text = backend.tokenizer.apply_chat_template(msgs, tools=conv["tools"], tokenize=False)
    assert "Fixed.<|im_end|>" in text


def test_a_record_without_messages_is_a_clear_error(backend):
    with pytest.raises(ValueError, match="session s call 3: no messages"):
        conversation(backend.tokenizer, record([], [1]))
