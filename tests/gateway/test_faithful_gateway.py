"""Token-faithful prompts in the gateway's request path: official SDKs, multi-turn tool sessions,
a scripted engine. With the option on a session merges into one chain with zero drift; with it off
the same session drifts (the template drops the earlier turn's thinking on re-render)."""

from __future__ import annotations

from typing import Any

import anthropic
import openai
import pytest

from polar_pl.engine.server import create_app
from polar_pl.gateway.handle import Gateway
from polar_pl.testing.scripted import Reply, ScriptedBackend, ToolCall
from polar_pl.trajectory import PrefixBuilder
from polar_pl.utils.serving import ServerThread, free_port

OPENAI_TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "ls",
            "description": "list files",
            "parameters": {"type": "object", "properties": {"path": {"type": "string"}}},
        },
    }
]
ANTHROPIC_TOOLS = [
    {
        "name": "ls",
        "description": "list files",
        "input_schema": {"type": "object", "properties": {"path": {"type": "string"}}},
    }
]


def three_turns() -> list[Reply]:
    """Think + text + tool call, think + tool call, final answer (the template strips thinking
    it re-renders from earlier turns, so the plain chat path drifts)."""
    return [
        Reply("Let me look.", tool_calls=[ToolCall("ls", {"path": "src"})], reasoning="I should look."),
        Reply(tool_calls=[ToolCall("ls", {"path": "tests"})], reasoning="Now the tests."),
        Reply("src has a.py; tests has test_a.py."),
    ]


def openai_session(gw: Gateway, stream: bool) -> tuple[str, list[Any]]:
    s = gw.create_session(task_id="t", harness="pi")
    client = openai.OpenAI(base_url=f"{s.base_url}/v1", api_key="unused", max_retries=0)
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You are a coding agent."},
        {"role": "user", "content": "What is in src and tests?"},
    ]
    answers = []
    for _ in range(3):
        kw = {"model": "m", "messages": messages, "tools": OPENAI_TOOLS, "max_tokens": 128}
        if stream:
            acc = {"content": "", "calls": {}}
            finish = None
            for ev in client.chat.completions.create(stream=True, **kw):
                if not ev.choices:
                    continue
                d = ev.choices[0].delta
                acc["content"] += d.content or ""
                for tc in d.tool_calls or ():
                    slot = acc["calls"].setdefault(tc.index, {"id": tc.id, "name": "", "arguments": ""})
                    slot["name"] += tc.function.name or ""
                    slot["arguments"] += tc.function.arguments or ""
                finish = ev.choices[0].finish_reason or finish
            calls = [acc["calls"][i] for i in sorted(acc["calls"])]
            msg: dict[str, Any] = {"role": "assistant", "content": acc["content"] or None}
        else:
            r = client.chat.completions.create(**kw)
            finish, m = r.choices[0].finish_reason, r.choices[0].message
            calls = [
                {"id": c.id, "name": c.function.name, "arguments": c.function.arguments}
                for c in m.tool_calls or ()
            ]
            msg = {"role": "assistant", "content": m.content}
        answers.append((finish, msg["content"], [(c["name"], c["arguments"]) for c in calls]))
        if calls:
            msg["tool_calls"] = [
                {
                    "id": c["id"],
                    "type": "function",
                    "function": {"name": c["name"], "arguments": c["arguments"]},
                }
                for c in calls
            ]
        messages.append(msg)
        messages += [{"role": "tool", "tool_call_id": c["id"], "content": "a.py"} for c in calls]
    return s.session_id, answers


