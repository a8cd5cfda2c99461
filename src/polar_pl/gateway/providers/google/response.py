"""Engine chat completion -> a GenerateContentResponse (non-streaming), and the model list."""

from __future__ import annotations

from typing import Any

from polar_pl.gateway.providers.google.stream import (
    finish_reason_for,
    function_call_part,
    new_response_id,
    sign_parts,
    usage_metadata,
)


def response_from_chat(response: dict[str, Any], model: str, include_thoughts: bool) -> dict[str, Any]:
    """A full engine chat completion -> a GenerateContentResponse with one candidate."""
    choice = (response.get("choices") or [{}])[0]
    message = choice.get("message") or {}
    parts = message_parts(message, include_thoughts)
    candidate: dict[str, Any] = {"index": 0}
    if parts:
        candidate["content"] = {"role": "model", "parts": parts}
    candidate["finishReason"] = finish_reason_for(choice.get("finish_reason"))
    usage = response.get("usage") or {}
    prompt_tokens = usage.get("prompt_tokens")
    if prompt_tokens is None and isinstance(response.get("prompt_token_ids"), list):
        prompt_tokens = len(response["prompt_token_ids"])
    return {
        "candidates": [candidate],
        "usageMetadata": usage_metadata(prompt_tokens, usage.get("completion_tokens")),
        "modelVersion": model,
        "responseId": new_response_id(),
    }


def message_parts(message: dict[str, Any], include_thoughts: bool) -> list[dict[str, Any]]:
    """Engine assistant message -> parts in generation order: thought, text, functionCall."""
    parts: list[dict[str, Any]] = []
    reasoning = message.get("reasoning_content") or message.get("reasoning")
    if reasoning and include_thoughts:
        parts.append({"text": reasoning, "thought": True})
    if message.get("content"):
        parts.append({"text": message["content"]})
    for call in message.get("tool_calls") or ():
        function = call.get("function") or {}
        parts.append(
            function_call_part(call.get("id"), function.get("name") or "", function.get("arguments"))
        )
    sign_parts(parts, [reasoning] if reasoning else [], set())
    return parts


def models_list(name: str) -> dict[str, Any]:
    """`GET /v1beta/models`: the served model."""
    return {
        "models": [
            {
                "name": f"models/{name}",
                "displayName": name,
                "supportedGenerationMethods": ["generateContent", "countTokens"],
            }
        ]
    }
