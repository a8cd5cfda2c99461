"""Backend deltas -> OpenAI JSON: chat completions (full and streamed) and token-in completions.

Shapes follow vLLM's OpenAI server (`vllm/entrypoints/openai/*/serving.py`): `token_ids` per
choice, top-level `prompt_token_ids` (first chunk when streaming), logprobs content entries
{token, logprob, bytes, top_logprobs}, finish_reason "tool_calls" when hermes tool calls were
parsed, `stop_reason`, usage (final chunk with stream_options.include_usage). Each response also
carries `policy_version`: the oldest weights version that sampled any of its tokens.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from polar_pl.chat.reasoning import ReasoningStream, split_reasoning, thinking_enabled
from polar_pl.chat.toolparse import HermesStreamParser, parse_tool_calls
from polar_pl.engine.backend import SeqDelta, TokenLogprob
from polar_pl.engine.openai_protocol import ChatCompletionRequest, CompletionRequest


@dataclass(slots=True)
class ResponseContext:
    request_id: str
    model: str
    tokenizer: Any
    prompt_ids: list[int]
    policy_version: int
    reasoning_parser: str | None = None  # "qwen3" splits <think>...</think> into `reasoning`
    created: int = field(default_factory=lambda: int(time.time()))
    _token_cache: dict[int, str] = field(default_factory=dict)

    def token_text(self, token_id: int) -> str:
        text = self._token_cache.get(token_id)
        if text is None:
            text = self._token_cache[token_id] = self.tokenizer.decode([token_id])
        return text


def _bytes(text: str) -> list[int]:
    return list(text.encode("utf-8", errors="replace"))


SYSTEM_FINGERPRINT = "polar-pl-embedded"


def _ranked(lp: TokenLogprob, limit: int) -> list[tuple[int, float]]:
    """vLLM's order: the sampled token first, then the best alternatives, without duplicates."""
    out = [(lp.token_id, lp.logprob)]
    out += [(tid, v) for tid, v in lp.top if tid != lp.token_id]
    return out[:limit]


def chat_logprobs(ctx: ResponseContext, lps: tuple[TokenLogprob, ...] | list[TokenLogprob], k: int) -> dict:
    content = []
    for lp in lps:
        token = ctx.token_text(lp.token_id)
        top = [
            {"token": (t := ctx.token_text(tid)), "logprob": max(v, -9999.0), "bytes": _bytes(t)}
            for tid, v in _ranked(lp, k)
        ]
        content.append(
            {"token": token, "logprob": max(lp.logprob, -9999.0), "bytes": _bytes(token), "top_logprobs": top}
        )
    return {"content": content}


def completion_logprobs(
    ctx: ResponseContext, lps: list[TokenLogprob] | tuple[TokenLogprob, ...], k: int, offset: int
) -> dict:
    out: dict[str, list] = {"text_offset": [], "token_logprobs": [], "tokens": [], "top_logprobs": []}
    for lp in lps:
        token = ctx.token_text(lp.token_id)
        out["text_offset"].append(offset)
        offset += len(token)
        out["tokens"].append(token)
        out["token_logprobs"].append(max(lp.logprob, -9999.0))
        # k+1 entries, sampled first, as the OpenAI completions API defines (and vLLM does)
        top: dict[str, float] = {}
        for tid, v in _ranked(lp, k + 1):
            top.setdefault(ctx.token_text(tid), max(v, -9999.0))
        out["top_logprobs"].append(top)
    return out


def usage(prompt_tokens: int, completion_tokens: int) -> dict:
    return {
        "prompt_tokens": prompt_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "completion_tokens": completion_tokens,
        "prompt_tokens_details": None,
        "completion_tokens_details": None,
    }


def stream_usage(prompt_tokens: int, completion_tokens: int) -> dict:
    """The final stream chunk's usage: vLLM drops the None details there."""
    full = usage(prompt_tokens, completion_tokens)
    return {k: v for k, v in full.items() if v is not None}


@dataclass(slots=True)
class ChoiceAccumulator:
    """Everything one choice produced, for non-streaming responses."""

    index: int
    token_ids: list[int] = field(default_factory=list)
    text: str = ""
    logprobs: list[TokenLogprob] = field(default_factory=list)
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    versions: set[int] = field(default_factory=set)

    def add(self, d: SeqDelta) -> None:
        self.token_ids.extend(d.token_ids)
        self.text += d.text
        if d.logprobs:
            self.logprobs.extend(d.logprobs)
        if d.token_ids:
            self.versions.add(d.policy_version)
        if d.finish_reason is not None:
            self.finish_reason, self.stop_reason = d.finish_reason, d.stop_reason