def anthropic_session(gw: Gateway) -> tuple[str, list[Any]]:
    s = gw.create_session(task_id="t", harness="claude_code")
    client = anthropic.Anthropic(base_url=s.base_url, api_key="unused", max_retries=0)
    messages: list[dict[str, Any]] = [{"role": "user", "content": "What is in src and tests?"}]
    answers = []
    for _ in range(3):
        with client.messages.stream(
            model="claude-x", max_tokens=128, system="You are a coding agent.", tools=ANTHROPIC_TOOLS,
            messages=messages,
        ) as st:  # fmt: skip
            final = st.get_final_message()
        blocks = [b.model_dump(exclude_none=True) for b in final.content]
        answers.append(
            (
                final.stop_reason,
                [(b["type"], b.get("text") or b.get("thinking") or b.get("input")) for b in blocks],
            )
        )
        messages.append({"role": "assistant", "content": blocks})
        uses = [b for b in blocks if b["type"] == "tool_use"]
        if uses:
            messages.append(
                {
                    "role": "user",
                    "content": [
                        {"type": "tool_result", "tool_use_id": b["id"], "content": "a.py"} for b in uses
                    ],
                }
            )
    return s.session_id, answers


def stats_of(gw: Gateway, sid: str):
    records = gw.records(sid)
    assert [r.status for r in records] == ["ok"] * 3
    return PrefixBuilder().build(records).stats, records


@pytest.mark.parametrize("stream", [False, True])
def test_openai_sdk_session_has_zero_drift_with_faithful_prompts(
    engine, script, gateway, checked_gateway, stream: bool
) -> None:
    """(checked: the incremental prompts are compared with full renders, which are kept)"""
    script.queue.extend(three_turns())
    plain_sid, plain_answers = openai_session(gateway, stream)
    script.queue.extend(three_turns())
    sid, answers = openai_session(checked_gateway, stream)
    assert checked_gateway.stats()["gateway/faithful/incremental"] == 2

    # what the harness sees, tool calls included, is the same on both paths (the engine's parser)
    assert answers == plain_answers
    assert [a[0] for a in answers] == ["tool_calls", "tool_calls", "stop"]
    assert answers[0][2] == [("ls", '{"path": "src"}')]

    plain, _ = stats_of(gateway, plain_sid)
    assert set(plain.breaks) == {"drift"} and plain.rows == 1 + plain.breaks["drift"] >= 2
    faithful, records = stats_of(checked_gateway, sid)
    assert faithful.breaks == {} and faithful.rows == 1 and faithful.spliced_calls >= 1
    assert faithful.compression_ratio > plain.compression_ratio
    # the record keeps the chat body (not a token prompt) and both prompts where they differ
    first, second, third = records
    assert "prompt" not in second.normalized_request and second.normalized_request["messages"]
    assert first.rendered_prompt_ids is None
    assert second.rendered_prompt_ids is not None and second.rendered_prompt_ids != second.prompt_ids
    assert second.prompt_ids[: len(first.prompt_ids) + len(first.response_ids)] == (
        first.prompt_ids + first.response_ids
    )
    assert "token-faithful: sampled tokens of call 0 spliced in" in second.notes
    assert third.prompt_ids[: len(second.prompt_ids) + len(second.response_ids)] == (
        second.prompt_ids + second.response_ids
    )


def test_anthropic_sdk_session_has_zero_drift_with_faithful_prompts(
    engine, script, gateway, faithful_gateway
) -> None:
    script.queue.extend(three_turns())
    plain_sid, plain_answers = anthropic_session(gateway)
    script.queue.extend(three_turns())
    sid, answers = anthropic_session(faithful_gateway)
    assert answers == plain_answers
    assert [a[0] for a in answers] == ["tool_use", "tool_use", "end_turn"]
    assert ("tool_use", {"path": "src"}) in answers[0][1]
    plain, _ = stats_of(gateway, plain_sid)
    assert plain.breaks.get("drift", 0) >= 1
    faithful, records = stats_of(faithful_gateway, sid)
    assert faithful.breaks == {} and faithful.rows == 1
    assert all(r.normalized_request["messages"] for r in records)


def test_faithful_path_calls_the_token_in_route(engine, script, faithful_gateway) -> None:
    """The engine gets a token prompt (no chat body), and the bad-template case is a 400."""
    script.queue.extend(three_turns())
    sid, _ = openai_session(faithful_gateway, stream=False)
    assert len(engine.backend.requests) == 3
    assert all(req.chat is None for req in engine.backend.requests)
    records = faithful_gateway.records(sid)
    assert [list(req.prompt_ids) for req in engine.backend.requests] == [r.prompt_ids for r in records]


