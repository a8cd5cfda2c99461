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
The engine then gets the prompt through its token-in route (completion.py).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from polar_pl.chat.render import conversation_for_template, render_chat, render_marked
from polar_pl.chat.toolparse import parse_tool_calls
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
    text, shield = render_marked(tokenizer, marked, tools, chat_template_kwargs=kwargs)
    if text.count(_MARK) != 1:
        return FaithfulPrompt(rendered, rendered)
    tail = shield.encode(text[text.index(_MARK) + len(_MARK) :])
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
