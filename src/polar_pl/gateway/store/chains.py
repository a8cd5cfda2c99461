"""Chain breaks: why a call does not extend the token chain of an earlier call of its session.

Two places ask that question and must answer it the same way: the trajectory builders, which
classify every break when they merge a session's records (trajectory/breaks.py), and
the gateway's incremental token-faithful prompts, which classify why a call had to be rendered in
full instead of extending its session's chain (faithful/incremental.py). Both name the causes
with `BreakKind` and share the message-level rule here.
"""

from __future__ import annotations

import re
from enum import StrEnum
from typing import Any


class BreakKind(StrEnum):
    """Why a call started a new row instead of extending an existing chain.

    COMPACTION: earlier content was rewritten or dropped (summaries, trimmed history, changed tools).
    NEW_CONVERSATION: nothing beyond the system prompt is shared (a subagent, a fresh conversation).
    SIDE_CALL: the gateway tagged the call "side" (titles, memory, routing); side calls never chain.
    DRIFT: the same message list re-rendered to different tokens (stripped thinking, re-serialized
        tool-call JSON, re-tokenized text).
    TRUNCATION: the chain's last response was cut by length, or the context overflowed.
    ERROR: the chain's last call, or a call since, failed or was aborted.
    """

    COMPACTION = "compaction"
    NEW_CONVERSATION = "new_conversation"
    SIDE_CALL = "side_call"
    DRIFT = "drift"
    TRUNCATION = "truncation"
    ERROR = "error"


#: The first chain of a session: a start, not a break.
FIRST = "first"

_OVERFLOW = re.compile(r"context|too long|maximum .*length|max_model_len|overflow", re.IGNORECASE)


def failure_kind(messages: str) -> BreakKind:
    """A break caused by failed calls (their error texts): context overflow is TRUNCATION."""
    return BreakKind.TRUNCATION if _OVERFLOW.search(messages) else BreakKind.ERROR


def classify_messages(
    prev: list[Any], prev_tools: Any, cur: list[Any], cur_tools: Any, *, cut: bool
) -> BreakKind:
    """The break between a chain whose last request held `prev` messages and a call holding
    `cur`, from the messages alone. cut: the chain's last response was cut by length.

    - DRIFT: same tools, `prev` is a strict prefix of `cur`, yet the tokens differ (the same
      conversation re-rendered to other tokens) — also after a length cut, as long as the cut turn
      was kept (the next message is the assistant's): drift comes first, or it hides behind every
      length stop;
    - TRUNCATION: the last response was cut by length and the harness did not keep it as it was;
    - NEW_CONVERSATION: nothing beyond the leading system/developer messages is shared;
    - COMPACTION: otherwise (earlier content rewritten or dropped, tools changed, a request
      re-asked with its answer discarded).
    """
    shared = _shared_messages(prev, cur)
    if prev_tools == cur_tools and shared == len(prev) < len(cur):
        kept = isinstance(cur[len(prev)], dict) and cur[len(prev)].get("role") == "assistant"
        return BreakKind.DRIFT if kept or not cut else BreakKind.TRUNCATION
    if cut:
        return BreakKind.TRUNCATION
    if shared <= leading_system(prev):
        return BreakKind.NEW_CONVERSATION
    return BreakKind.COMPACTION


def _shared_messages(a: list[Any], b: list[Any]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def leading_system(msgs: list[Any]) -> int:
    """How many system/developer messages open the conversation."""
    n = 0
    for m in msgs:
        if not (isinstance(m, dict) and m.get("role") in ("system", "developer")):
            break
        n += 1
    return n
