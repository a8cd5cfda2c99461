"""Offline tokenizer training text: Python standard library sources plus rendered conversations.

The standard library is on every machine that runs Python, so no download is needed; files are
read in sorted order and the total is capped so that training takes seconds. The text depends on
the local Python version, so builds are deterministic per machine (same seed, same files), which
is what the tests and the cache need.
"""

from __future__ import annotations

import sysconfig
from pathlib import Path

from polar_pl.tinymodel.conversations import generate
from polar_pl.tinymodel.tokenizer import render_chat


def stdlib_texts(max_chars: int) -> list[str]:
    """Sources of the standard library (tests and site-packages excluded), up to `max_chars` in total."""
    root = Path(sysconfig.get_paths()["stdlib"])
    texts: list[str] = []
    total = 0
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root).parts
        if any(part in ("test", "tests", "site-packages", "idlelib") for part in rel):
            continue
        text = path.read_text(encoding="utf-8", errors="replace")
        texts.append(text)
        total += len(text)
        if total >= max_chars:
            break
    return texts


def chat_texts(seed: int, count: int) -> list[str]:
    """`count` generated conversations rendered through the chat template."""
    return [render_chat(c.messages, c.tools) for c in generate(seed, count)]


def training_corpus(seed: int, code_chars: int = 3_000_000, conversations: int = 800) -> list[str]:
    """The full tokenizer corpus: code first, then chat and tool-call text."""
    return stdlib_texts(code_chars) + chat_texts(seed, conversations)
