"""The token-in engine call: `completion_body` turns the chat body into the engine's token-in
`/v1/completions` request, and `CompletionToChat` turns that endpoint's stream back into
`chat.completion.chunk`s, parsing tool calls with the engine's `HermesStreamParser` (and the
`<think>` block with its reasoning parser); `CompletionStream` shows such a stream to the rest of
the proxy as a ChatStream, so capture and the provider adapters cannot tell the two paths apart.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import orjson

from polar_pl.chat.reasoning import ReasoningStream, check_reasoning_parser, thinking_enabled
from polar_pl.chat.toolparse import HermesStreamParser
from polar_pl.gateway.upstream.client import ChatStream

_SAMPLING_KEYS = (
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "seed",
    "stop",
    "stop_token_ids",
    "n",
    "presence_penalty",
    "frequency_penalty",
    "repetition_penalty",
    "ignore_eos",
)


def uses_tool_parser(chat: dict[str, Any]) -> bool:
    """The engine parses tool calls when tools are given and tool_choice is not "none"."""
    choice = chat.get("tool_choice")
    effective = choice if choice is not None else ("auto" if chat.get("tools") else "none")
    return bool(chat.get("tools")) and effective != "none"


def completion_body(
    chat: dict[str, Any], prompt_ids: list[int], *, model: str | None = None
) -> dict[str, Any]:
    """The `/v1/completions` request equivalent to the chat body, with a token-id prompt."""
    body: dict[str, Any] = {k: chat[k] for k in _SAMPLING_KEYS if chat.get(k) is not None}
    body.update(
        model=model or chat.get("model"),
        prompt=prompt_ids,
        max_tokens=chat.get("max_completion_tokens") or chat.get("max_tokens"),  # None: up to the context
        stream=True,
        stream_options={"include_usage": True},
        logprobs=0,
        return_token_ids=True,
        # as the engine's chat path: tool tags must survive detokenization when tools may be parsed
        skip_special_tokens=not uses_tool_parser(chat),
    )
    return body


def completion_bytes(chat: dict[str, Any], prompt_ids: np.ndarray) -> tuple[bytes, bytes]:
    """(the request body, the prompt's JSON inside it): the ids are serialized once, and the
    engine's echo of them can be recognized byte for byte (upstream/client.py SSEParser)."""
    ids = orjson.dumps(prompt_ids, option=orjson.OPT_SERIALIZE_NUMPY)
    body = completion_body(chat, [])
    del body["prompt"]
    rest = orjson.dumps({**body, "prompt": None})  # the prompt last: its ids go in as bytes
    return rest[: -len(b"null}")] + ids + b"}", ids


class CompletionToChat:
    """Per-stream state: `/v1/completions` chunks in, `chat.completion.chunk` dicts out (n=1).

    reasoning_parser: the engine's (vLLM `--reasoning-parser`, e.g. "qwen3"); with it the
    `<think>` block goes to `delta.reasoning` exactly as the engine's chat route would send it."""

    def __init__(self, chat: dict[str, Any], reasoning_parser: str | None = None) -> None:
        self.parser = HermesStreamParser() if uses_tool_parser(chat) else None
        thinking = check_reasoning_parser(reasoning_parser) and thinking_enabled(
            chat.get("chat_template_kwargs")
        )
        self.reasoner = ReasoningStream() if thinking else None
        self.text = ""
        self.content_sent = 0
        self.started = False

    def feed(self, chunk: dict[str, Any]) -> list[dict[str, Any]]:
        """Chat chunks for one completions chunk (the first one also opens the assistant turn)."""
        base = {k: chunk.get(k) for k in ("id", "created", "model")} | {"object": "chat.completion.chunk"}
        if "policy_version" in chunk:
            base["policy_version"] = chunk["policy_version"]
        out: list[dict[str, Any]] = []
        choices = chunk.get("choices") or []
        if not choices:  # the usage chunk
            return [{**chunk, "object": "chat.completion.chunk"}]
        ch = choices[0]
        if not self.started:
            self.started = True
            first = base | {
                "choices": [
                    {
                        "index": 0,
                        "delta": {"role": "assistant", "content": ""},
                        "logprobs": None,
                        "finish_reason": None,
                    }
                ]
            }
            first["prompt_token_ids"] = ch.get("prompt_token_ids")
            out.append(first)
        piece = ch.get("text") or ""
        self.text += piece
        # the engine's chat route, step for step: reasoning split first, then tools on the content
        reasoning, content = self.reasoner.feed(self.text) if self.reasoner else (None, self.text)
        delta = None
        if content is not None and piece:
            if self.parser is not None:
                delta = self.parser.feed(content)
            elif len(content) > self.content_sent:
                delta = {"content": content[self.content_sent :]}
                self.content_sent = len(content)
        if reasoning:
            delta = {"reasoning": reasoning, **(delta or {})}
        delta = delta or {}
        choice: dict[str, Any] = {
            "index": 0,
            "delta": delta,
            "logprobs": _chat_logprobs(ch.get("logprobs")),
            "finish_reason": None,
            "token_ids": ch.get("token_ids"),
        }
        finish = ch.get("finish_reason")
        if finish is not None:
            if self.parser is not None and self.parser.tools_streamed and finish == "stop":
                finish = "tool_calls"
            choice["finish_reason"] = finish
            choice["stop_reason"] = ch.get("stop_reason")
        out.append(base | {"choices": [choice]})
        return out


def _chat_logprobs(lp: dict[str, Any] | None) -> dict[str, Any] | None:
    if not lp:
        return None
    return {
        "content": [
            {"token": t, "logprob": v, "bytes": list(t.encode()), "top_logprobs": []}
            for t, v in zip(lp.get("tokens") or [], lp.get("token_logprobs") or [], strict=False)
        ]
    }


class CompletionStream:
    """A ChatStream over an engine `/v1/completions` stream (chunks translated on the way)."""

    def __init__(self, stream: ChatStream, chat: dict[str, Any], reasoning_parser: str | None = None) -> None:
        self._stream = stream
        self._translate = CompletionToChat(chat, reasoning_parser)
        self.policy_version = stream.policy_version

    @property
    def elided(self) -> bool:
        return self._stream.elided

    async def batches(self):
        async for batch in self._stream.batches():
            out = [c for chunk in batch for c in self._translate.feed(chunk)]
            if out:
                yield out

    async def __aiter__(self):
        async for batch in self.batches():
            for chunk in batch:
                yield chunk

    def close(self, abort: bool = False) -> None:
        self._stream.close(abort)
