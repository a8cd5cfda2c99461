"""Token-faithful prompts: the engine sees the tokens the policy sampled, not a re-render of them.

A harness echoes the model's earlier turns back as messages; rendering those messages with the
chat template can give other tokens than the ones sampled (a template that strips earlier
thinking, tool-call JSON re-serialized, text re-tokenized). Training on such a prompt trains on a
context the policy never produced, and it breaks prefix merging (a DRIFT break).

`faithful_prompt` renders the request the way the engine would (`polar_pl.chat.render`), then
looks in the session's earlier records for the call that produced the last echoed assistant turn:
a record whose request messages are exactly the messages before that turn, with the same tools,
and whose sampled output, parsed with the engine's own hermes parser
(`polar_pl.chat.toolparse`), is that turn. The prompt is then

    that call's prompt_ids + its sampled response_ids + the tokens the template puts after the turn

where "after the turn" is taken from a render in which the echoed turn is replaced by a marker
(so the tail is the template's, whatever it does to earlier turns). If the sampled response ends
with the token the template closes the turn with (`<|im_end|>`), that token is not repeated; a
response cut by length gets the template's `<|im_end|>` as glue. Because the anchor call's prompt
was built the same way, every earlier sampled turn is kept as sampled, and the next call's prompt
extends the chain by construction: zero drift. With no matching record the plain render is used.

`completion_body` turns the chat body into the engine's token-in `/v1/completions` request, and
`CompletionToChat` turns that endpoint's stream back into `chat.completion.chunk`s, parsing tool
calls with the engine's `HermesStreamParser`, so the rest of the gateway (capture, provider
adapters) cannot tell the two paths apart.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from polar_pl.chat.reasoning import ReasoningStream, check_reasoning_parser, thinking_enabled
from polar_pl.chat.render import conversation_for_template, render_chat
from polar_pl.chat.toolparse import HermesStreamParser, parse_tool_calls
from polar_pl.gateway.store.records import TraceRecord

_MARK = f"polarfaithful{uuid.uuid4().hex}"


@dataclass(frozen=True, slots=True)
class FaithfulPrompt:
    """prompt_ids: what the engine gets. rendered_ids: the plain render of the same messages.
    anchor: call_index of the record whose sampled tokens were spliced in (None: plain render)."""

    prompt_ids: list[int]
    rendered_ids: list[int]
    anchor: int | None = None

    @property
    def rendered_if_different(self) -> list[int] | None:
        """For `TraceRecord.rendered_prompt_ids`: kept only where splicing changed the prompt."""
        return None if self.rendered_ids == self.prompt_ids else self.rendered_ids


def faithful_prompt(
    tokenizer: Any,
    chat: dict[str, Any],
    history: Sequence[TraceRecord],
    *,
    chat_template_kwargs: dict[str, Any] | None = None,
) -> FaithfulPrompt:
    """Prompt ids for `chat` (a normalized Chat Completions body: messages, tools) in a session
    whose earlier records are `history` (any order; failed calls are ignored).

    Raises `polar_pl.chat.render.RenderError` (a ValueError, answered 400) on messages the
    template cannot render, exactly as the engine would.
    """
    messages, tools = chat.get("messages"), chat.get("tools")
    kwargs = chat_template_kwargs if chat_template_kwargs is not None else chat.get("chat_template_kwargs")
    _, rendered = render_chat(tokenizer, messages, tools, chat_template_kwargs=kwargs)
    found = _find_anchor(tokenizer, messages, tools, kwargs, history)
    if found is None:
        return FaithfulPrompt(rendered, rendered)
    k, rec = found
    marked = [*messages[:k], {"role": "assistant", "content": _MARK}, *messages[k + 1 :]]
    text, _ = render_chat(tokenizer, marked, tools, chat_template_kwargs=kwargs)
    if text.count(_MARK) != 1:
        return FaithfulPrompt(rendered, rendered)
    tail = tokenizer.encode(text[text.index(_MARK) + len(_MARK) :], add_special_tokens=False)
    response = list(rec.response_ids)
    if tail and response and response[-1] == tail[0] and tail[0] in set(tokenizer.all_special_ids):
        tail = tail[1:]  # the sampled end-of-turn token is the template's: keep the sampled one only
    return FaithfulPrompt(list(rec.prompt_ids) + response + tail, rendered, rec.call_index)


def _request(rec: TraceRecord) -> dict[str, Any]:
    req = rec.normalized_request or {}
    return req["chat"] if isinstance(req.get("chat"), dict) else req


def _find_anchor(
    tokenizer: Any,
    messages: list[Any],
    tools: Any,
    kwargs: Any,
    history: Sequence[TraceRecord],
) -> tuple[int, TraceRecord] | None:
    """(index of the echoed assistant turn, the record that sampled it), latest turn first."""
    by_len: dict[int, list[TraceRecord]] = {}
    for rec in sorted(history, key=lambda r: -r.call_index):
        req = _request(rec)
        msgs = req.get("messages")
        if rec.status != "ok" or not rec.response_ids or not isinstance(msgs, list):
            continue
        if req.get("tools") != tools or req.get("chat_template_kwargs") != kwargs:
            continue
        by_len.setdefault(len(msgs), []).append(rec)
    for k in range(len(messages) - 2, -1, -1):  # the last message is never the echoed turn
        msg = messages[k]
        if not (isinstance(msg, dict) and msg.get("role") == "assistant"):
            continue
        candidates = by_len.get(k, ())
        if not candidates:
            continue
        before = _for_template(messages[:k])
        for rec in candidates:
            if _for_template(_request(rec)["messages"]) == before and _same_turn(
                tokenizer, rec.response_ids, msg
            ):
                return k, rec
    return None


def _for_template(messages: list[Any]) -> list[dict[str, Any]] | None:
    """Messages as the template sees them (fields it ignores do not break a match)."""
    if not messages:
        return []
    try:
        return conversation_for_template(messages)
    except ValueError:
        return None


@dataclass(frozen=True, slots=True)
class _Turn:
    reasoning: str | None
    content: str
    calls: tuple[tuple[str, str], ...]  # (name, canonical JSON arguments)


def _split_think(content: str) -> tuple[str | None, str]:
    """Reasoning and content, split the way Qwen3-style templates split `<think>...</think>`."""
    if "</think>" not in content:
        return None, content
    reasoning = content.split("</think>")[0].rstrip("\n").split("<think>")[-1].lstrip("\n")
    return reasoning, content.split("</think>")[-1].lstrip("\n")


def _canon_args(args: Any) -> str:
    if isinstance(args, str):
        try:
            args = json.loads(args)
        except ValueError:
            return args
    return json.dumps(args, sort_keys=True, ensure_ascii=False)


def _sampled_turn(tokenizer: Any, response_ids: list[int]) -> _Turn:
    text = tokenizer.decode(response_ids, skip_special_tokens=True)
    parsed = parse_tool_calls(text)  # the engine's parser: a tool call here is one there
    reasoning, content = _split_think((parsed.content or "") if parsed.tools_called else text)
    calls = tuple((c["function"]["name"], _canon_args(c["function"]["arguments"])) for c in parsed.tool_calls)
    return _Turn(reasoning, content, calls)


def _echoed_turn(msg: dict[str, Any]) -> _Turn:
    conv = conversation_for_template([msg])[0]  # content parts joined, arguments parsed, as rendered
    reasoning, content = _split_think(conv.get("content") or "")
    reasoning = msg.get("reasoning_content") or conv.get("reasoning") or reasoning
    calls = tuple(
        (c["function"].get("name", ""), _canon_args(c["function"].get("arguments")))
        for c in conv.get("tool_calls", ())
    )
    return _Turn(reasoning, content, calls)


def _same_turn(tokenizer: Any, response_ids: list[int], msg: dict[str, Any]) -> bool:
    """Is the echoed message this sampled output? Harnesses may drop reasoning and trim whitespace."""
    s, e = _sampled_turn(tokenizer, response_ids), _echoed_turn(msg)
    if e.calls != s.calls or e.content.strip() != s.content.strip():
        return False
    return not e.reasoning or (s.reasoning or "").strip() == e.reasoning.strip()


# ---- the token-in engine call --------------------------------------------------------------

_SAMPLING_KEYS = ("temperature", "top_p", "top_k", "min_p", "seed", "stop", "stop_token_ids", "n",
                  "presence_penalty", "frequency_penalty", "repetition_penalty", "ignore_eos")  # fmt: skip


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
            first = base | {"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""},
                                         "logprobs": None, "finish_reason": None}]}  # fmt: skip
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
        choice: dict[str, Any] = {"index": 0, "delta": delta, "logprobs": _chat_logprobs(ch.get("logprobs")),
                                  "finish_reason": None, "token_ids": ch.get("token_ids")}  # fmt: skip
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
