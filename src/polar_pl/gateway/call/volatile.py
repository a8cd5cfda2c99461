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
    """Remove volatile lines from system/developer messages; returns notes.

    Changed messages are replaced by new dicts (the adapter may share objects with the raw
    request, which must stay exactly as the harness sent it).
    """
    notes: list[str] = []
    messages = chat.get("messages")
    if not messages:
        return notes
    copied = False
    for i, msg in enumerate(messages):
        if msg.get("role") not in ("system", "developer"):
            continue
        content = msg.get("content")
        before = len(notes)
        if isinstance(content, str):
            new_content: Any = _strip_text(content, notes)
        elif isinstance(content, list):
            new_content = []
            for part in content:
                if isinstance(part, dict) and isinstance(part.get("text"), str):
                    text = _strip_text(part["text"], notes)
                    if not text and part["text"]:
                        continue  # the part was nothing but the volatile line
                    if text != part["text"]:
                        part = {**part, "text": text}
                new_content.append(part)
        else:
            continue
        if len(notes) > before:
            if not copied:
                messages = chat["messages"] = list(messages)
                copied = True
            messages[i] = {**msg, "content": new_content}
    return notes
