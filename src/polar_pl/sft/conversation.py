"""The chat form of a trajectory: the conversation the model saw, as TRL's SFTTrainer reads it.

A row's last call holds the whole conversation up to that call in its normalized request (the
OpenAI Chat body the gateway sent to the engine, whatever API the harness spoke). The sampled
answer to that call is read back from the recorded token ids with the engine's own hermes parser,
so the final assistant turn is exactly what was sampled, tool calls included. Messages are written
as chat templates take them (`chat.render.conversation_for_template`): text parts joined, tool
call arguments as objects, reasoning in `reasoning_content`.

    {"messages": [{"role": "system", ...}, {"role": "user", ...},
                  {"role": "assistant", "content": "", "tool_calls": [{"type": "function",
                   "function": {"name": "bash", "arguments": {"command": "ls"}}}]},
                  {"role": "tool", "tool_call_id": ..., "content": ...}, ...],
     "tools": [{"type": "function", "function": {"name": ..., "parameters": {...}}}]}
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from polar_pl.chat.render import conversation_for_template, tools_for_template
from polar_pl.chat.toolparse import parse_tool_calls
from polar_pl.gateway.store.records import TraceRecord


def split_reasoning(text: str) -> tuple[str | None, str]:
    """(reasoning, content) of a sampled turn, split at `</think>` as Qwen3-style templates do."""
    if "</think>" not in text:
        return None, text
    head, _, tail = text.partition("</think>")
    return head.split("<think>")[-1].strip("\n"), tail.lstrip("\n")


def sampled_message(tokenizer: Any, response_ids: list[int]) -> dict[str, Any]:
    """The assistant message the engine's parser makes of these sampled tokens."""
    text = tokenizer.decode(list(response_ids), skip_special_tokens=True)
    parsed = parse_tool_calls(text)
    reasoning, content = split_reasoning((parsed.content or "") if parsed.tools_called else text)
    msg: dict[str, Any] = {"role": "assistant", "content": content}
    if reasoning is not None:
        msg["reasoning_content"] = reasoning
    if parsed.tool_calls:
        msg["tool_calls"] = [_with_object_arguments(c) for c in parsed.tool_calls]
    return msg


def _with_object_arguments(call: Mapping[str, Any]) -> dict[str, Any]:
    fn = dict(call["function"])
    args = fn.get("arguments")
    if isinstance(args, str):
        try:
            fn["arguments"] = json.loads(args) if args else {}
        except ValueError:
            pass  # not JSON: kept as the model wrote it
    return {**call, "function": fn}


def _template_message(msg: dict[str, Any]) -> dict[str, Any]:
    """Template-ready message without the internal duplicate key (`reasoning`)."""
    out = dict(msg)
    if "reasoning" in out:
        out.setdefault("reasoning_content", out.pop("reasoning"))
    return out


def conversation(tokenizer: Any, last: TraceRecord) -> dict[str, Any]:
    """{"messages": [...], "tools": [...]} of the conversation ending with `last`'s sampled turn.

    Raises ValueError when the normalized request holds no message list (a malformed record).
    """
    body = last.normalized_request or {}
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise ValueError(f"session {last.session_id} call {last.call_index}: no messages in the request")
    history = [_template_message(m) for m in conversation_for_template(messages)]
    tools = tools_for_template(body.get("tools")) or []
    return {"messages": [*history, sampled_message(tokenizer, last.response_ids)], "tools": tools}


def turn_counts(messages: list[dict[str, Any]]) -> tuple[int, int]:
    """(turns, assistant turns) of a conversation; the system prompt is not a turn."""
    turns = [m for m in messages if m.get("role") != "system"]
    return len(turns), sum(m.get("role") == "assistant" for m in turns)
