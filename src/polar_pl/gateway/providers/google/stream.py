"""Engine chat-completion chunks -> Gemini `streamGenerateContent?alt=sse` events, one object per stream.

Each event is `data: <GenerateContentResponse>` holding one partial candidate; text and thought
parts are forwarded as the engine produces them. Gemini sends a function call whole (name and
complete args), so tool-call pieces are collected and a call is sent once the next one starts or
the stream ends. The last event carries finishReason and usageMetadata.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

import orjson

from polar_pl.gateway.providers.thinking_signature import encode_signature

FINISH_REASONS = {
    "stop": "STOP",
    "length": "MAX_TOKENS",
    "tool_calls": "STOP",
    "function_call": "STOP",
    "content_filter": "SAFETY",
}

ERROR_STATUSES = {
    400: "INVALID_ARGUMENT",
    401: "UNAUTHENTICATED",
    403: "PERMISSION_DENIED",
    404: "NOT_FOUND",
    409: "ABORTED",
    429: "RESOURCE_EXHAUSTED",
    499: "CANCELLED",
    500: "INTERNAL",
    501: "UNIMPLEMENTED",
    502: "UNAVAILABLE",
    503: "UNAVAILABLE",
    504: "DEADLINE_EXCEEDED",
}


def error_payload(status: int, message: str) -> dict[str, Any]:
    """Google's error shape: {"error": {"code", "message", "status"}}."""
    name = ERROR_STATUSES.get(status) or ("INVALID_ARGUMENT" if 400 <= status < 500 else "INTERNAL")
    return {"error": {"code": status, "message": message, "status": name}}


def finish_reason_for(finish_reason: str | None) -> str:
    return FINISH_REASONS.get(finish_reason or "stop", "OTHER")


def usage_metadata(prompt_tokens: int | None, completion_tokens: int | None) -> dict[str, int]:
    prompt, completion = prompt_tokens or 0, completion_tokens or 0
    return {
        "promptTokenCount": prompt,
        "candidatesTokenCount": completion,
        "totalTokenCount": prompt + completion,
    }


def function_call_part(call_id: str | None, name: str, arguments: Any) -> dict[str, Any]:
    """An engine tool call -> a functionCall part; args {} if the model's JSON is not an object."""
    if isinstance(arguments, dict):
        args = arguments
    else:
        try:
            args = json.loads(arguments or "{}")
        except (TypeError, ValueError):
            args = {}
    call: dict[str, Any] = {"name": name, "args": args if isinstance(args, dict) else {}}
    if call_id:
        # Gemini CLI echoes the id in its functionResponse, which keeps call matching exact.
        call["id"] = call_id
    return {"functionCall": call}


def sign_parts(parts: list[dict[str, Any]], reasoning: list[str], signed: set[str]) -> None:
    """Gemini's placement: the first part after the thoughts and the first functionCall carry the
    thoughtSignature (Gemini CLI keeps function-call parts in its history for sure). Reasoning
    always precedes the answer, so it is complete by the time these parts go out."""
    signature = None
    for part in parts:
        if part.get("thought"):
            continue
        is_call = "functionCall" in part
        if "answer" in signed and not (is_call and "call" not in signed):
            continue
        if reasoning:
            signature = signature or encode_signature("".join(reasoning))
            part["thoughtSignature"] = signature
        signed.add("answer")
        if is_call:
            signed.add("call")


def new_response_id() -> str:
    return uuid.uuid4().hex[:16]


