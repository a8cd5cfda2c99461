"""Which provider API a request speaks, and which session token it carries.

Provider: the path decides first (`/v1/messages`, `/chat/completions`, `/responses`,
`:generateContent`), then provider-specific headers, then the body's shape. Paths are matched on
their ending, so `/v1/...`, `/...` and `/s/<token>/v1/...` all work; CLIs differ in whether the
base URL they are given already ends in `/v1`.

Token: `/s/<token>/` in the path wins; otherwise the API key the harness sends (`x-api-key`,
`Authorization: Bearer`, `x-goog-api-key`, or Google's `?key=`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

SESSION_PREFIX = "/s/"


def split_session_path(path: str) -> tuple[str | None, str]:
    """`/s/<token>/v1/messages` -> (token, "/v1/messages"); other paths -> (None, path)."""
    if not path.startswith(SESSION_PREFIX):
        return None, path
    rest = path[len(SESSION_PREFIX) :]
    token, sep, tail = rest.partition("/")
    return (token or None), "/" + tail if sep else "/"


def find_token(path_token: str | None, headers: Mapping[str, str], query: Mapping[str, str]) -> str | None:
    if path_token:
        return path_token
    key = headers.get("x-api-key")
    if key:
        return key
    auth = headers.get("authorization", "")
    if auth[:7].lower() == "bearer ":
        return auth[7:].strip() or None
    return headers.get("x-goog-api-key") or query.get("key") or None


def provider_from_path(path: str) -> str | None:
    p = path.rstrip("/")
    if p.endswith(("/messages", "/messages/count_tokens")):
        return "anthropic"
    if p.endswith("/chat/completions"):
        return "openai_chat"
    if p.endswith("/responses"):
        return "openai_responses"
    if ":generateContent" in p or ":streamGenerateContent" in p or ":countTokens" in p:
        return "google"
    return None


def provider_from_headers(headers: Mapping[str, str]) -> str | None:
    if "anthropic-version" in headers or "x-api-key" in headers:
        return "anthropic"
    if "x-goog-api-key" in headers or "x-goog-api-client" in headers:
        return "google"
    return None


def provider_from_body(body: Any) -> str | None:
    if not isinstance(body, dict):
        return None
    if "contents" in body:
        return "google"
    if "input" in body or "instructions" in body:
        return "openai_responses"
    if "messages" in body:
        # Anthropic puts the system prompt at the top level and always names max_tokens.
        if "system" in body or "stop_sequences" in body:
            return "anthropic"
        return "openai_chat"
    return None


def detect_provider(path: str, headers: Mapping[str, str], body: Any = None) -> str | None:
    return provider_from_path(path) or provider_from_headers(headers) or provider_from_body(body)


def provider_for_models(path: str, headers: Mapping[str, str]) -> str | None:
    """`GET .../models` carries no body: Google's under /v1beta/, else the headers (None: OpenAI)."""
    return "google" if "/v1beta/" in path else provider_from_headers(headers)


def is_count_tokens(path: str) -> bool:
    return path.rstrip("/").endswith("/messages/count_tokens") or ":countTokens" in path


def route_name(method: str, path: str) -> str:
    """A harness route's name for metrics: a fixed set, never the path (it holds model names)."""
    p = path.rstrip("/")
    if method == "HEAD":
        return "probe"
    if p.endswith("/models"):
        return "models"
    if is_count_tokens(p):
        return "count_tokens"
    for end, name in (
        ("/messages", "messages"),
        ("/chat/completions", "chat_completions"),
        ("/responses", "responses"),
    ):
        if p.endswith(end):
            return name
    if ":streamGenerateContent" in p:
        return "stream_generate_content"
    return "generate_content" if ":generateContent" in p else "other"
