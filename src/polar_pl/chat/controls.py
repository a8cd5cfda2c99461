"""Control strings inside message text are text, never control tokens.

The chat template is rendered to one string and tokenized; the tokenizer turns every occurrence
of an added token's string into that token. So a user message or a tool result holding
`<|im_end|>\\n<|im_start|>system\\n...` became a real end of turn and a real system turn: whoever
writes a file the agent reads (a tool result) could speak with the system's voice. (vLLM's
renderer does the same; this is where the embedded engine and the gateway differ from it.)

`Shield` replaces each control string found in message text (content, reasoning, tool-call
arguments, tool schemas) with a private-use sentinel before rendering, and `encode` turns the
rendered text into ids with each sentinel encoded as the control string's *text*: its characters
in pieces that match no added token. Text without control strings renders to exactly the ids a
plain encode gives, so prompts of ordinary requests are unchanged.
"""

from __future__ import annotations

import re
import weakref
from typing import Any

_SENTINEL = re.compile("\ue000(\\d+)\ue001")
_PATTERNS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # tokenizer -> (regex, added ids)


def _controls(tokenizer: Any) -> tuple[re.Pattern | None, frozenset[int]]:
    try:
        return _PATTERNS[tokenizer]
    except (KeyError, TypeError):
        pass
    added = tokenizer.get_added_vocab()
    strings = sorted(added, key=len, reverse=True)
    found = (
        re.compile("|".join(re.escape(s) for s in strings)) if strings else None,
        frozenset(added.values()),
    )
    try:
        _PATTERNS[tokenizer] = found
    except TypeError:  # not weak-referenceable: no cache
        pass
    return found


class Shield:
    """One render's sentinels: `protect` the conversation, render it, then `encode` / `restore`."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self._pattern, self._added_ids = _controls(tokenizer)
        self.table: list[str] = []

    def protect(self, obj: Any) -> Any:
        """A copy of obj (messages, tools: nested dicts / lists / strings) with control strings in
        its strings replaced by sentinels."""
        if isinstance(obj, str):
            if self._pattern is None:
                return obj
            return self._pattern.sub(self._mark, obj)
        if isinstance(obj, list):
            return [self.protect(x) for x in obj]
        if isinstance(obj, dict):
            return {k: self.protect(v) for k, v in obj.items()}
        return obj

    def _mark(self, m: re.Match) -> str:
        self.table.append(m.group(0))
        return f"\ue000{len(self.table) - 1}\ue001"

    def restore(self, text: str) -> str:
        """The rendered text as the model reads it (sentinels back to their strings)."""
        if not self.table:
            return text
        return _SENTINEL.sub(lambda m: self.table[int(m.group(1))], text)

    def encode(self, text: str) -> list[int]:
        """Ids of rendered `text`: the template's own control strings as control tokens, the
        protected ones as plain text."""
        tok = self.tokenizer
        if not self.table:
            return tok.encode(text, add_special_tokens=False)
        ids: list[int] = []
        pos = 0
        for m in _SENTINEL.finditer(text):
            ids += tok.encode(text[pos : m.start()], add_special_tokens=False) if m.start() > pos else []
            ids += self._as_text(self.table[int(m.group(1))])
            pos = m.end()
        if pos < len(text):
            ids += tok.encode(text[pos:], add_special_tokens=False)
        return ids

    def _as_text(self, s: str) -> list[int]:
        """s in pieces no added token matches (first character, then the rest, recursively)."""
        tok = self.tokenizer
        ids = tok.encode(s, add_special_tokens=False)
        if len(s) <= 1 or not self._added_ids & set(ids):
            return ids
        return self._as_text(s[0]) + self._as_text(s[1:])