class GoogleStream:
    """Per-stream state: tool calls being assembled, finish and usage seen so far.

    array=True is the stream without `alt=sse`: one JSON array, each element sent as it is made.
    """

    def __init__(self, model: str, include_thoughts: bool, *, array: bool = False) -> None:
        self.model = model
        self.array = array
        self.items = 0
        self._items_before_finish: int | None = None
        self.include_thoughts = include_thoughts
        self.response_id = new_response_id()
        self.calls: dict[int, dict[str, Any]] = {}  # engine index -> {"id", "name", "arguments": [...]}
        self.reasoning: list[str] = []
        self.signed: set[str] = set()  # which signature carriers went out (see sign_parts)
        self.finish_reason: str | None = None
        self.prompt_tokens: int | None = None
        self.completion_tokens: int | None = None

    def start(self) -> bytes:
        return b"[" if self.array else b""

    def feed(self, chunk: dict[str, Any]) -> bytes:
        self._note_usage(chunk)
        parts: list[dict[str, Any]] = []
        for choice in chunk.get("choices") or ():
            if choice.get("index", 0) != 0:
                continue
            delta = choice.get("delta") or {}
            reasoning = delta.get("reasoning_content") or delta.get("reasoning")
            if reasoning:
                self.reasoning.append(reasoning)
                if self.include_thoughts:
                    parts.append({"text": reasoning, "thought": True})
            if delta.get("content"):
                parts.append({"text": delta["content"]})
            for call in delta.get("tool_calls") or ():
                parts.extend(self._collect_call(call))
            if choice.get("finish_reason"):
                self.finish_reason = choice["finish_reason"]
        return self._event(parts) if parts else b""

    def finish(self, finish_reason: str | None, usage: dict[str, Any]) -> bytes:
        self._note_usage({"usage": usage})
        self._items_before_finish = self.items
        parts = [self._call_part(index) for index in sorted(self.calls)]
        self.calls.clear()
        last = self._event(parts, finish_reason_for(finish_reason or self.finish_reason))
        return last + b"\n]" if self.array else last

    def error(self, status: int, message: str) -> bytes:
        if self._items_before_finish is not None:  # it replaces a finish that was not sent
            self.items = self._items_before_finish
        out = self._frame(error_payload(status, message))
        return out + b"\n]" if self.array else out

    def _frame(self, payload: dict[str, Any]) -> bytes:
        if not self.array:
            return b"data: " + orjson.dumps(payload) + b"\n\n"
        self.items += 1
        return (b",\r\n" if self.items > 1 else b"") + orjson.dumps(payload)

    def _collect_call(self, call: dict[str, Any]) -> list[dict[str, Any]]:
        """Add one tool-call piece; a new call index means the earlier calls are complete."""
        index = call.get("index", 0)
        function = call.get("function") or {}
        done: list[dict[str, Any]] = []
        if index not in self.calls:
            done = [self._call_part(i) for i in sorted(self.calls)]
            self.calls = {}
            self.calls[index] = {"id": call.get("id"), "name": function.get("name") or "", "arguments": []}
        entry = self.calls[index]
        if function.get("name") and not entry["name"]:
            entry["name"] = function["name"]
        if function.get("arguments"):
            entry["arguments"].append(function["arguments"])
        return done

    def _call_part(self, index: int) -> dict[str, Any]:
        entry = self.calls[index]
        return function_call_part(entry["id"], entry["name"], "".join(entry["arguments"]))

    def _event(self, parts: list[dict[str, Any]], finish: str | None = None) -> bytes:
        sign_parts(parts, self.reasoning, self.signed)
        candidate: dict[str, Any] = {"index": 0}
        if parts:
            candidate["content"] = {"role": "model", "parts": parts}
        response: dict[str, Any] = {"candidates": [candidate]}
        if finish is not None:
            candidate["finishReason"] = finish
            response["usageMetadata"] = usage_metadata(self.prompt_tokens, self.completion_tokens)
        response["modelVersion"] = self.model
        response["responseId"] = self.response_id
        return self._frame(response)

    def _note_usage(self, chunk: dict[str, Any]) -> None:
        if self.prompt_tokens is None and isinstance(chunk.get("prompt_token_ids"), list):
            self.prompt_tokens = len(chunk["prompt_token_ids"])
        usage = chunk.get("usage")
        if isinstance(usage, dict):
            if isinstance(usage.get("prompt_tokens"), int):
                self.prompt_tokens = usage["prompt_tokens"]
            if isinstance(usage.get("completion_tokens"), int):
                self.completion_tokens = usage["completion_tokens"]
