"""Engine chat-completion chunks -> Anthropic Messages SSE events, one object per stream.

Grammar (what the SDKs and Claude Code parse): `message_start`, then for each content block
`content_block_start` / `content_block_delta`* / `content_block_stop` with increasing indices,
then `message_delta` (stop_reason, usage) and `message_stop`. A failure mid-stream is an
`event: error`. Deltas are forwarded as the engine produces them; only a thinking block's
signature waits for the block to end (it is computed over the whole thinking text).
"""

from __future__ import annotations

import uuid
from typing import Any

import orjson

from polar_pl.gateway.providers.thinking_signature import encode_signature

STOP_REASONS = {
    "stop": "end_turn",
    "length": "max_tokens",
    "tool_calls": "tool_use",
    "function_call": "tool_use",
    "content_filter": "refusal",
}


def stop_reason_for(
    finish_reason: str | None, engine_stop: Any, stops: list[str], had_tool_calls: bool
) -> tuple[str, str | None]:
    """Map the engine's finish (and vLLM's matched stop string) to (stop_reason, stop_sequence)."""
    if finish_reason == "stop" and isinstance(engine_stop, str) and engine_stop in stops:
        return "stop_sequence", engine_stop
    if had_tool_calls and finish_reason in (None, "stop", "tool_calls"):
        return "tool_use", None
    return STOP_REASONS.get(finish_reason or "stop", "end_turn"), None


ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    503: "overloaded_error",
    529: "overloaded_error",
}


def error_payload(status: int, message: str) -> dict[str, Any]:
    """Anthropic's error shape; any other 4xx is a request error, any other 5xx an api_error."""
    kind = ERROR_TYPES.get(status) or ("invalid_request_error" if 400 <= status < 500 else "api_error")
    return {"type": "error", "error": {"type": kind, "message": message}}


def sse(event: str, data: dict[str, Any]) -> bytes:
    return b"event: " + event.encode() + b"\ndata: " + orjson.dumps(data) + b"\n\n"


def new_message_id() -> str:
    return "msg_" + uuid.uuid4().hex[:24]