async def collect(deltas: AsyncIterator[list[SeqDelta]], n: int) -> list[ChoiceAccumulator]:
    choices = [ChoiceAccumulator(i) for i in range(n)]
    async for batch in deltas:
        for d in batch:
            choices[d.index].add(d)
    return choices


def _oldest_version(choices: list[ChoiceAccumulator], default: int) -> int:
    versions = set().union(*(c.versions for c in choices))
    return min(versions) if versions else default


def parses_reasoning(req: ChatCompletionRequest, ctx: ResponseContext) -> bool:
    return ctx.reasoning_parser is not None and thinking_enabled(req.chat_template_kwargs)


def chat_message(req: ChatCompletionRequest, ctx: ResponseContext, text: str) -> tuple[dict, bool]:
    """The assistant message for a finished choice, and whether tool calls were parsed."""
    reasoning, content = split_reasoning(text) if parses_reasoning(req, ctx) else (None, text)
    message: dict[str, Any] = {
        "role": "assistant",
        "content": content,
        "refusal": None,
        "annotations": None,
        "audio": None,
        "function_call": None,
        "tool_calls": [],
        "reasoning": reasoning,
    }
    if not req.uses_tool_parser():
        return message, False
    parsed = parse_tool_calls(content or "")
    if parsed.tools_called:
        content = parsed.content
        message["content"] = None if content is not None and not content.strip() else content
        message["tool_calls"] = list(parsed.tool_calls)
    if req.forced_tool_names() is not None:
        # vLLM builds forced-call messages (required / named) with `content or ""`
        message["content"] = message["content"] or ""
    return message, parsed.tools_called


def finish_reason(req: ChatCompletionRequest, finish: str | None, called: bool) -> str:
    """vLLM's rule: "tool_calls" for auto calls and for "required" (even when nothing parsed),
    never for a named tool_choice."""
    finish = finish or "stop"
    if finish != "stop" or req.named_tool() is not None:
        return finish
    return "tool_calls" if called or req.effective_tool_choice() == "required" else "stop"


def chat_response(req: ChatCompletionRequest, ctx: ResponseContext, choices: list[ChoiceAccumulator]) -> dict:
    k = req.top_logprobs or 0
    out_choices = []
    for c in choices:
        message, called = chat_message(req, ctx, c.text)
        finish = finish_reason(req, c.finish_reason, called)
        out_choices.append(
            {
                "index": c.index,
                "message": message,
                "logprobs": chat_logprobs(ctx, c.logprobs, k) if req.logprobs else None,
                "finish_reason": finish,
                "stop_reason": c.stop_reason,
                "token_ids": c.token_ids if req.return_token_ids else None,
                "routed_experts": None,
            }
        )
    completion_tokens = sum(len(c.token_ids) for c in choices)
    return {
        "id": ctx.request_id,
        "object": "chat.completion",
        "created": ctx.created,
        "model": ctx.model,
        "choices": out_choices,
        "service_tier": None,
        "system_fingerprint": SYSTEM_FINGERPRINT,
        "usage": usage(len(ctx.prompt_ids), completion_tokens),
        "prompt_logprobs": None,
        "prompt_token_ids": ctx.prompt_ids if req.return_token_ids else None,
        "prompt_text": None,
        "kv_transfer_params": None,
        "ec_transfer_params": None,
        "metrics": None,
        "policy_version": _oldest_version(choices, ctx.policy_version),
    }


def sse(obj: dict) -> str:
    return f"data: {json.dumps(obj, ensure_ascii=False, separators=(',', ':'))}\n\n"


