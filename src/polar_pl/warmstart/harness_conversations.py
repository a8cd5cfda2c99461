"""Generated conversations inside a real harness's request: the warm start's training data.

Each example continues a captured harness request (harness_capture.py) whose task text is one of
the learnable tasks' prompts: the assistant answers directly (capital-letter and echo tasks) or
calls the harness's own shell tool to write the answer file, reads the harness-style tool result
and ends its turn. Answers are deliberately mixed (all caps or not, the exact word or not): the
warm model can do each task but has no preference yet, so every GRPO group has reward variance
and RL decides what it learns.

The harness's shell tool (name, command argument, other required arguments) is read from the
captured tool schemas, so a new CLI version's renamed tool is picked up by the next build.
"""

from __future__ import annotations

import json
import random
import shlex
from dataclasses import dataclass
from typing import Any

from polar_pl.tasks.learnable import ECHO_WORDS, TOPICS, UPPER_TEMPLATES, file_task_prompt, learnable_task
from polar_pl.tasks.task import Task

SHELL_NAMES = ("Bash", "bash", "exec_command", "run_shell_command", "shell")
COMMAND_ARGS = ("command", "cmd")
ANSWER_FILE = "answer.txt"

# What each harness sends back after a shell command that printed nothing (from the captures).
EMPTY_RESULT = {
    "claude_code": "(Bash completed with no output)",
    "codex": "Chunk ID: {hex}\nWall time: 0.0{d} seconds\nProcess exited with code 0\n"
    "Original token count: 0\nOutput:\n",
    "qwen_code": "Command: {cmd}\nDirectory: (root)\nOutput: (empty)\nError: (none)\nExit Code: 0\n"
    "Signal: (none)\nProcess Group PGID: (none)",
    "gemini_cli": '{{"output": "Output: (empty)\\nProcess Group PGID: {pid}"}}',
    "pi": "(no output)",
    "opencode": "",
}
_SENTENCES = (
    "I think {topic} is great.",
    "Here is my answer about {topic}.",
    "{topic} is a fine choice.",
    "My reply: {topic} sounds good to me.",
    "Sure, {topic} is interesting.",
    "I like {topic} a lot.",
)
_DONE = ("Done.", "I wrote the file.", "The file answer.txt is written.", "Done, the word is in answer.txt.")


@dataclass(frozen=True, slots=True)
class ShellTool:
    name: str
    command_arg: str
    extra: dict[str, str]


@dataclass(frozen=True, slots=True)
class Example:
    """A task prompt and what follows the request: assistant turns, with tool results between.

    turns: ("assistant", message dict) or ("tool", result text), in order; the last is assistant.
    """

    task: str
    turns: tuple[tuple[str, Any], ...]


def shell_tool(tools: list[dict[str, Any]]) -> ShellTool:
    """The harness's shell tool from its schemas; other required string arguments get a text."""
    by_name = {t["function"]["name"]: t["function"] for t in tools if t.get("function")}
    for name in SHELL_NAMES:
        fn = by_name.get(name)
        if fn is None:
            continue
        params = fn.get("parameters") or {}
        props = params.get("properties") or {}
        arg = next((a for a in COMMAND_ARGS if a in props), None)
        if arg is None:
            continue
        extra = {
            p: "Write the answer file"
            for p in params.get("required") or []
            if p != arg and (props.get(p) or {}).get("type") == "string"
        }
        return ShellTool(name, arg, extra)
    raise ValueError(f"no shell tool among the harness's tools: {sorted(by_name)}")


def _caps(text: str, rng: random.Random) -> str:
    return text.upper() if rng.random() < 0.5 else text


def uppercase_example(rng: random.Random, task: str | None = None) -> Example:
    topic = rng.choice(TOPICS)
    task = task or rng.choice(UPPER_TEMPLATES).format(topic=topic)
    answer = rng.choice(_SENTENCES).format(topic=topic)
    return Example(task, (("assistant", {"role": "assistant", "content": _caps(answer, rng)}),))


def echo_example(rng: random.Random) -> Example:
    word = rng.choice(ECHO_WORDS)
    task = f"Reply with exactly this word and nothing else: {word}"
    answer = rng.choice([word, word, word.title(), f"{word}.", rng.choice(ECHO_WORDS)])
    return Example(task, (("assistant", {"role": "assistant", "content": answer}),))


