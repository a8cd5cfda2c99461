"""OpenAI Responses output side: engine chat completions -> response objects, the error shape and
the model list (streams: stream.py).

A chat answer becomes up to three kinds of output items, in this order: a `reasoning` item (the
engine's `reasoning_content`, carried as one summary part, which is what Codex, Pi and the AI SDK
read and send back), a `message` item with one `output_text` part, and one `function_call` item
per tool call; a stream builds the same items (stream.py).
"""

from __future__ import annotations

import os
import time
from typing import Any

from polar_pl.gateway.providers.base import NormalizedRequest
from polar_pl.gateway.providers.openai_chat.response import CONTEXT_TOO_LONG

# finish_reason -> incomplete_details.reason; any other reason completes the response.
INCOMPLETE_REASONS = {"length": "max_output_tokens", "content_filter": "content_filter"}
ERROR_TYPES = {
    400: "invalid_request_error",
    401: "invalid_request_error",
    403: "permission_error",
    404: "invalid_request_error",
    409: "invalid_request_error",
    413: "invalid_request_error",
    422: "invalid_request_error",
    429: "rate_limit_error",
}
ERROR_CODES = {401: "invalid_api_key", 404: "not_found", 429: "rate_limit_exceeded", 504: "timeout"}


def new_id(prefix: str) -> str:
    return f"{prefix}_{os.urandom(12).hex()}"


def error_code(status: int, message: str) -> str | None:
    if CONTEXT_TOO_LONG.search(message):
        return "context_length_exceeded"
    return ERROR_CODES.get(status, "server_error" if status >= 500 else None)


def error_body(status: int, message: str) -> dict[str, Any]:
    """The OpenAI error JSON for an HTTP status."""
    kind = ERROR_TYPES.get(status, "server_error" if status >= 500 else "invalid_request_error")
    return {"error": {"message": message, "type": kind, "param": None, "code": error_code(status, message)}}


def convert_usage(usage: dict[str, Any] | None) -> dict[str, Any]:
    """Chat usage -> Responses usage (input/output tokens and their details)."""
    u = usage or {}
    inp, out = int(u.get("prompt_tokens") or 0), int(u.get("completion_tokens") or 0)
    cached = (u.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
    reasoning = (u.get("completion_tokens_details") or {}).get("reasoning_tokens") or 0
    return {
        "input_tokens": inp,
        "input_tokens_details": {"cached_tokens": cached, "cache_write_tokens": 0},
        "output_tokens": out,
        "output_tokens_details": {"reasoning_tokens": reasoning},
        "total_tokens": inp + out,
    }


def final_status(finish_reason: str | None) -> tuple[str, dict[str, str] | None]:
    """finish_reason -> (response status, incomplete_details)."""
    reason = INCOMPLETE_REASONS.get(finish_reason or "")
    return ("incomplete", {"reason": reason}) if reason else ("completed", None)


# --- items --------------------------------------------------------------------------------------


def output_text_part(text: str) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def reasoning_item(item_id: str, text: str | None) -> dict[str, Any]:
    summary = [] if text is None else [{"type": "summary_text", "text": text}]
    return {"type": "reasoning", "id": item_id, "summary": summary}


def message_item(item_id: str, text: str | None, status: str) -> dict[str, Any]:
    content = [] if text is None else [output_text_part(text)]
    return {"type": "message", "id": item_id, "status": status, "role": "assistant", "content": content}


def function_call_item(item_id: str, call_id: str, name: str, arguments: str, status: str) -> dict[str, Any]:
    return {
        "type": "function_call",
        "id": item_id,
        "call_id": call_id,
        "name": name,
        "arguments": arguments,
        "status": status,
    }


def output_items(message: dict[str, Any], last_status: str) -> list[dict[str, Any]]:
    """A chat assistant message -> output items; the last one gets `last_status`."""
    items: list[dict[str, Any]] = []
    reasoning = message.get("reasoning_content") or message.get("reasoning")
    if reasoning:
        items.append(reasoning_item(new_id("rs"), reasoning))
    text = message.get("content")
    calls = message.get("tool_calls") or []
    if text or not calls:
        items.append(message_item(new_id("msg"), text or "", "completed"))
    for call in calls:
        fn = call.get("function") or {}
        items.append(
            function_call_item(
                new_id("fc"),
                call.get("id") or new_id("call"),
                fn.get("name") or "",
                fn.get("arguments") or "",
                "completed",
            )
        )
    if last_status != "completed" and "status" in items[-1]:
        items[-1]["status"] = last_status
    return items


def envelope(
    req: NormalizedRequest,
    resp_id: str,
    created_at: int,
    status: str,
    output: list[dict[str, Any]],
    usage: dict[str, Any] | None,
    incomplete: dict[str, str] | None = None,
    error: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The response object, with the request fields the real API echoes."""
    return {
        "id": resp_id,
        "object": "response",
        "created_at": created_at,
        "status": status,
        "error": error,
        "incomplete_details": incomplete,
        "model": req.model,
        "output": output,
        "usage": usage,
        "previous_response_id": None,
        **req.extra.get("echo", {"tools": [], "tool_choice": "auto", "parallel_tool_calls": True}),
    }


def build_response(chat: dict[str, Any], req: NormalizedRequest) -> dict[str, Any]:
    """A full engine chat completion -> the Responses response object."""
    choices = chat.get("choices") or [{}]
    choice = choices[0]
    status, incomplete = final_status(choice.get("finish_reason"))
    items = output_items(choice.get("message") or {}, "incomplete" if incomplete else "completed")
    created = int(chat.get("created") or time.time())
    return envelope(req, new_id("resp"), created, status, items, convert_usage(chat.get("usage")), incomplete)