async def chat_stream(
    req: ChatCompletionRequest, ctx: ResponseContext, deltas: AsyncIterator[list[SeqDelta]]
) -> AsyncIterator[str]:
    """SSE lines for a streamed chat completion, ending with `data: [DONE]`."""
    n = req.n
    include_usage = bool(req.stream_options and req.stream_options.include_usage)
    parsers = [HermesStreamParser() for _ in range(n)] if req.uses_tool_parser() else None
    reasoners = [ReasoningStream() for _ in range(n)] if parses_reasoning(req, ctx) else None
    texts = [""] * n
    content_sent = [0] * n
    counts = [0] * n
    k = req.top_logprobs or 0

    def chunk(choice: dict, **extra) -> dict:
        return {
            "id": ctx.request_id,
            "object": "chat.completion.chunk",
            "created": ctx.created,
            "model": ctx.model,
            "choices": [choice],
            **extra,
        }

    for i in range(n):
        first = chunk(
            {
                "index": i,
                "delta": {"role": "assistant", "content": ""},
                "logprobs": None,
                "finish_reason": None,
            },
            policy_version=ctx.policy_version,
        )
        if req.return_token_ids:
            first["prompt_token_ids"] = ctx.prompt_ids
        first["prompt_text"] = None
        yield sse(first)

    async for batch in deltas:
        for d in batch:
            i = d.index
            counts[i] += len(d.token_ids)
            texts[i] += d.text
            reasoning, content = reasoners[i].feed(texts[i]) if reasoners is not None else (None, texts[i])
            delta = None
            if content is not None and d.text:
                if parsers is not None:
                    delta = parsers[i].feed(content)
                elif len(content) > content_sent[i]:
                    delta = {"content": content[content_sent[i] :]}
                    content_sent[i] = len(content)
            if reasoning:
                delta = {"reasoning": reasoning, **(delta or {})}
            if d.finish_reason is not None and parsers is not None:
                parsers[i].finish(delta)
            logprobs = chat_logprobs(ctx, d.logprobs, k) if req.logprobs and d.logprobs is not None else None
            if delta is None:
                if d.finish_reason is None and logprobs is None and not req.return_token_ids:
                    continue
                delta = {}
            choice: dict[str, Any] = {"index": i, "delta": delta, "logprobs": logprobs, "finish_reason": None}
            if d.finish_reason is not None:
                finish = d.finish_reason
                named = req.named_tool() is not None
                if parsers is not None and parsers[i].tools_streamed and finish == "stop" and not named:
                    finish = "tool_calls"
                choice["finish_reason"] = finish
                choice["stop_reason"] = d.stop_reason
            if req.return_token_ids:
                choice["token_ids"] = list(d.token_ids)
            yield sse(chunk(choice, policy_version=d.policy_version))

    if include_usage:
        yield sse(
            {
                "id": ctx.request_id,
                "object": "chat.completion.chunk",
                "created": ctx.created,
                "model": ctx.model,
                "choices": [],
                "usage": stream_usage(len(ctx.prompt_ids), sum(counts)),
                "system_fingerprint": SYSTEM_FINGERPRINT,
            }
        )
    yield "data: [DONE]\n\n"


def completion_response(
    req: CompletionRequest, ctx: ResponseContext, choices: list[ChoiceAccumulator]
) -> dict:
    out_choices = []
    for c in choices:
        out_choices.append(
            {
                "index": c.index,
                "text": c.text,
                "logprobs": completion_logprobs(ctx, c.logprobs, req.logprobs, 0)
                if req.logprobs is not None
                else None,
                "finish_reason": c.finish_reason or "stop",
                "stop_reason": c.stop_reason,
                "token_ids": c.token_ids if req.return_token_ids else None,
                "prompt_logprobs": None,
                "prompt_token_ids": ctx.prompt_ids if req.return_token_ids else None,
                "routed_experts": None,
            }
        )
    completion_tokens = sum(len(c.token_ids) for c in choices)
    return {
        "id": ctx.request_id,
        "object": "text_completion",
        "created": ctx.created,
        "model": ctx.model,
        "choices": out_choices,
        "service_tier": None,
        "system_fingerprint": SYSTEM_FINGERPRINT,
        "usage": usage(len(ctx.prompt_ids), completion_tokens),
        "kv_transfer_params": None,
        "ec_transfer_params": None,
        "metrics": None,
        "policy_version": _oldest_version(choices, ctx.policy_version),
    }


async def completion_stream(
    req: CompletionRequest, ctx: ResponseContext, deltas: AsyncIterator[list[SeqDelta]]
) -> AsyncIterator[str]:
    include_usage = bool(req.stream_options and req.stream_options.include_usage)
    counts = [0] * req.n
    offsets = [0] * req.n
    first = [True] * req.n
    async for batch in deltas:
        for d in batch:
            i = d.index
            counts[i] += len(d.token_ids)
            choice: dict[str, Any] = {
                "index": i,
                "text": d.text,
                "logprobs": None,
                "finish_reason": d.finish_reason,
                "stop_reason": d.stop_reason,
            }
            if req.logprobs is not None and d.logprobs is not None:
                choice["logprobs"] = completion_logprobs(ctx, d.logprobs, req.logprobs, offsets[i])
                offsets[i] += sum(len(ctx.token_text(lp.token_id)) for lp in d.logprobs)
            if req.return_token_ids:
                choice["prompt_token_ids"] = ctx.prompt_ids if first[i] else None
                choice["token_ids"] = list(d.token_ids)
            first[i] = False
            yield sse(
                {
                    "id": ctx.request_id,
                    "object": "text_completion",
                    "created": ctx.created,
                    "model": ctx.model,
                    "choices": [choice],
                    "policy_version": d.policy_version,
                }
            )
    if include_usage:
        yield sse(
            {
                "id": ctx.request_id,
                "object": "text_completion",
                "created": ctx.created,
                "model": ctx.model,
                "choices": [],
                "usage": stream_usage(len(ctx.prompt_ids), sum(counts)),
                "system_fingerprint": SYSTEM_FINGERPRINT,
            }
        )
    yield "data: [DONE]\n\n"
