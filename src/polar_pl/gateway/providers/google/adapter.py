"""Google generateContent adapter (`/v1beta/models/{model}:generateContent`, `:streamGenerateContent`).

Gemini CLI and pi speak it. Requests are converted in `request.py`, streams in
`stream.py`; this module holds the adapter the gateway core looks up (`adapter`), the
non-streaming response conversion and the error shape. The model name comes from the path.
"""

from __future__ import annotations

from typing import Any

from polar_pl.gateway.providers.base import NormalizedRequest, RequestError
from polar_pl.gateway.providers.google.request import parse_path, request_to_chat
from polar_pl.gateway.providers.google.stream import (
    GoogleStream,
    error_payload,
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


class GoogleAdapter:
    """The Gemini generateContent API, translated to and from the engine's chat completions."""

    name = "google"

    def to_chat(self, body: dict[str, Any], *, path: str, query: dict[str, str]) -> NormalizedRequest:
        model, stream = parse_path(path)
        chat, notes, options = request_to_chat(body)
        alt = query.get("alt", "json")
        if alt not in ("sse", "json"):
            raise RequestError(f"alt={alt!r} is not supported: use alt=sse or alt=json")
        if stream and alt == "json":
            # Without alt=sse, Gemini streams one JSON array, element by element.
            options = {**options, "array": True, "media_type": "application/json"}
        return NormalizedRequest(chat=chat, stream=stream, model=model, notes=tuple(notes), extra=options)

    def from_chat(self, response: dict[str, Any], req: NormalizedRequest) -> dict[str, Any]:
        return response_from_chat(response, req.model, bool(req.extra.get("include_thoughts")))

    def stream(self, req: NormalizedRequest) -> GoogleStream:
        return GoogleStream(
            req.model, bool(req.extra.get("include_thoughts")), array=bool(req.extra.get("array"))
        )

    def error_body(self, status: int, message: str) -> dict[str, Any]:
        return error_payload(status, message)


adapter = GoogleAdapter()
