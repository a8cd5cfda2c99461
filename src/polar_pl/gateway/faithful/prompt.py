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

This is the full path: it renders and tokenizes the whole conversation (twice) on every call, so
its cost grows with the session. The gateway builds most prompts incrementally instead
(incremental.py), falling back to this one; both give the same ids.
"""

from __future__ import annotations

import json
import uuid
import weakref
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from polar_pl.chat.render import conversation_for_template, render_chat, render_marked
from polar_pl.chat.toolparse import parse_tool_calls
from polar_pl.gateway.store.packed import I32, as_i32
from polar_pl.gateway.store.records import TraceRecord

_SPECIAL: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_MARK = f"polarfaithful{uuid.uuid4().hex}"
MARK_MESSAGE = {"role": "assistant", "content": _MARK}


@dataclass(frozen=True, slots=True)
class FaithfulPrompt:
    """prompt_ids: what the engine gets (int32). rendered_ids: the plain render of the same
    messages, None where it was not made (the incremental path does not render the history).
    anchor: call_index of the record whose sampled tokens were spliced in (None: plain render).
    incremental: built from the session's chain (incremental.py) rather than a full render.
    fallback: why a session with a chain needed the full render (a `BreakKind` value, "first",
    "template" or "mismatch"); None when incremental, or for a session's first call."""

    prompt_ids: np.ndarray
    rendered_ids: np.ndarray | None
    anchor: int | None = None
    incremental: bool = False
    fallback: str | None = None

    @property
    def rendered_if_different(self) -> list[int] | None:
        """For `TraceRecord.rendered_prompt_ids`: kept only where splicing changed the prompt."""
        r = self.rendered_ids
        if r is None or np.array_equal(r, self.prompt_ids):
            return None
        return r.tolist()


@dataclass(slots=True)
class Tip:
    """One successful call as later prompts need it: its request (messages, tools, template
    kwargs) and the ids of its prompt and sampled response, packed (4 bytes a token)."""

    call_index: int
    messages: list[Any]
    tools: Any
    kwargs: Any
    prompt: np.ndarray
    response: np.ndarray
    finish_reason: str | None = None
    turn: _Turn | None = field(default=None, repr=False)  # the sampled turn, parsed on first use

    @classmethod
    def of(cls, rec: TraceRecord | Tip, prompt: np.ndarray | None = None) -> Tip | None:
        """The tip of a record; None for a record no prompt can extend (failed, nothing sampled).
        prompt: the record's prompt ids as an array already (the gateway built them)."""
        if isinstance(rec, Tip):
            return rec
        req = _request(rec)
        msgs = req.get("messages")
        if rec.status != "ok" or not len(rec.response_ids) or not isinstance(msgs, list):
            return None
        return cls(
            rec.call_index,
            msgs,
            req.get("tools"),
            req.get("chat_template_kwargs"),
            as_i32(rec.prompt_ids) if prompt is None else prompt,
            as_i32(rec.response_ids),
            rec.finish_reason,
        )

    def sampled_turn(self, tokenizer: Any) -> _Turn:
        if self.turn is None:
            self.turn = _sampled_turn(tokenizer, self.response)
        return self.turn


def faithful_prompt(
    tokenizer: Any,
    chat: dict[str, Any],
    history: Sequence[TraceRecord | Tip],
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
    rendered = np.asarray(render_chat(tokenizer, messages, tools, chat_template_kwargs=kwargs)[1], dtype=I32)
    assert messages is not None  # render_chat raised RenderError otherwise
    tips = [t for t in map(Tip.of, history) if t is not None]
    found = _find_anchor(tokenizer, messages, tools, kwargs, tips)
    if found is None:
        return FaithfulPrompt(rendered, rendered)
    k, tip = found
    tail = turn_tail(
        tokenizer, [*messages[:k], MARK_MESSAGE, *messages[k + 1 :]], tools, kwargs, tip.response
    )
    if tail is None:
        return FaithfulPrompt(rendered, rendered)
    return FaithfulPrompt(np.concatenate([tip.prompt, tip.response, tail]), rendered, tip.call_index)


def turn_tail(
    tokenizer: Any, marked: list[Any], tools: Any, kwargs: Any, response: np.ndarray
) -> np.ndarray | None:
    """The ids the template writes after the echoed turn, replaced in `marked` by MARK_MESSAGE
    (None if the marker does not come out exactly once). If the sampled response ends with the
    token the template closes the turn with, that token is not repeated."""
    text, shield = render_marked(tokenizer, marked, tools, chat_template_kwargs=kwargs)
    if text.count(_MARK) != 1:
        return None
    tail = shield.encode(text[text.index(_MARK) + len(_MARK) :])
    if tail and len(response) and int(response[-1]) == tail[0] and tail[0] in _special_ids(tokenizer):
        tail = tail[1:]  # the sampled end-of-turn token is the template's: keep the sampled one only
    return np.asarray(tail, dtype=I32)


def _special_ids(tokenizer: Any) -> frozenset[int]:
    try:
        return _SPECIAL[tokenizer]
    except (KeyError, TypeError):
        ids = frozenset(tokenizer.all_special_ids)
        try:
            _SPECIAL[tokenizer] = ids
        except TypeError:
            pass
        return ids


def _request(rec: TraceRecord) -> dict[str, Any]:
    req = rec.normalized_request or {}
    return req["chat"] if isinstance(req.get("chat"), dict) else req


def _find_anchor(
    tokenizer: Any,
    messages: list[Any],
    tools: Any,
    kwargs: Any,
    tips: Sequence[Tip],
) -> tuple[int, Tip] | None:
    """(index of the echoed assistant turn, the call that sampled it), latest turn first."""
    by_len: dict[int, list[Tip]] = {}
    for tip in sorted(tips, key=lambda t: -t.call_index):
        if tip.tools != tools or tip.kwargs != kwargs:
            continue
        by_len.setdefault(len(tip.messages), []).append(tip)
    for k in range(len(messages) - 2, -1, -1):  # the last message is never the echoed turn
        msg = messages[k]
        if not (isinstance(msg, dict) and msg.get("role") == "assistant"):
            continue
        candidates = by_len.get(k, ())
        if not candidates:
            continue
        before = _for_template(messages[:k])
        for tip in candidates:
            if _for_template(tip.messages) == before and same_turn(tokenizer, tip, msg):
                return k, tip
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


def _sampled_turn(tokenizer: Any, response_ids: np.ndarray) -> _Turn:
    text = tokenizer.decode(response_ids.tolist(), skip_special_tokens=True)
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


def _seen(text: str | None) -> str:
    """Text as the harness could see it: bytes that are no whole UTF-8 character (a lone byte token,
    a turn cut inside a character) decode to U+FFFD here, while the engine's text shows them as
    U+FFFD, as fewer of them, or holds them back; harnesses also trim whitespace."""
    return (text or "").replace("\ufffd", "").strip()


def same_turn(tokenizer: Any, tip: Tip, msg: dict[str, Any]) -> bool:
    """Is the echoed message the tip's sampled output? Harnesses may drop reasoning and trim
    whitespace."""
    s, e = tip.sampled_turn(tokenizer), _echoed_turn(msg)
    if e.calls != s.calls or _seen(e.content) != _seen(s.content):
        return False
    return not e.reasoning or _seen(s.reasoning) == _seen(e.reasoning)
