"""The ProviderAdapter for OpenAI Responses (`POST /v1/responses`; Codex, Pi, OpenCode): requests
are converted in request.py (input items in input.py), answers in response.py, streams in
stream.py."""

from __future__ import annotations

from typing import Any

from polar_pl.gateway.providers.base import NormalizedRequest
from polar_pl.gateway.providers.openai_chat.response import models_list
from polar_pl.gateway.providers.openai_responses.request import to_chat
from polar_pl.gateway.providers.openai_responses.response import build_response, error_body
from polar_pl.gateway.providers.openai_responses.stream import ResponsesStreamTranslator


class OpenAIResponsesAdapter:
    """The ProviderAdapter for `POST /v1/responses`."""

    name = "openai_responses"

    def to_chat(
        self, body: dict[str, Any], *, path: str = "", query: dict[str, str] | None = None
    ) -> NormalizedRequest:
        return to_chat(body)

    def from_chat(self, response: dict[str, Any], req: NormalizedRequest) -> dict[str, Any]:
        return build_response(response, req)

    def stream(self, req: NormalizedRequest) -> ResponsesStreamTranslator:
        return ResponsesStreamTranslator(req)

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
