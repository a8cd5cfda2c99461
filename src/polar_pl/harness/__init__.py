"""Harness specs: how each agent CLI is installed, configured for a gateway session and launched.

`HARNESSES` names every built-in harness; `build_harness(name)` gives one with its pinned version
and default provider. Hydra configs in conf/harness/ do the same through `_target_`.
"""

from __future__ import annotations

import importlib

HARNESSES: dict[str, str] = {
    "mini": "polar_pl.harness.mini:Mini",
    "claude_code": "polar_pl.harness.claude_code:ClaudeCode",
    "codex": "polar_pl.harness.codex:Codex",
    "qwen_code": "polar_pl.harness.qwen_code:QwenCode",
    "pi": "polar_pl.harness.pi:Pi",
    "gemini_cli": "polar_pl.harness.gemini_cli:GeminiCli",
    "opencode": "polar_pl.harness.opencode:OpenCode",
}


def harness_class(name: str):
    if name not in HARNESSES:
        raise ValueError(f"harness={name!r}: allowed values are {tuple(HARNESSES)}")
    module, _, cls = HARNESSES[name].partition(":")
    return getattr(importlib.import_module(module), cls)


def build_harness(name: str, **kwargs):
    """A harness by name with its defaults (pinned version, default provider) unless overridden."""
    return harness_class(name)(**kwargs)