def test_unrenderable_messages_are_a_provider_shaped_400(engine, faithful_gateway) -> None:
    """The gateway renders the prompt itself now: what the engine would refuse (an image for a
    text-only model) is refused the same way, in the provider's shape, and recorded."""
    s = faithful_gateway.create_session()
    client = openai.OpenAI(base_url=f"{s.base_url}/v1", api_key="unused", max_retries=0)
    image = {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}}
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model="m", messages=[{"role": "user", "content": [image]}])
    assert "does not accept images" in str(err.value)
    (rec,) = faithful_gateway.records(s.session_id)
    assert rec.status == "error" and not engine.backend.requests


def test_reasoning_parser_parity_on_the_token_in_path(tiny_model_dir, tmp_path) -> None:
    """An engine with a reasoning parser (vLLM `--reasoning-parser qwen3`) sends thinking as
    `reasoning` on its chat route; the token-in path, given the same parser name, must too, or
    the harness would get the <think> block as answer text."""
    backend = ScriptedBackend.from_model_dir(tiny_model_dir, three_turns() * 2)
    with ServerThread(create_app(backend, reasoning_parser="qwen3")) as eng:
        with Gateway(
            [eng.url], tmp_path / "a.db", tokenizer_dir=tiny_model_dir, token_faithful=False
        ) as plain:
            _, want = anthropic_session(plain)
        with Gateway(
            [eng.url], tmp_path / "b.db", tokenizer_dir=tiny_model_dir, reasoning_parser="qwen3"
        ) as gw:
            sid, got = anthropic_session(gw)
            stats, _ = stats_of(gw, sid)
    assert got == want
    first = [(kind, v.strip() if isinstance(v, str) else v) for kind, v in got[0][1]]
    assert first == [("thinking", "I should look."), ("text", "Let me look."), ("tool_use", {"path": "src"})]
    assert stats.breaks == {} and stats.rows == 1


def test_unknown_reasoning_parser_is_a_config_error(engine, tmp_path, tiny_model_dir) -> None:
    with pytest.raises(ValueError, match="reasoning_parser"):
        Gateway([engine.url], tmp_path / "t.db", tokenizer_dir=tiny_model_dir, reasoning_parser="r1-ish")


def test_a_restarted_gateway_reads_the_session_history_from_the_store_once(
    engine, script, tmp_path, tiny_model_dir
) -> None:
    """The spliced prompt needs the session's earlier records: after a gateway restart (same
    store) they come from the store, so the chain survives the restart with zero drift."""
    script.queue.extend(three_turns())
    store = tmp_path / "t.db"
    messages: list[dict[str, Any]] = [{"role": "user", "content": "What is in src and tests?"}]
    sid, port = None, free_port()
    for turn in range(3):
        with Gateway(
            [engine.url], store, tokenizer_dir=tiny_model_dir, port=port, token_faithful_check=True
        ) as gw:
            if sid is None:
                s = gw.create_session()
                sid, base = s.session_id, s.base_url
            client = openai.OpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0)
            m = (
                client.chat.completions.create(model="m", messages=messages, tools=OPENAI_TOOLS)
                .choices[0]
                .message
            )
            calls = [c.model_dump() for c in m.tool_calls or ()]
            messages.append(
                {"role": "assistant", "content": m.content, **({"tool_calls": calls} if calls else {})}
            )
            messages += [{"role": "tool", "tool_call_id": c["id"], "content": "a.py"} for c in calls]
            if turn == 2:
                records = gw.records(sid)
                stats = gw.stats()
    # the restarted gateway extends the chain it read from the store
    assert stats["gateway/faithful/incremental"] == 1 and stats["gateway/faithful/mismatch"] == 0
    merged = PrefixBuilder().build(records).stats
    assert merged.breaks == {} and merged.rows == 1 and merged.spliced_calls >= 1