def file_example(
    rng: random.Random, harness: str, tool: ShellTool, index: int, word: str | None = None
) -> Example:
    word = word or rng.choice(ECHO_WORDS).upper()
    written = rng.choice([word, word, word.lower(), word.title(), rng.choice(ECHO_WORDS).upper()])
    command = f"echo {shlex.quote(written)} > {ANSWER_FILE}"
    turns = _shell_turns(rng, harness, tool, index, command)
    return Example(
        file_task_prompt(word), (*turns, ("assistant", {"role": "assistant", "content": rng.choice(_DONE)}))
    )


_WROTE = (
    "Done.",
    "The result is in result.txt.",
    "I wrote the result to result.txt.",
    "Done: result.txt is written.",
)


def _shell_turns(
    rng: random.Random, harness: str, tool: ShellTool, index: int, command: str, output: str = ""
) -> tuple[tuple[str, Any], ...]:
    """An assistant turn calling the shell tool with `command`, and the harness's result: `output`,
    or what it sends when a command printed nothing."""
    call = {
        "id": f"call_{index}_{rng.randrange(16**8):08x}",
        "type": "function",
        "function": {"name": tool.name, "arguments": json.dumps({tool.command_arg: command, **tool.extra})},
    }
    result = output or EMPTY_RESULT.get(harness, "(no output)").format(
        hex=f"{rng.randrange(16**6):06x}", d=rng.randint(10, 99), cmd=command, pid=rng.randint(100, 9999)
    )
    return (
        ("assistant", {"role": "assistant", "content": "", "tool_calls": [call]}),
        ("tool", {"role": "tool", "tool_call_id": call["id"], "content": result}),
    )


def tool_task_example(rng: random.Random, harness: str, tool: ShellTool, task: Task, index: int) -> Example:
    """A demonstration of a `tools` arithmetic task (tasks/arith.py): the product computed by the
    shell into the result file; or the data file printed, its item copied into the result file.
    Then a short closing reply."""
    a, op, b = task.extra["problem"]
    assert task.answer_check is not None  # a `tools` task is scored from its result file
    out = task.answer_check.params["path"]
    if op == "*":
        turns = _shell_turns(rng, harness, tool, index, f"echo $(({a} * {b})) > {out}")
    else:
        shown = _shell_turns(rng, harness, tool, index, "cat data.txt", "\n".join(task.extra["lines"]))
        turns = shown + _shell_turns(rng, harness, tool, index + 1, f"echo {a} > {out}")
    return Example(
        task.problem_statement, (*turns, ("assistant", {"role": "assistant", "content": rng.choice(_WROTE)}))
    )


def tool_task_examples(
    harness: str, tools: list[dict[str, Any]], tasks: list[Task], seed: int
) -> list[Example]:
    """One demonstration of each task (the `tools` family's train split)."""
    rng = random.Random(seed)
    tool = shell_tool(tools)
    return [tool_task_example(rng, harness, tool, task, 2 * i) for i, task in enumerate(tasks)]


def examples(harness: str, tools: list[dict[str, Any]], seed: int, count: int) -> list[Example]:
    """`count` examples: 40% capital-letter replies, 20% echo replies, 40% answer files."""
    rng = random.Random(seed)
    tool = shell_tool(tools)
    out = []
    for i in range(count):
        r = rng.random()
        if r < 0.4:
            out.append(uppercase_example(rng))
        elif r < 0.6:
            out.append(echo_example(rng))
        else:
            out.append(file_example(rng, harness, tool, i))
    return out


def task_examples(
    harness: str,
    tools: list[dict[str, Any]],
    seed: int,
    n_upper: int,
    per_task: int,
    n_file: int = len(ECHO_WORDS),
) -> dict[str, list[Example]]:
    """Examples for the learnable tasks RL will use, by prompt: the `file` tasks of the first
    `n_file` words and the first `n_upper` `uppercase` tasks of `seed` (the task source's own prompts)."""
    rng = random.Random(seed)
    tool = shell_tool(tools)
    out: dict[str, list[Example]] = {}
    for word in ECHO_WORDS[:n_file]:
        task = file_task_prompt(word.upper())
        out[task] = [file_example(rng, harness, tool, i, word.upper()) for i in range(per_task)]
    for i in range(n_upper):
        task = learnable_task("uppercase", i, seed).prompt
        out.setdefault(task, [uppercase_example(rng, task) for _ in range(per_task)])
    return out
