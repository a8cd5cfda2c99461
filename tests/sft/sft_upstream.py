"""A scripted upstream for SFT tests: the "model" applies the task's reference fix for the tasks it
is told to solve, and for the others looks around and gives up (the evaluator then fails it)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from polar_pl.tasks.task import Task
from polar_pl.testing.scripted import Reply, ToolCall


def _text(content: Any) -> str:
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content if isinstance(p, dict))
    return content or ""


def solver(tasks: Iterable[Task], solve: set[str]):
    """The script callable: first turn acts (fix or look), second turn answers without a tool."""
    tasks = list(tasks)

    def reply(chat: dict[str, Any]) -> Reply:
        messages = chat["messages"]
        user = _text(next(m for m in messages if m["role"] == "user")["content"])
        task = next(t for t in tasks if t.problem_statement.strip() in user)
        if any(m["role"] == "assistant" for m in messages):
            return Reply("Done." if task.instance_id in solve else "I could not fix it.")
        if task.instance_id in solve:
            command = f"git apply <<'PATCH'\n{task.patch}PATCH"
            return Reply("Applying the fix.", tool_calls=[ToolCall("bash", {"command": command})])
        return Reply(tool_calls=[ToolCall("bash", {"command": "ls"})])

    return reply
