"""Removal of per-request volatile content from the normalized chat request.

Some harnesses put content into the prompt that changes on every request although the
conversation did not (Claude Code's `x-anthropic-billing-header: cc_version=...;` line carries a
per-request hash). Rendered as is, it would make each call's prompt diverge from the previous
call's tokens and break prefix chaining. The core applies this after every adapter, on system and
developer messages only, so no adapter has to know; each removal is noted in the trace record.
"""

from __future__ import annotations

import re
from typing import Any

# The whole line plus the line break(s) that separated it from the rest of the prompt.
# (name for the note, cheap substring test, pattern)
VOLATILE_LINES: tuple[tuple[str, str, re.Pattern[str]], ...] = (
    (
        "billing header",
        "x-anthropic-billing-header:",
        re.compile(r"^x-anthropic-billing-header:[^\n]*(?:\n+|$)", re.MULTILINE),
    ),
)


def _strip_text(text: str, notes: list[str]) -> str:
    for name, needle, pattern in VOLATILE_LINES:
        if needle in text:
            new, n = pattern.subn("", text)
            if n:
                notes.append(f"stripped {name} from system prompt ({n} line{'s' if n > 1 else ''})")
                text = new
    return text


def strip_volatile(chat: dict[str, Any]) -> list[str]:
    """Remove volatile lines from system/developer messages in place; returns notes."""
    notes: list[str] = []
    for msg in chat.get("messages") or ():
        if msg.get("role") not in ("system", "developer"):
            continue
        content = msg.get("content")
        if isinstance(content, str):
            msg["content"] = _strip_text(content, notes)
        elif isinstance(content, list):
            parts = []
            for part in content:
                if isinstance(part, dict) and isinstance(part.get("text"), str):
                    text = _strip_text(part["text"], notes)
                    if not text and part["text"]:
                        continue  # the part was nothing but the volatile line
                    part = {**part, "text": text}
                parts.append(part)
            msg["content"] = parts
    return notes
