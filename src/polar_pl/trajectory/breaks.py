"""Classifying a chain break: why a call did not extend the chain closest to it.

Called only when a main call extends no chain and the session already has one. The rules, in order:

1. ERROR / TRUNCATION by failure: the nearest chain's last call failed or was aborted, or a call
   that failed with nothing sampled came in between. A context-length message makes it TRUNCATION
   (context overflow), anything else ERROR.
2. With normalized messages on both calls (`normalized_request["messages"]`, or `["chat"]["messages"]`):
   - DRIFT: same tools, the chain's last request messages are a strict prefix of this call's
     messages, yet the tokens differ (the same conversation re-rendered to other tokens) — also
     after a response cut by length, as long as the cut turn was kept (the next message is the
     assistant's): drift comes first, or it hides behind every length stop;
   - TRUNCATION: the chain's last response was cut by length (finish_reason "length") and the
     harness did not keep it as it was;
   - NEW_CONVERSATION: nothing beyond the leading system/developer messages is shared.
   - COMPACTION: otherwise (earlier content rewritten or dropped, tools changed, a request re-asked
     with its answer discarded).
3. Tokens only: divergence inside the last response is DRIFT; after a length-cut response,
   divergence at or before its first token is TRUNCATION; before the end of the chain's first
   prompt NEW_CONVERSATION, anywhere else COMPACTION.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from polar_pl.gateway.store.chains import classify_messages, failure_kind
from polar_pl.trajectory.base import BreakKind, Call


def lcp(a: np.ndarray, b: np.ndarray) -> int:
    """Length of the common prefix of two int arrays."""
    n = min(len(a), len(b))
    diff = np.flatnonzero(a[:n] != b[:n])
    return int(diff[0]) if len(diff) else n


def chain_lcp(call: Call, last: Call) -> int:
    """Common prefix of `call`'s prompt with the chain tokens ending in `last` (prompt + response)."""
    prompt, (last_prompt, last_response) = call.arrays[0], last.arrays
    n = lcp(prompt, last_prompt)
    if n < len(last_prompt):
        return n
    return n + lcp(prompt[n:], last_response)


def _chat(rec_request: dict[str, Any]) -> dict[str, Any]:
    chat = rec_request.get("chat")
    return chat if isinstance(chat, dict) else rec_request


def _messages(call: Call) -> list[Any] | None:
    msgs = _chat(call.rec.normalized_request or {}).get("messages")
    return msgs if isinstance(msgs, list) else None


def classify_break(call: Call, chain: Sequence[Call], failed_between: Sequence[Call]) -> BreakKind:
    """Kind of break between `call` and its nearest chain (`chain`, in call order)."""
    last = chain[-1]
    failures = [*failed_between, *([] if last.ok else [last])]
    if failures:
        return failure_kind(" ".join(f"{f.rec.error or ''} {f.rec.status}" for f in failures))
    cut = last.rec.finish_reason == "length"
    prev, cur = _messages(last), _messages(call)
    if prev is not None and cur is not None:
        prev_tools = _chat(last.rec.normalized_request).get("tools")
        cur_tools = _chat(call.rec.normalized_request).get("tools")
        return classify_messages(prev, prev_tools, cur, cur_tools, cut=cut)
    n = chain_lcp(call, last)
    if cut and n <= len(last.prompt):
        return BreakKind.TRUNCATION
    if n >= len(last.prompt):
        return BreakKind.DRIFT
    if n < len(chain[0].prompt):
        return BreakKind.NEW_CONVERSATION
    return BreakKind.COMPACTION
