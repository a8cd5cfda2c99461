"""A scripted two-turn tool task for any harness: the model calls the harness's own shell tool to
write a file, then answers once the tool result comes back. Used by the end-to-end tests, the
sandbox benchmark and as a quick check that a harness works through the gateway.

`script_for(name, content)` is a ScriptedBackend script (a callable on the chat body); side calls
without the shell tool (titles, memory extraction) get a short text. `smoke_gateway(model_dir)`
serves one on a real gateway, the script swapped per session (`script.reply = script_for(...)`).
"""

from __future__ import annotations

import shlex
import tempfile
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

from polar_pl.testing.scripted import Reply, ToolCall, serve_scripted

# harness -> (its shell tool, the argument holding the command, extra arguments the tool requires);
# names as recorded from each CLI's requests (docs/harnesses.md).
SHELL_TOOL: dict[str, tuple[str, str, dict[str, Any]]] = {
    "mini": ("bash", "command", {}),
    "claude_code": ("Bash", "command", {"description": "Write the result file"}),
    "codex": ("exec_command", "cmd", {}),
    "qwen_code": ("run_shell_command", "command", {}),
    "gemini_cli": ("run_shell_command", "command", {}),
    "pi": ("bash", "command", {}),
    "opencode": ("bash", "command", {"description": "Write the result file"}),
}
PROMPT = "Write the greeting into result.txt."
RESULT_FILE = "result.txt"
ANSWER = "The file result.txt now holds the greeting."


def script_for(harness: str, content: str):
    tool, arg, extra = SHELL_TOOL[harness]
    command = f"printf %s {shlex.quote(content)} > {RESULT_FILE}"

    def reply(chat: dict[str, Any]) -> Reply:
        names = {t.get("function", {}).get("name") for t in chat.get("tools") or []}
        if any(m.get("role") == "tool" for m in chat.get("messages") or []):
            return Reply(ANSWER)
        if tool in names:
            return Reply(tool_calls=[ToolCall(tool, {arg: command, **extra})])
        return Reply("Write the result file")

    return reply


class Script:
    """The scripted engine's answer to each chat request: `reply(chat)`, set per session."""

    def __init__(self) -> None:
        self.reply: Callable[[dict[str, Any]], Reply] = lambda chat: Reply("ok")

    def __call__(self, chat: dict[str, Any]) -> Reply:
        return self.reply(chat)


@contextmanager
def smoke_gateway(model_dir: Path) -> Iterator[tuple[Any, Script]]:
    """(a real gateway over a scripted engine with `model_dir`'s tokenizer, its script)."""
    from polar_pl.gateway.handle import Gateway

    script = Script()
    with ExitStack() as stack, tempfile.TemporaryDirectory() as tmp:
        engine = stack.enter_context(serve_scripted(script, model_dir=model_dir))
        yield (
            stack.enter_context(
                Gateway([engine.url], Path(tmp) / "t.db", tokenizer_dir=model_dir, token_faithful=False)
            ),
            script,
        )
