"""Side-call tagging: calls a harness makes that are not the task's main line.

Titles, memory extraction and routing classifiers are real model calls (they are recorded), but
they are not steps of the agent's trajectory; trajectory builders keep them out of the main chain.
A rule matches on request features only: the provider API, whether tools are offered, the model
name, and a fingerprint of the system prompt. Rules are data (`SideCallRule`), so a config can
add or replace them; the defaults were derived from the requests each CLI sent (docs/harnesses.md; recorded captures
are replayed in the tests) and OpenCode's published title prompt.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class SideCallRule:
    """All given conditions must hold. system_contains: any one substring suffices."""

    name: str
    system_contains: tuple[str, ...] = ()
    tools: str | None = None  # "none", "any" or None (either)
    model_regex: str | None = None
    provider: str | None = None

    def __post_init__(self):
        if self.tools not in (None, "none", "any"):
            raise ValueError(f"side rule {self.name}: tools={self.tools!r}, allowed 'none', 'any' or null")

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> SideCallRule:
        d = dict(d)
        sc = d.get("system_contains") or ()
        d["system_contains"] = (sc,) if isinstance(sc, str) else tuple(sc)
        return cls(**d)

    def matches(self, provider: str, model: str, has_tools: bool, system: str) -> bool:
        if self.provider is not None and self.provider != provider:
            return False
        if self.tools == "none" and has_tools or self.tools == "any" and not has_tools:
            return False
        if self.model_regex is not None and not re.search(self.model_regex, model or ""):
            return False
        return not self.system_contains or any(s in system for s in self.system_contains)


DEFAULT_SIDE_RULES: tuple[SideCallRule, ...] = (
    # Claude Code names the session: no tools, JSON {"title"} output, a naming system prompt.
    SideCallRule(
        name="claude_code_title",
        provider="anthropic",
        tools="none",
        system_contains=(
            "You are naming a coding session",
            'Return JSON with a single "title" field',
            "extract a 2-3 word title",
            "Generate a concise, sentence-case title",
        ),
    ),
    # Qwen Code's managed-memory subagent runs after the task with its own small tool set.
    SideCallRule(
        name="qwen_code_memory_extraction",
        system_contains=("managed memory extraction subagent",),
    ),
    # Gemini CLI's model router: a complexity classifier answered in JSON, no tools.
    SideCallRule(
        name="gemini_cli_router",
        tools="none",
        system_contains=("You are a specialized Task Routing AI", "Complexity Score"),
    ),
    # OpenCode's title agent (its title.txt prompt), no tools.
    SideCallRule(
        name="opencode_title",
        tools="none",
        system_contains=("You are a title generator. You output ONLY",),
    ),
)


def system_text(chat: dict[str, Any]) -> str:
    """The text of every system/developer message, joined (the fingerprint rules look at)."""
    out = []
    for msg in chat.get("messages") or ():
        if msg.get("role") not in ("system", "developer"):
            continue
        content = msg.get("content")
        if isinstance(content, str):
            out.append(content)
        elif isinstance(content, list):
            out.extend(p["text"] for p in content if isinstance(p, dict) and isinstance(p.get("text"), str))
    return "\n".join(out)


def classify(rules: Iterable[SideCallRule], *, provider: str, model: str, chat: dict[str, Any]) -> str | None:
    """Name of the first matching rule, or None for a main-line call."""
    system = system_text(chat)
    has_tools = bool(chat.get("tools"))
    for rule in rules:
        if rule.matches(provider, model, has_tools, system):
            return rule.name
    return None
