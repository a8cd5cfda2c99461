"""mini: a small coding agent — bash and file-edit tools over OpenAI Chat Completions.

The example of bringing your own agent: anything that reads its base URL and key from the
environment can be trained through the gateway. This file is self-contained (stdlib only) because
it is copied into the sandbox and run there with the sandbox's python. It speaks plain HTTP with
urllib rather than the `openai` SDK: importing the SDK cost ~1.2 s of CPU per session, most of a
learnable-task session on two cores (the SDK stays the test client of the gateway's own tests).

    OPENAI_BASE_URL=<gateway>/s/<token>/v1 OPENAI_API_KEY=<token> \
        python mini_agent.py --model NAME --max-turns 20 --answer-file .polar/answer.txt "task"

Loop: send the conversation with the tools; run every tool call the model makes and append its
result; stop when the model answers without tool calls (or after --max-turns model calls).
With --work-turns N (and/or --title) it runs the note-taking loop instead (`run_notes`). The
final assistant message is printed to stdout and written to --answer-file, where evaluators read it.
Exit status: 0 answered, 3 max turns reached, 4 the API failed.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from types import SimpleNamespace
from typing import Any

SYSTEM = (
    "You are a coding agent working in a repository at the current directory. "
    "Use the tools to inspect and change files and to run commands. "
    "When the task is done, reply with a short final answer and no tool call."
)
OUTPUT_LIMIT = 16_000

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "bash",
            "description": "Run a bash command in the workspace; returns exit code, stdout and stderr.",
            "parameters": {
                "type": "object",
                "properties": {"command": {"type": "string", "description": "The command to run."}},
                "required": ["command"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "write_file",
            "description": "Create or overwrite a file with the given content.",
            "parameters": {
                "type": "object",
                "properties": {"path": {"type": "string"}, "content": {"type": "string"}},
                "required": ["path", "content"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "str_replace",
            "description": "Replace exactly one occurrence of old_str with new_str in a file.",
            "parameters": {
                "type": "object",
                "properties": {
                    "path": {"type": "string"},
                    "old_str": {"type": "string"},
                    "new_str": {"type": "string"},
                },
                "required": ["path", "old_str", "new_str"],
            },
        },
    },
]


class APIError(Exception):
    """The model API failed (HTTP error status, bad JSON, or no connection after the retries)."""


class OpenAI:
    """The slice of the openai SDK's client this agent uses, over urllib:
    `client.chat.completions.create(**body)` -> an object with `.choices[0].message.content` and
    `.tool_calls[i].id / .function.name / .function.arguments`. Base URL and key from
    OPENAI_BASE_URL / OPENAI_API_KEY as the SDK reads them; 408/409/429/5xx and connection errors
    are retried `max_retries` times, as the SDK does."""

    def __init__(self, max_retries: int = 2, timeout: float = 600.0) -> None:
        self.base_url = os.environ.get("OPENAI_BASE_URL", "https://api.openai.com/v1").rstrip("/")
        self.api_key = os.environ.get("OPENAI_API_KEY", "")
        self.max_retries, self.timeout = max_retries, timeout
        self.chat = SimpleNamespace(completions=SimpleNamespace(create=self._create))

    def _create(self, **body) -> SimpleNamespace:
        data = json.dumps(body).encode()
        headers = {"Content-Type": "application/json", "Authorization": f"Bearer {self.api_key}"}
        for attempt in range(self.max_retries + 1):
            req = urllib.request.Request(f"{self.base_url}/chat/completions", data, headers)
            try:
                with urllib.request.urlopen(req, timeout=self.timeout) as resp:
                    return _namespace(json.loads(resp.read()))
            except urllib.error.HTTPError as e:
                detail = e.read().decode(errors="replace")[:500]
                if e.code not in (408, 409, 429) and e.code < 500 or attempt == self.max_retries:
                    raise APIError(f"Error code: {e.code} - {detail}") from None
            except (urllib.error.URLError, OSError) as e:
                if attempt == self.max_retries:
                    raise APIError(f"Connection error: {e}") from None
            except json.JSONDecodeError as e:
                raise APIError(f"the answer is not JSON: {e}") from None
            time.sleep(0.5 * 2**attempt)
        raise AssertionError("unreachable")


def _namespace(obj):
    """JSON -> attribute access (missing optional fields read None, as the SDK's models do)."""
    if isinstance(obj, dict):
        return _Obj(**{k: _namespace(v) for k, v in obj.items()})
    if isinstance(obj, list):
        return [_namespace(v) for v in obj]
    return obj


class _Obj(SimpleNamespace):
    def __getattr__(self, name: str):  # only called for attributes that are absent
        return None


def _clip(text: str) -> str:
    if len(text) <= OUTPUT_LIMIT:
        return text
    half = OUTPUT_LIMIT // 2
    return f"{text[:half]}\n[... {len(text) - OUTPUT_LIMIT} characters cut ...]\n{text[-half:]}"


def tool_bash(command: str, timeout: float) -> str:
    try:
        p = subprocess.run(
            ["bash", "-c", command], capture_output=True, text=True, timeout=timeout, check=False
        )
    except subprocess.TimeoutExpired:
        return f"error: command timed out after {timeout:g}s"
    return _clip(f"exit code: {p.returncode}\nstdout:\n{p.stdout}\nstderr:\n{p.stderr}")


def tool_write_file(path: str, content: str) -> str:
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(content)
    return f"wrote {len(content)} characters to {path}"


def tool_str_replace(path: str, old_str: str, new_str: str) -> str:
    p = Path(path)
    if not p.is_file():
        return f"error: {path} is not a file"
    text = p.read_text()
    count = text.count(old_str)
    if count != 1:
        return f"error: old_str occurs {count} times in {path}; it must occur exactly once"
    p.write_text(text.replace(old_str, new_str, 1))
    return f"edited {path}"


def run_tool(name: str, arguments: str, bash_timeout: float) -> str:
    try:
        args = json.loads(arguments or "{}")
    except json.JSONDecodeError as e:
        return f"error: arguments are not valid JSON ({e})"
    try:
        if name == "bash":
            return tool_bash(str(args["command"]), bash_timeout)
        if name == "write_file":
            return tool_write_file(str(args["path"]), str(args["content"]))
        if name == "str_replace":
            return tool_str_replace(str(args["path"]), str(args["old_str"]), str(args["new_str"]))
    except KeyError as e:
        return f"error: missing argument {e}"
    except OSError as e:
        return f"error: {e}"
    return f"error: unknown tool {name!r}; tools are bash, write_file, str_replace"


def run(
    task: str,
    model: str,
    max_turns: int,
    bash_timeout: float,
    temperature: float | None,
    max_tokens: int | None = None,
    tools: bool = True,
) -> tuple[int, str]:
    """The tool loop; with tools=False one plain question: the task alone, no system prompt and no
    tools (the model's own default system prompt applies), its reply the answer."""
    client = OpenAI(max_retries=2)  # OPENAI_BASE_URL / OPENAI_API_KEY from the environment
    messages: list[dict] = [{"role": "system", "content": SYSTEM}] if tools else []
    messages.append({"role": "user", "content": task})
    extra: dict[str, Any] = {} if temperature is None else {"temperature": temperature}
    if max_tokens is not None:
        extra["max_tokens"] = max_tokens
    if tools:
        extra["tools"] = TOOLS
    for _ in range(max_turns):
        reply = client.chat.completions.create(model=model, messages=messages, **extra)
        msg = reply.choices[0].message
        calls = msg.tool_calls or []
        entry: dict = {"role": "assistant", "content": msg.content or ""}
        if calls:
            entry["tool_calls"] = [
                {
                    "id": c.id,
                    "type": "function",
                    "function": {"name": c.function.name, "arguments": c.function.arguments},
                }
                for c in calls
            ]
        messages.append(entry)
        if not calls:
            return 0, msg.content or ""
        for c in calls:
            result = run_tool(c.function.name, c.function.arguments, bash_timeout)
            messages.append({"role": "tool", "tool_call_id": c.id, "content": result})
    return 3, next(
        (m["content"] for m in reversed(messages) if m["role"] == "assistant" and m["content"]), ""
    )


NOTES_SYSTEM = "You are a careful assistant. Take short notes before you answer."
# OpenCode's title prompt opening: the gateway tags this call as a side call (gateway/call/sidecalls.py).
TITLE_SYSTEM = "You are a title generator. You output ONLY a thread title: a few words, nothing else."


def run_notes(
    task: str,
    model: str,
    work_turns: int,
    extra: dict,
    title: bool,
    note_tokens: int | None = None,
    client: Any = None,
) -> tuple[int, str]:
    """The note-taking loop (`--work-turns N`): ReAct-style text turns, no function calling.

    Each of N work turns sends the conversation, keeps the reply as a note and answers it with an
    observation (a user message restating the task: what a scratchpad tool would return); turn
    N + 1 is the final answer. With `title`, a title call first, as OpenCode and Claude Code make.
    note_tokens bounds the work turns' replies (the answer keeps the `max_tokens` in `extra`).
    An untrained model never emits a well-formed function call, so this is how a multi-call
    session with tool-result turns between sampled turns is run with one.
    """
    client = client or OpenAI(max_retries=2)
    if title:
        titled = [{"role": "system", "content": TITLE_SYSTEM}, {"role": "user", "content": task}]
        client.chat.completions.create(model=model, messages=titled, **{**extra, "max_tokens": 8})
    messages: list[dict] = [{"role": "system", "content": NOTES_SYSTEM}, {"role": "user", "content": task}]
    for turn in range(work_turns + 1):
        limit = {"max_tokens": note_tokens} if note_tokens and turn < work_turns else {}
        reply = client.chat.completions.create(model=model, messages=messages, **{**extra, **limit})
        text = reply.choices[0].message.content or ""
        messages.append({"role": "assistant", "content": text})
        if turn == work_turns:
            return 0, text
        messages.append({"role": "user", "content": observation(turn, work_turns, task)})
    return 0, ""


def observation(turn: int, work_turns: int, task: str) -> str:
    """The user message that answers note `turn` (0-based) of `work_turns`: it restates the task."""
    nxt = "Now give your final answer." if turn + 1 == work_turns else "Write your next note."
    return f"Note {turn + 1} saved. The task: {task} {nxt}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="mini", description=__doc__.split("\n\n")[0])
    ap.add_argument("task", help="the task prompt")
    ap.add_argument("--model", default=os.environ.get("OPENAI_MODEL", "default"))
    ap.add_argument("--max-turns", type=int, default=20)
    ap.add_argument("--bash-timeout", type=float, default=120.0)
    ap.add_argument("--temperature", type=float, default=None)
    ap.add_argument("--max-tokens", type=int, default=None, help="per-call response token limit")
    ap.add_argument("--answer-file", default=".polar/answer.txt")
    ap.add_argument(
        "--work-turns", type=int, default=0, help="note-taking turns before the answer (no tools)"
    )
    ap.add_argument("--title", action="store_true", help="make a title side call first")
    ap.add_argument("--note-tokens", type=int, default=None, help="response limit of the work turns")
    ap.add_argument("--no-tools", action="store_true", help="a plain question: no system prompt, no tools")
    args = ap.parse_args(argv)
    try:
        if args.work_turns > 0 or args.title:
            extra = {
                k: v
                for k, v in (("temperature", args.temperature), ("max_tokens", args.max_tokens))
                if v is not None
            }
            code, answer = run_notes(
                args.task, args.model, args.work_turns, extra, args.title, args.note_tokens
            )
        else:
            code, answer = run(
                args.task,
                args.model,
                args.max_turns,
                args.bash_timeout,
                args.temperature,
                args.max_tokens,
                tools=not args.no_tools,
            )
    except Exception as e:
        print(f"mini: model API error: {type(e).__name__}: {e}", file=sys.stderr)
        return 4
    path = Path(args.answer_file)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(answer)
    print(answer)
    return code


if __name__ == "__main__":
    sys.exit(main())
