"""Engine chat completion -> an Anthropic `message` object (non-streaming), and the model list."""

from __future__ import annotations

import json
from typing import Any

from polar_pl.gateway.providers.anthropic.stream import new_message_id, stop_reason_for
from polar_pl.gateway.providers.thinking_signature import encode_signature


def response_from_chat(
    response: dict[str, Any], model: str, stops: list[str], show_thinking: bool = True
) -> dict[str, Any]:
    """A full engine chat completion -> an Anthropic `message` object."""
    choices = response.get("choices") or [{}]
    choice = choices[0]
    message = choice.get("message") or {}
    content = message_blocks(message, show_thinking)
    had_tool_calls = any(block["type"] == "tool_use" for block in content)
    reason, sequence = stop_reason_for(
        choice.get("finish_reason"), choice.get("stop_reason"), stops, had_tool_calls
    )
    usage = response.get("usage") or {}
    prompt_tokens = usage.get("prompt_tokens")
    if prompt_tokens is None and isinstance(response.get("prompt_token_ids"), list):
        prompt_tokens = len(response["prompt_token_ids"])
    return {
        "id": new_message_id(),
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content,
        "stop_reason": reason,
        "stop_sequence": sequence,
        "usage": {
            "input_tokens": prompt_tokens or 0,
            "output_tokens": usage.get("completion_tokens") or 0,
            "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": 0,
        },
    }


def message_blocks(message: dict[str, Any], show_thinking: bool = True) -> list[dict[str, Any]]:
    """Engine assistant message -> content blocks in generation order: thinking, text, tool_use.

    With `display: "omitted"` the thinking text is left out, as Anthropic does; the signature
    still carries it, so the turn sent back re-renders with its reasoning.
    """
    blocks: list[dict[str, Any]] = []
    reasoning = message.get("reasoning_content") or message.get("reasoning")
    if reasoning:
        shown = reasoning if show_thinking else ""
        blocks.append({"type": "thinking", "thinking": shown, "signature": encode_signature(reasoning)})
    if message.get("content"):
        blocks.append({"type": "text", "text": message["content"]})
    for call in message.get("tool_calls") or ():
        function = call.get("function") or {}
        blocks.append(
            {
                "type": "tool_use",
                "id": call.get("id") or "toolu_" + new_message_id()[4:],
                "name": function.get("name") or "",
                "input": parse_arguments(function.get("arguments")),
            }
        )
    return blocks


def parse_arguments(arguments: Any) -> dict[str, Any]:
    """Tool-call arguments (a JSON string) -> the tool_use input object; {} if not an object."""
    if isinstance(arguments, dict):
        return arguments
    try:
        value = json.loads(arguments or "{}")
    except (TypeError, ValueError):
        return {}
    return value if isinstance(value, dict) else {}


def models_list(name: str) -> dict[str, Any]:
    """`GET /v1/models` with Anthropic's headers: the served model."""
    return {
        "data": [{"type": "model", "id": name, "display_name": name, "created_at": "1970-01-01T00:00:00Z"}],
        "has_more": False,
        "first_id": name,
        "last_id": name,
    }
