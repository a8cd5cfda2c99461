"""Shared by test_anthropic_cli.py and test_google_cli.py: a real CLI runs a two-turn tool task
in which the model thinks before each answer, through the real gateway to a scripted engine
behind a reasoning parser (reasoning_proxy.py). Checked: exit 0, the tool ran, and the second
main call's prompt is the first call's prompt plus its sampled tokens, token for token, with the
reasoning re-rendered from what the CLI sent back (a thinking signature, or thought parts)."""

from __future__ import annotations

import contextlib
import shlex
from collections.abc import Iterator
from pathlib import Path

import pytest
from fixture_paths import HARNESS_PREFIX
from reasoning_proxy import reasoning_proxy

from polar_pl.gateway.handle import Gateway
from polar_pl.harness import build_harness
from polar_pl.harness.protocol import GatewaySession
from polar_pl.harness.run import run_harness
from polar_pl.testing.scripted import Reply, ToolCall, serve_scripted
from polar_pl.testing.smoke import ANSWER, PROMPT, RESULT_FILE, SHELL_TOOL
from polar_pl.utils.serving import ServerThread


def thinking_script(harness: str, content: str):
    """Think, call the harness's shell tool; after its result, think again and answer."""
    tool, arg, extra = SHELL_TOOL[harness]

    def reply(chat):
        names = {t.get("function", {}).get("name") for t in chat.get("tools") or []}
        if any(m.get("role") == "tool" for m in chat.get("messages") or []):
            return Reply(ANSWER, reasoning="The file is written; report it.")
        if tool in names:
            command = f"printf %s {shlex.quote(content)} > {RESULT_FILE}"
            return Reply(
                reasoning="I will write the file with the shell.",
                tool_calls=[ToolCall(tool, {arg: command, **extra})],
            )
        return Reply("Write the result file")

    return reply


class Stack:
    """engine (scripted) <- reasoning parser <- gateway; a test sets `script` per task."""

    def __init__(self) -> None:
        self.script = lambda chat: Reply("ok")
        self.gateway: Gateway | None = None


@contextlib.contextmanager
def thinking_stack(tiny_model_dir: Path, store: Path) -> Iterator[Stack]:
    stack = Stack()
    with (
        serve_scripted(lambda chat: stack.script(chat), model_dir=tiny_model_dir) as engine,
        ServerThread(reasoning_proxy(engine.url)) as proxy,
        Gateway([proxy.url], store, tokenizer_dir=tiny_model_dir, token_faithful=False) as gw,
    ):
        stack.gateway = gw
        yield stack


def run_thinking_task(stack: Stack, name: str, provider: str) -> list:
    """Run the task with harness `name` speaking `provider`; returns the two main-call records."""
    from polar_pl.sandbox.local import LocalSandbox
    from polar_pl.testing.sandbox import OWNER

    harness = build_harness(name, provider=provider)
    if not harness.is_installed(HARNESS_PREFIX):
        pytest.skip(f"{name} is not installed: polar-pl harness install {name} --prefix {HARNESS_PREFIX}")
    content = f"hello from {name} over {provider}"
    stack.script = thinking_script(name, content)
    handle = stack.gateway.create_session(harness=name)
    session = GatewaySession(base_url=handle.base_url, token=handle.token, model="polar-tiny")
    sandbox = LocalSandbox(owner=OWNER, harness_prefix=str(HARNESS_PREFIX))
    sandbox.start()
    try:
        result = run_harness(harness, sandbox, session, PROMPT, timeout=240)
        detail = f"stdout:\n{result.stdout[-2000:]}\nstderr:\n{result.stderr[-2000:]}"
        assert result.exit_code == 0 and not result.timed_out, detail
        assert sandbox.get_file(RESULT_FILE).decode() == content
    finally:
        sandbox.stop()
    main = [r for r in stack.gateway.records(handle.session_id) if r.call_kind == "main"]
    assert len(main) == 2 and all(r.status == "ok" for r in main), [(r.status, r.error) for r in main]
    first, second = main
    assert first.finish_reason == "tool_calls"
    sampled = first.prompt_ids + first.response_ids
    assert second.prompt_ids[: len(sampled)] == sampled, "the thinking turn did not re-render token for token"
    turn = next(m for m in second.normalized_request["messages"] if m["role"] == "assistant")
    assert turn["reasoning"].strip() == "I will write the file with the shell."
    return main
