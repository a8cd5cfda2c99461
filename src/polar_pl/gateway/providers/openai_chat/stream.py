"""Engine chat chunks -> the same chunks for the harness, minus engine-only fields."""

from __future__ import annotations

import time
from typing import Any

import orjson

from polar_pl.gateway.providers.base import NormalizedRequest
from polar_pl.gateway.providers.openai_chat.response import error_body, public_choice


class ChatStreamTranslator:
    """Engine chunks -> the same chunks for the harness, minus engine-only fields."""

    __slots__ = ("created", "id", "include_usage", "keep_logprobs", "req", "sent_usage")

    def __init__(self, req: NormalizedRequest):
        self.req = req
        self.include_usage = req.extra.get("include_usage", False)
        self.keep_logprobs = req.extra.get("logprobs", False)
        self.sent_usage = False
        self.id = ""
        self.created = int(time.time())

    def start(self) -> bytes:
        return b""

    def feed(self, chunk: dict[str, Any]) -> bytes:
        choices = chunk.get("choices") or []
        if not self.id:
            self.id = chunk.get("id") or f"chatcmpl-{self.created}"
            self.created = chunk.get("created") or self.created
        if not choices:
            if chunk.get("usage") and self.include_usage and not self.sent_usage:
                self.sent_usage = True
                return self._event([], chunk["usage"])
            return b""
        return self._event(
            [public_choice(c, self.keep_logprobs) for c in choices],
            chunk.get("usage") if self.include_usage else None,
        )

    def _event(self, choices: list[dict[str, Any]], usage: dict[str, Any] | None) -> bytes:
        out: dict[str, Any] = {
            "id": self.id,
            "object": "chat.completion.chunk",
            "created": self.created,
            "model": self.req.model,
            "choices": choices,
        }
        if usage is not None:
            out["usage"] = usage
        return b"data: " + orjson.dumps(out) + b"\n\n"

    def finish(self, finish_reason: str | None, usage: dict[str, Any]) -> bytes:
        tail = b""
        if self.include_usage and not self.sent_usage:
            self.sent_usage = True
            tail = self._event([], usage)
        return tail + b"data: [DONE]\n\n"

    def error(self, status: int, message: str) -> bytes:
        return b"data: " + orjson.dumps(error_body(status, message)) + b"\n\n"
