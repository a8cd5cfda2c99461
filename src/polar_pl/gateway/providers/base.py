"""The provider adapter contract.

Every provider API (Anthropic Messages, OpenAI Chat, OpenAI Responses, Google generateContent) is
one adapter: it turns the harness's request into an OpenAI Chat Completions request for the engine,
and turns the engine's answer (a full chat completion, or a stream of chat completion chunks) back
into the provider's own response or event grammar. Everything that differs between APIs (error
shapes and statuses, model lists, count-tokens bodies) is a method here, so the gateway core never
branches on a provider name. The core owns everything else: auth, sessions, calling the engine
(always streaming, with logprobs and token ids), capture.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol


class RequestError(ValueError):
    """A malformed or unsupported request: the core answers 400 in the provider's error shape."""


@dataclass(frozen=True, slots=True)
class NormalizedRequest:
    """A provider request normalized to OpenAI Chat Completions.

    chat: the body sent to the engine: `messages`, optional `tools`, `tool_choice`, `max_tokens`,
        `temperature`, `top_p`, `stop`, `seed`. Assistant turns may carry `reasoning_content`.
        The core adds `model`, `stream`, `logprobs`, `top_logprobs`, `return_token_ids`.
    stream: whether the harness asked for a stream.
    model: the model name the harness asked for (echoed back in responses).
    notes: what normalization dropped or changed, recorded in the trace.
    """

    chat: dict[str, Any]
    stream: bool
    model: str
    notes: tuple[str, ...] = ()
    extra: dict[str, Any] = field(default_factory=dict)


class StreamTranslator(Protocol):
    """Per-stream state turning engine chat chunks into provider SSE bytes (one per stream)."""

    def start(self) -> bytes:
        """Called once before the first chunk: opening events (may be empty)."""

    def feed(self, chunk: dict[str, Any]) -> bytes:
        """Called for each engine `chat.completion.chunk`; returns the events to send now."""

    def finish(self, finish_reason: str | None, usage: dict[str, Any]) -> bytes:
        """Called once after the last chunk: closing events. usage has prompt/completion tokens."""

    def error(self, status: int, message: str) -> bytes:
        """Called if the engine fails mid-stream, or after `finish` when its bytes cannot be sent
        (the call could not be recorded): an error event in the provider's grammar that ends the
        stream in their place."""


class ProviderAdapter(Protocol):
    """One provider API."""

    name: str

    def to_chat(self, body: dict[str, Any], *, path: str, query: dict[str, str]) -> NormalizedRequest:
        """Called per request after auth. Raises RequestError on malformed input."""

    def from_chat(self, response: dict[str, Any], req: NormalizedRequest) -> dict[str, Any]:
        """Called for a non-streaming request with the engine's full chat completion."""

    def stream(self, req: NormalizedRequest) -> StreamTranslator:
        """Called for a streaming request; returns fresh per-stream state."""

    def error_body(self, status: int, message: str) -> dict[str, Any]:
        """Called for any error: the provider's error JSON for this HTTP status."""

    def retryable_status(self, status: int) -> int:
        """Called when the engine is down (502) or paused for a weight update (503): the status
        this API's clients retry with backoff (Anthropic: 529 `overloaded_error`)."""

    def models_body(self, name: str) -> dict[str, Any]:
        """Called for `GET .../models`: the served model, listed in this API's shape."""

    def count_tokens_body(self, body: dict[str, Any]) -> dict[str, Any]:
        """Called for a count-tokens request: the request `to_chat` takes from its body."""

    def count_tokens_answer(self, n: int) -> dict[str, Any]:
        """Called with the prompt's token count: this API's count-tokens answer."""
