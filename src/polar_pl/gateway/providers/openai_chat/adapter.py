"""The ProviderAdapter for OpenAI Chat Completions (`POST /v1/chat/completions`): request.py
normalizes the request, response.py and stream.py strip the engine-only fields on the way back."""

from __future__ import annotations

from typing import Any

from polar_pl.gateway.providers.base import NormalizedRequest
from polar_pl.gateway.providers.openai_chat.request import to_chat
from polar_pl.gateway.providers.openai_chat.response import error_body, from_chat, models_list
from polar_pl.gateway.providers.openai_chat.stream import ChatStreamTranslator


class OpenAIChatAdapter:
    """The ProviderAdapter for `POST /v1/chat/completions`."""

    name = "openai_chat"

    def to_chat(
        self, body: dict[str, Any], *, path: str = "", query: dict[str, str] | None = None
    ) -> NormalizedRequest:
        return to_chat(body)

    def from_chat(self, response: dict[str, Any], req: NormalizedRequest) -> dict[str, Any]:
        return from_chat(response, req)

    def stream(self, req: NormalizedRequest) -> ChatStreamTranslator:
        return ChatStreamTranslator(req)

    def error_body(self, status: int, message: str) -> dict[str, Any]:
        return error_body(status, message)

    def retryable_status(self, status: int) -> int:
        return status

    def models_body(self, name: str) -> dict[str, Any]:
        return models_list(name)

    def count_tokens_body(self, body: dict[str, Any]) -> dict[str, Any]:
        return body

    def count_tokens_answer(self, n: int) -> dict[str, Any]:
        return {"input_tokens": n}