class AnthropicStream:
    """Per-stream state: the open block, its index, tool-call bookkeeping, usage seen so far."""

    def __init__(self, model: str, stops: list[str] | None = None, *, show_thinking: bool = True) -> None:
        self.model = model
        self.stops = stops or []
        self.show_thinking = show_thinking  # False for `thinking.display: "omitted"`: signature only
        self.message_id = new_message_id()
        self.started = False
        self.index = -1  # index of the current (last opened) block
        self.open_kind: str | None = None  # "text" | "thinking" | "tool_use" while a block is open
        self.thinking: list[str] = []
        self.tool_blocks: dict[int, int] = {}  # engine tool-call index -> block index
        self.had_tool_calls = False
        self.engine_stop: Any = None
        self.finish_reason: str | None = None
        self.prompt_tokens: int | None = None
        self.completion_tokens: int | None = None

    def start(self) -> bytes:
        # message_start waits for the first chunk, which carries the real prompt length.
        return b""

    def feed(self, chunk: dict[str, Any]) -> bytes:
        self._note_usage(chunk)
        out = bytearray(self._message_start())
        for choice in chunk.get("choices") or ():
            if choice.get("index", 0) != 0:
                continue
            delta = choice.get("delta") or {}
            reasoning = delta.get("reasoning_content") or delta.get("reasoning")
            if reasoning:
                out += self._thinking_delta(reasoning)
            if delta.get("content"):
                out += self._text_delta(delta["content"])
            for call in delta.get("tool_calls") or ():
                out += self._tool_delta(call)
            if choice.get("finish_reason"):
                self.finish_reason = choice["finish_reason"]
                self.engine_stop = choice.get("stop_reason")
        return bytes(out)

    def finish(self, finish_reason: str | None, usage: dict[str, Any]) -> bytes:
        self._note_usage({"usage": usage})
        out = bytearray(self._message_start())
        out += self._close_block()
        reason, sequence = stop_reason_for(
            finish_reason or self.finish_reason, self.engine_stop, self.stops, self.had_tool_calls
        )
        usage_out: dict[str, Any] = {"output_tokens": self.completion_tokens or 0}
        if self.prompt_tokens is not None:
            usage_out["input_tokens"] = self.prompt_tokens
        out += sse(
            "message_delta",
            {
                "type": "message_delta",
                "delta": {"stop_reason": reason, "stop_sequence": sequence},
                "usage": usage_out,
            },
        )
        out += sse("message_stop", {"type": "message_stop"})
        return bytes(out)

    def error(self, status: int, message: str) -> bytes:
        return sse("error", error_payload(status, message))

    # -- events -----------------------------------------------------------------------------

    def _message_start(self) -> bytes:
        if self.started:
            return b""
        self.started = True
        message: dict[str, Any] = {
            "id": self.message_id,
            "type": "message",
            "role": "assistant",
            "model": self.model,
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": {
                "input_tokens": self.prompt_tokens or 0,
                "output_tokens": 0,
                "cache_creation_input_tokens": 0,
                "cache_read_input_tokens": 0,
            },
        }
        return sse("message_start", {"type": "message_start", "message": message})

    def _open_block(self, kind: str, block: dict[str, Any]) -> bytes:
        out = self._close_block()
        self.index += 1
        self.open_kind = kind
        return out + sse(
            "content_block_start",
            {"type": "content_block_start", "index": self.index, "content_block": block},
        )

    def _close_block(self) -> bytes:
        if self.open_kind is None:
            return b""
        out = b""
        if self.open_kind == "thinking":
            signature = encode_signature("".join(self.thinking))
            self.thinking = []
            out = self._delta({"type": "signature_delta", "signature": signature})
        self.open_kind = None
        return out + sse("content_block_stop", {"type": "content_block_stop", "index": self.index})

    def _delta(self, delta: dict[str, Any]) -> bytes:
        return sse(
            "content_block_delta", {"type": "content_block_delta", "index": self.index, "delta": delta}
        )

    def _thinking_delta(self, text: str) -> bytes:
        out = b""
        if self.open_kind != "thinking":
            out = self._open_block("thinking", {"type": "thinking", "thinking": "", "signature": ""})
        self.thinking.append(text)
        if not self.show_thinking:
            return out
        return out + self._delta({"type": "thinking_delta", "thinking": text})

    def _text_delta(self, text: str) -> bytes:
        out = b""
        if self.open_kind != "text":
            out = self._open_block("text", {"type": "text", "text": ""})
        return out + self._delta({"type": "text_delta", "text": text})

    def _tool_delta(self, call: dict[str, Any]) -> bytes:
        engine_index = call.get("index", 0)
        function = call.get("function") or {}
        out = b""
        if engine_index not in self.tool_blocks:
            block: dict[str, Any] = {
                "type": "tool_use",
                "id": call.get("id") or "toolu_" + uuid.uuid4().hex[:24],
                "name": function.get("name") or "",
                "input": {},
            }
            out = self._open_block("tool_use", block)
            self.tool_blocks[engine_index] = self.index
            self.had_tool_calls = True
        elif self.tool_blocks[engine_index] != self.index or self.open_kind != "tool_use":
            # vLLM streams tool calls one after another; a piece for a closed block has no
            # place in Anthropic's grammar, so it cannot be forwarded.
            return b""
        arguments = function.get("arguments")
        if arguments:
            out += self._delta({"type": "input_json_delta", "partial_json": arguments})
        return out

    def _note_usage(self, chunk: dict[str, Any]) -> None:
        if self.prompt_tokens is None and isinstance(chunk.get("prompt_token_ids"), list):
            self.prompt_tokens = len(chunk["prompt_token_ids"])
        usage = chunk.get("usage")
        if isinstance(usage, dict):
            if isinstance(usage.get("prompt_tokens"), int):
                self.prompt_tokens = usage["prompt_tokens"]
            if isinstance(usage.get("completion_tokens"), int):
                self.completion_tokens = usage["completion_tokens"]
