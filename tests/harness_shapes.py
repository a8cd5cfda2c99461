"""Requests shaped like real harnesses' (pi: the task last; Claude Code: a block after it), for the
warm-start tests: the real captures are ~2k and ~15k tokens, too long for unit tests."""

from __future__ import annotations

from polar_pl.warmstart.harness_capture import MARKER, HarnessPrompt

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "bash",
            "description": "Execute a bash command.",
            "parameters": {
                "type": "object",
                "required": ["command", "description"],
                "properties": {"command": {"type": "string"}, "description": {"type": "string"}},
            },
        },
    },
    {"type": "function", "function": {"name": "read", "description": "Read a file.", "parameters": {}}},
]


def prompt(after_task: str = "") -> HarnessPrompt:
    """A request shaped like pi's (system, tools, then the task last) or, with `after_task`, like
    Claude Code's (a long block after the task)."""
    messages = [
        {"role": "system", "content": "You are a coding agent. Working directory: /tmp/w1/workspace"},
        {"role": "user", "content": f"<reminder>context</reminder>\n\n{MARKER}"},
    ]
    if after_task:
        messages.append(
            {"role": "system", "content": after_task + " Primary working directory: /tmp/w1/workspace"}
        )
    return HarnessPrompt("pi", "0", messages, TOOLS, "/tmp/w1/workspace")
