"""Incremental token-faithful prompts: extend the session's chain, tokenize only what was appended.

The full path (prompt.py) renders and tokenizes the whole conversation on every call, so a long
session costs the gateway a time quadratic in its length. Most calls of a harness session extend
the previous one: the request is that call's messages, the assistant turn it sampled, and what the
harness appended (tool results, a user turn). Then the full path's answer is

    that call's prompt ids + its sampled ids + the ids the template writes after the turn

and only the last part is new. `extend` finds that call among the session's tips (the same search
the full path makes, restricted to the last assistant turn: the full path tries that turn first and
takes the same call), and gets the tail from a *reduced* render: the leading system messages, the
last user message before the turn, the turn as a marker, and the appended messages. Its cost is
that of the appended part, whatever the length of the session.

The reduced render gives the full render's tail when the template writes what follows a turn from
the messages after it (and the system prompt / tools header, the marker's neighbours): true of
ChatML / Qwen / hermes templates, false of templates that count turns or check role alternation
by index. `suffix_local` checks a template once on probe conversations; a template that fails it is
always rendered in full. Anything else the fast path does not handle (the last assistant turn is
not one this session sampled, an edited history, a side call) is answered by the full path, and
`extend` says why, with the merge's break kinds (store/chains.py).
"""

from __future__ import annotations

import weakref
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from polar_pl.chat.render import RenderError, conversation_for_template
from polar_pl.gateway.faithful.prompt import MARK_MESSAGE, FaithfulPrompt, Tip, same_turn, turn_tail
from polar_pl.gateway.store.chains import BreakKind, classify_messages, failure_kind, leading_system

TEMPLATE = "template"  # the template is not suffix-local, or the reduced render failed


def last_assistant(messages: list[Any]) -> int | None:
    """Index of the echoed turn the full path tries first (the last message never is one)."""
    for k in range(len(messages) - 2, -1, -1):
        msg = messages[k]
        if isinstance(msg, dict) and msg.get("role") == "assistant":
            return k
    return None


def extend(
    tokenizer: Any, chat: dict[str, Any], tips_by_len: Mapping[int, Sequence[Tip]]
) -> FaithfulPrompt | str:
    """The prompt for `chat` built from the tip that sampled its last assistant turn, or why not
    (a `BreakKind` value or TEMPLATE): then the caller renders it in full.
    tips_by_len: the session's tips by the number of request messages."""
    messages, tools, kwargs = chat.get("messages"), chat.get("tools"), chat.get("chat_template_kwargs")
    if not isinstance(messages, list):
        return BreakKind.COMPACTION.value
    k = last_assistant(messages)
    candidates = tips_by_len.get(k, ()) if k is not None else ()
    prefix = messages[:k] if k is not None else []
    matched = False
    for tip in sorted(candidates, key=lambda t: -t.call_index):
        if tip.tools != tools or tip.kwargs != kwargs or not same_messages(tip.messages, prefix):
            continue
        matched = True
        assert k is not None  # candidates is empty otherwise
        if not same_turn(tokenizer, tip, messages[k]):
            continue
        if not suffix_local(tokenizer):
            return TEMPLATE
        try:
            tail = turn_tail(tokenizer, reduced(messages, k), tools, kwargs, tip.response)
        except RenderError:
            return TEMPLATE
        if tail is None:
            return TEMPLATE
        prompt = np.concatenate([tip.prompt, tip.response, tail])
        return FaithfulPrompt(prompt, None, tip.call_index, incremental=True)
    # the history up to the turn is the tip's, the turn is not what it sampled: a re-render drifts
    return BreakKind.DRIFT.value if matched else BreakKind.COMPACTION.value


def reduced(messages: list[Any], k: int) -> list[Any]:
    """The conversation whose render has the full render's tail after turn k (see the module
    docstring): leading system messages, the last user message before the turn, the turn as the
    marker, the messages after it."""
    lead = leading_system(messages[:k])
    user = next((i for i in range(k - 1, lead - 1, -1) if _role(messages[i]) == "user"), None)
    return [
        *messages[:lead],
        *([messages[user]] if user is not None else []),
        MARK_MESSAGE,
        *messages[k + 1 :],
    ]


