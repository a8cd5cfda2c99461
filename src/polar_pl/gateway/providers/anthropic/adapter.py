"""The ProviderAdapter for Anthropic Messages (`POST /v1/messages`, `?beta=true`; Claude Code, pi,
Qwen Code): requests are converted in request.py, answers in response.py, streams in stream.py
(which also holds the error shape)."""

from __future__ import annotations

from typing import Any

from polar_pl.gateway.providers.anthropic.request import request_to_chat
from polar_pl.gateway.providers.anthropic.response import models_list, response_from_chat
from polar_pl.gateway.providers.anthropic.stream import AnthropicStream, error_payload
from polar_pl.gateway.providers.base import NormalizedRequest, RequestError


class AnthropicAdapter:
    """The Anthropic Messages API, translated to and from the engine's chat completions."""

    name = "anthropic"

    def to_chat(self, body: dict[str, Any], *, path: str, query: dict[str, str]) -> NormalizedRequest:
        chat, notes = request_to_chat(body)
        model = body.get("model")
        if model is not None and not isinstance(model, str):
            raise RequestError("model: must be a string")
        stream = body.get("stream", False)
        if not isinstance(stream, bool):
            raise RequestError("stream: must be a boolean")
        thinking = body.get("thinking")
        show = not (isinstance(thinking, dict) and thinking.get("display") == "omitted")
        return NormalizedRequest(
            chat=chat, stream=stream, model=model or "", notes=tuple(notes), extra={"show_thinking": show}
        )

    def from_chat(self, response: dict[str, Any], req: NormalizedRequest) -> dict[str, Any]:
        stops = list(req.chat.get("stop", []))
        return response_from_chat(response, req.model, stops, req.extra.get("show_thinking", True))

    def stream(self, req: NormalizedRequest) -> AnthropicStream:
        stops = list(req.chat.get("stop", []))
        return AnthropicStream(req.model, stops, show_thinking=req.extra.get("show_thinking", True))

    def error_body(self, status: int, message: str) -> dict[str, Any]:
        return error_payload(status, message)

    def retryable_status(self, status: int) -> int:
        return 529  # overloaded_error: what Claude Code retries with backoff

    def models_body(self, name: str) -> dict[str, Any]:
        return models_list(name)

    def count_tokens_body(self, body: dict[str, Any]) -> dict[str, Any]:
        return {"max_tokens": 1, **body}  # count_tokens takes a Messages request without max_tokens

    def count_tokens_answer(self, n: int) -> dict[str, Any]:
        return {"input_tokens": n}
