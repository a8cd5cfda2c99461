"""Seeded generator of chat and tool-use conversations in OpenAI message format.

Used twice: as tokenizer training text (rendered through the chat template) and as warm-start
fine-tuning data, so that the tiny model learns the hermes `<tool_call>` format that the engine's
tool parser reads. Tool sets imitate the harnesses the project drives (shell, read/edit/write,
search), so harness-shaped prompts tokenize compactly. Everything derives from a `random.Random`
seeded by the caller: same seed, same conversations.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from typing import Any

# (name, description, {param: (json type, description)}); every param is required.
ToolSpec = tuple[str, str, dict[str, tuple[str, str]]]

TOOLSETS: dict[str, list[ToolSpec]] = {
    "claude": [
        ("Bash", "Executes a bash command and returns its output.", {"command": ("string", "The command")}),
        ("Read", "Reads a file from the local filesystem.", {"file_path": ("string", "Absolute path")}),
        (
            "Write",
            "Writes a file to the local filesystem.",
            {"file_path": ("string", "Absolute path"), "content": ("string", "File content")},
        ),
        (
            "Edit",
            "Performs exact string replacements in a file.",
            {
                "file_path": ("string", "Absolute path"),
                "old_string": ("string", "Text to replace"),
                "new_string": ("string", "Replacement text"),
            },
        ),
        (
            "Grep",
            "Searches file contents with a regular expression.",
            {"pattern": ("string", "Regex"), "path": ("string", "Directory to search")},
        ),
        ("Glob", "Finds files by glob pattern.", {"pattern": ("string", "Glob pattern")}),
    ],
    "codex": [
        ("shell", "Runs a shell command and returns its output.", {"command": ("string", "Command line")}),
        ("apply_patch", "Applies a patch to files in the workspace.", {"input": ("string", "The patch")}),
    ],
    "qwen": [
        ("run_shell_command", "Executes a shell command.", {"command": ("string", "Exact command")}),
        ("read_file", "Reads and returns the content of a file.", {"absolute_path": ("string", "Path")}),
        (
            "write_file",
            "Writes content to a file.",
            {"file_path": ("string", "Path"), "content": ("string", "Content")},
        ),
        ("search_file_content", "Searches for a regex in files.", {"pattern": ("string", "Regex")}),
        ("list_directory", "Lists the entries of a directory.", {"path": ("string", "Directory")}),
    ],
    "assistant": [
        ("get_weather", "Gets the current weather for a city.", {"city": ("string", "City name")}),
        ("calculator", "Evaluates an arithmetic expression.", {"expression": ("string", "Expression")}),
        ("search_web", "Searches the web.", {"query": ("string", "Search query")}),
    ],
}

SYSTEM_PROMPTS = [
    "You are a helpful assistant.",
    "You are an interactive CLI tool that helps users with software engineering tasks.",
    "You are a coding agent running in a sandboxed workspace. Use the tools to inspect and change files.",
    "You are a concise assistant. Answer briefly.",
]
WORDS = [
    "parse",
    "config",
    "cache",
    "token",
    "buffer",
    "index",
    "router",
    "client",
    "server",
    "queue",
    "batch",
    "vector",
    "matrix",
    "record",
    "stream",
    "event",
    "worker",
    "model",
    "reward",
    "trace",
]
DIRS = ["src", "lib", "app", "tests", "pkg", "utils", "core", "scripts"]
EXTS = [".py", ".ts", ".js", ".rs", ".go", ".md", ".toml", ".json"]
CITIES = ["Paris", "Tokyo", "Berlin", "Lima", "Nairobi", "Oslo", "Toronto", "Hanoi", "Zürich", "São Paulo"]
COMMANDS = [
    "ls -la",
    "git status",
    "git diff --stat",
    "pytest -q",
    "python -m pytest tests -x",
    "make test",
    "cat README.md",
    "grep -rn TODO src",
    "npm test",
    "cargo build",
    "wc -l {p}",
    "python {p}",
]
CHAT = [
    ("Hi!", "Hello! How can I help you today?"),
    ("What is 2 + 2?", "2 + 2 = 4."),
    ("Name a prime number greater than 10.", "13 is a prime number greater than 10."),
    ("Translate 'thank you' to French.", "'Thank you' in French is 'merci'."),
    ("What does HTTP stand for?", "HTTP stands for HyperText Transfer Protocol."),
    ("Give me a Python one-liner to reverse a list.", "Use slicing: `items[::-1]`."),
    ("¿Qué hora es en Tokio?", "No tengo acceso a la hora actual, pero Tokio está en UTC+9."),
    ("用一句话介绍你自己。", "我是一个乐于助人的AI助手。"),
]


@dataclass(frozen=True, slots=True)
class Conversation:
    """One generated conversation: OpenAI-format messages plus the tools offered (or None)."""

    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None


def tool_schema(spec: ToolSpec) -> dict[str, Any]:
    """The OpenAI function-tool schema for a `ToolSpec`."""
    name, description, params = spec
    properties = {p: {"type": t, "description": d} for p, (t, d) in params.items()}
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": description,
            "parameters": {"type": "object", "properties": properties, "required": list(params)},
        },
    }


def _path(rng: random.Random) -> str:
    return f"/workspace/{rng.choice(DIRS)}/{rng.choice(WORDS)}_{rng.choice(WORDS)}{rng.choice(EXTS)}"


def _snippet(rng: random.Random) -> str:
    a, b = rng.sample(WORDS, 2)
    n = rng.randint(1, 9)
    return (
        f'def {a}_{b}(items):\n    """Return the {a} of each {b}."""\n    return [x * {n} for x in items]\n'
    )


def _arg_value(param: str, rng: random.Random) -> str:
    if param == "command":
        return rng.choice(COMMANDS).replace("{p}", _path(rng))
    if param in ("file_path", "absolute_path"):
        return _path(rng)
    if param == "path":
        return f"/workspace/{rng.choice(DIRS)}"
    if param == "pattern":
        return rng.choice(
            [f"def {rng.choice(WORDS)}", f"class {rng.choice(WORDS).title()}", "**/*.py", "TODO"]
        )
    if param in ("content", "new_string"):
        return _snippet(rng)
    if param == "old_string":
        return f"return [x * {rng.randint(1, 9)} for x in items]"
    if param == "input":
        p = _path(rng)
        return f"*** Begin Patch\n*** Update File: {p}\n-    x = {rng.randint(0, 9)}\n+    x = {rng.randint(10, 99)}\n*** End Patch"
    if param == "city":
        return rng.choice(CITIES)
    if param == "expression":
        return f"{rng.randint(2, 999)} {rng.choice('+-*/')} {rng.randint(2, 99)}"
    return f"{rng.choice(WORDS)} {rng.choice(WORDS)} {rng.choice(['python', 'rust', 'tutorial', 'docs'])}"


def _request(name: str, args: dict[str, str], rng: random.Random) -> str:
    """A user request that mentions the arguments, so the call is predictable from the prompt."""
    first = next(iter(args.values()))
    if "command" in args:
        return rng.choice(
            ["Run `{v}` and tell me what it prints.", "Please execute: {v}", "Can you run {v}?"]
        ).format(v=first)
    if "old_string" in args:
        return f"In {args['file_path']}, change the multiplier line to a new implementation."
    if "content" in args:
        return f"Create {first} with a small helper function."
    if name in ("Read", "read_file"):
        return rng.choice(["Show me what's in {v}.", "Open {v} and summarize it.", "Read {v}."]).format(
            v=first
        )
    if name in ("Grep", "search_file_content"):
        return f"Find where `{first}` appears in the code."
    if name in ("Glob", "list_directory"):
        return f"List the files matching {first}."
    if name == "apply_patch":
        return "Bump the constant in the file as discussed."
    if name == "get_weather":
        return rng.choice(["What's the weather in {v}?", "Is it raining in {v} right now?"]).format(v=first)
    if name == "calculator":
        return f"Compute {first}."
    return f"Search the web for {first}."


def _result(name: str, args: dict[str, str], rng: random.Random) -> str:
    if name in ("Read", "read_file"):
        return _snippet(rng)
    if name in ("Bash", "shell", "run_shell_command"):
        return rng.choice(
            [
                "3 passed in 0.12s",
                "On branch main\nnothing to commit, working tree clean",
                f"total {rng.randint(8, 99)}\ndrwxr-xr-x src\n-rw-r--r-- README.md",
                "exit code 0",
            ]
        )
    if name == "get_weather":
        return json.dumps(
            {
                "city": args["city"],
                "temperature_c": rng.randint(-10, 35),
                "condition": rng.choice(["sunny", "cloudy", "rain"]),
            },
            ensure_ascii=False,
        )
    if name == "calculator":
        return str(rng.randint(-500, 99999))
    if name in ("Grep", "search_file_content", "Glob", "list_directory"):
        return "\n".join(
            _path(rng) + (f":{rng.randint(1, 300)}" if "pattern" in args else "") for _ in range(3)
        )
    return rng.choice(["OK", "File written successfully.", "Patch applied.", "1 result found."])


def _call(name: str, args: dict[str, str], rng: random.Random, index: int) -> dict[str, Any]:
    # Arguments arrive both as objects and as JSON strings in real traffic; the template accepts both.
    arguments: Any = args if rng.random() < 0.5 else json.dumps(args, ensure_ascii=False)
    return {
        "id": f"call_{index}_{rng.randrange(16**8):08x}",
        "type": "function",
        "function": {"name": name, "arguments": arguments},
    }


def tool_conversation(rng: random.Random, max_calls: int = 2, max_tools: int = 6) -> Conversation:
    """System + user request, then one to `max_calls` tool rounds, then a short final answer."""
    specs = TOOLSETS[rng.choice(list(TOOLSETS))]
    offered = rng.sample(specs, rng.randint(min(2, len(specs)), min(max_tools, len(specs))))
    messages: list[dict[str, Any]] = []
    if rng.random() < 0.8:
        messages.append({"role": "system", "content": rng.choice(SYSTEM_PROMPTS)})
    first_request = None
    for step in range(rng.randint(1, max_calls)):
        name, _, params = rng.choice(offered)
        args = {p: _arg_value(p, rng) for p in params}
        if first_request is None:
            first_request = _request(name, args, rng)
            messages.append({"role": "user", "content": first_request})
        calls = [_call(name, args, rng, step)]
        if rng.random() < 0.15:  # parallel calls in one turn
            name2, _, params2 = rng.choice(offered)
            args2 = {p: _arg_value(p, rng) for p in params2}
            calls.append(_call(name2, args2, rng, step + 10))
        turn: dict[str, Any] = {"role": "assistant", "content": "", "tool_calls": calls}
        if rng.random() < 0.3:
            turn["reasoning_content"] = f"The user wants this done. I will call {name} first."
        if rng.random() < 0.2:
            turn["content"] = f"I'll use {name} for that."
        messages.append(turn)
        for call in calls:
            fn = call["function"]
            real_args = fn["arguments"] if isinstance(fn["arguments"], dict) else json.loads(fn["arguments"])
            messages.append(
                {"role": "tool", "tool_call_id": call["id"], "content": _result(fn["name"], real_args, rng)}
            )
    messages.append(
        {
            "role": "assistant",
            "content": rng.choice(
                [
                    "Done.",
                    "Here is what I found: the command succeeded.",
                    "The file contains a small helper function.",
                    "All tests pass.",
                    "I made the change you asked for.",
                ]
            ),
        }
    )
    return Conversation(messages, [tool_schema(s) for s in offered])


def chat_conversation(rng: random.Random) -> Conversation:
    """A plain exchange without tools, sometimes with a system prompt and reasoning."""
    messages: list[dict[str, Any]] = []
    if rng.random() < 0.5:
        messages.append({"role": "system", "content": rng.choice(SYSTEM_PROMPTS)})
    for question, answer in rng.sample(CHAT, rng.randint(1, 2)):
        messages.append({"role": "user", "content": question})
        turn = {"role": "assistant", "content": answer}
        if rng.random() < 0.3:
            turn["reasoning_content"] = "Let me think about this briefly."
        messages.append(turn)
    return Conversation(messages, None)


def generate(seed: int, count: int, tool_fraction: float = 0.8, max_tools: int = 6) -> list[Conversation]:
    """`count` conversations from `seed`; `tool_fraction` of them use tools (at most `max_tools` offered)."""
    rng = random.Random(seed)
    return [
        tool_conversation(rng, max_tools=max_tools)
        if rng.random() < tool_fraction
        else chat_conversation(rng)
        for _ in range(count)
    ]
