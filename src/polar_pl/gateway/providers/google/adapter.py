"""The ProviderAdapter for Google generateContent (`/v1beta/models/{model}:generateContent`,
`:streamGenerateContent`, `:countTokens`; Gemini CLI and pi): requests are converted in request.py,
answers in response.py, streams in stream.py (which also holds the error shape). The model name
comes from the path."""

from __future__ import annotations

from typing import Any

from polar_pl.gateway.providers.base import NormalizedRequest, RequestError
from polar_pl.gateway.providers.google.request import parse_path, request_to_chat
from polar_pl.gateway.providers.google.response import models_list, response_from_chat
from polar_pl.gateway.providers.google.stream import GoogleStream, error_payload


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

    def retryable_status(self, status: int) -> int:
        return status

    def models_body(self, name: str) -> dict[str, Any]:
        return models_list(name)

    def count_tokens_body(self, body: dict[str, Any]) -> dict[str, Any]:
        inner = body.get("generateContentRequest")  # countTokens may wrap the whole request
        return inner if isinstance(inner, dict) else body

    def count_tokens_answer(self, n: int) -> dict[str, Any]:
        return {"totalTokens": n}