def same_messages(a: list[Any], b: list[Any]) -> bool:
    """Equal as the template sees them (the full path's test), compared as sent first: a harness
    echoes its history unchanged, and then this costs one C-level comparison."""
    if len(a) != len(b):
        return False
    if a == b:
        return True
    return all(x == y or _for_template(x) == _for_template(y) for x, y in zip(a, b, strict=True))


def _for_template(msg: Any) -> dict[str, Any] | None:
    try:
        return conversation_for_template([msg])[0]
    except ValueError:
        return None


def _role(msg: Any) -> Any:
    return msg.get("role") if isinstance(msg, dict) else None


def classify_fallback(chat: dict[str, Any], nearest: Tip | None, failures: str | None) -> str:
    """Why a call extends none of the session's tips, in the merge's terms, against its most
    recent main tip: failures, the error texts of calls that failed since that tip."""
    if nearest is None:
        return BreakKind.NEW_CONVERSATION.value
    if failures:
        return failure_kind(failures).value
    messages = chat["messages"] if isinstance(chat.get("messages"), list) else []
    kind = classify_messages(
        nearest.messages, nearest.tools, messages, chat.get("tools"), cut=nearest.finish_reason == "length"
    )
    return kind.value


# ---- is a template suffix-local? -----------------------------------------------------------
_LOCAL: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_PROBE_TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "probe",
            "description": "a probe tool",
            "parameters": {"type": "object", "properties": {"x": {"type": "integer"}}},
        },
    }
]


def _probe_conversations() -> list[list[dict[str, Any]]]:
    system = {"role": "system", "content": "You are a probe."}
    ask, again = {"role": "user", "content": "first question"}, {"role": "user", "content": "second"}
    wrapped = {"role": "user", "content": "<tool_response>\nx\n</tool_response>"}

    def call(i: int) -> dict[str, Any]:
        fn = {"name": "probe", "arguments": f'{{"x": {i}}}'}
        return {
            "role": "assistant",
            "content": f"step {i}",
            "tool_calls": [{"id": f"p{i}", "type": "function", "function": fn}],
        }

    def result(i: int) -> dict[str, Any]:
        return {"role": "tool", "tool_call_id": f"p{i}", "content": f"result {i}"}

    think = {"role": "assistant", "content": "ok", "reasoning": "thinking it over"}
    return [
        [system, ask, call(1), result(1)],
        [system, ask, call(1), result(1), result(2)],
        [system, ask, think, again],
        [system, ask, call(1), result(1), call(2), result(2)],
        [ask, call(1), result(1)],
        [system, ask, think, again, call(2), result(2)],
        [system, wrapped, call(1), result(1)],
        [system, ask, call(1), result(1), again],
        [system, ask, think, again, think, again, call(3), result(3), result(4)],
    ]


def suffix_local(tokenizer: Any) -> bool:
    """Does the reduced render give the full render's tail on the probe conversations (with and
    without tools, thinking on and off)? Checked once per tokenizer."""
    try:
        return _LOCAL[tokenizer]
    except (KeyError, TypeError):
        pass
    ok = all(
        _probe_agrees(tokenizer, conv, tools, kwargs)
        for conv in _probe_conversations()
        for tools in (_PROBE_TOOLS, None)
        for kwargs in (None, {"enable_thinking": False})
    )
    try:
        _LOCAL[tokenizer] = ok
    except TypeError:
        pass
    return ok


def _probe_agrees(tokenizer: Any, conv: list[Any], tools: Any, kwargs: Any) -> bool:
    k = last_assistant(conv)
    assert k is not None  # every probe conversation has an assistant turn
    response = np.zeros(0, dtype=np.int32)
    try:
        full = turn_tail(tokenizer, [*conv[:k], MARK_MESSAGE, *conv[k + 1 :]], tools, kwargs, response)
    except RenderError:
        return True  # the template does not take this conversation at all: nothing to compare
    try:
        part = turn_tail(tokenizer, reduced(conv, k), tools, kwargs, response)
    except RenderError:
        return False
    return full is not None and part is not None and np.array_equal(full, part)
