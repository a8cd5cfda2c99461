"""Real harness CLIs doing a three-turn tool task through the gateway: traces for merge stats.

The CLI runs as it ships (local sandbox) against a Gateway whose engine is a scripted test double:
turn 1 writes part of a file with the harness's own shell tool, turn 2 appends to it, turn 3
answers. The first turn is written the way models often write it (a blank line between the text
and `<tool_call>`, where the chat template puts one newline), so re-rendering the echoed turn
drifts unless the gateway splices the sampled tokens back (token-faithful prompts).

The engine double decides from the prompt TEXT (decoded prompt ids), not the chat body: a
token-in request (token-faithful mode) carries no chat body. Used by
tests/gateway/test_cli_traces.py and bench/merge.py (`--cli`).
"""

from __future__ import annotations

import dataclasses
import shlex
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from polar_pl.chat.toolparse import render_tool_call
from polar_pl.gateway.handle import Gateway
from polar_pl.gateway.store.records import TraceRecord
from polar_pl.testing.scripted import Reply, ScriptedBackend, ScriptedServer, ToolCall
from polar_pl.testing.smoke import SHELL_TOOL
from polar_pl.trajectory import MergeStats, PrefixBuilder

PROMPT = "Write 'part1' into result.txt, then append 'part2' to it, one shell command each."
RESULT_FILE = "result.txt"
ANSWER = "result.txt now holds part1part2."


@dataclass(frozen=True, slots=True)
class Raw:
    """An assistant turn given as the exact text the model writes (then end of turn)."""

    text: str


class PromptScriptedBackend(ScriptedBackend):
    """ScriptedBackend whose script gets {"prompt": decoded prompt} for every request."""

    def render_reply(self, reply: Reply | str | Raw, chat: Any) -> list[int]:
        if isinstance(reply, Raw):
            return self.tokenizer.encode(reply.text, add_special_tokens=False) + [self.eos_token_ids[0]]
        return super().render_reply(reply, chat)

    async def generate(self, request):
        prompt = self.tokenizer.decode(list(request.prompt_ids))
        async for batch in super().generate(dataclasses.replace(request, chat={"prompt": prompt})):
            yield batch


def three_turn_script(harness: str):
    tool, arg, extra = SHELL_TOOL[harness]
    first = f"printf %s part1 > {shlex.quote(RESULT_FILE)}"
    second = f"printf %s part2 >> {shlex.quote(RESULT_FILE)}"

    def reply(chat: dict[str, Any]) -> Reply | Raw:
        prompt = chat["prompt"]
        if f'"name": "{tool}"' not in prompt:  # a side call (title, memory, router): no shell tool
            return Reply("Write the result file")
        done = prompt.count("<tool_response>")
        if done == 0:
            return Raw("I will write the first part.\n\n" + render_tool_call(tool, {arg: first, **extra}))
        if done == 1:
            return Reply(tool_calls=[ToolCall(tool, {arg: second, **extra})])
        return Reply(ANSWER)

    return reply


@dataclass(frozen=True, slots=True)
class CliTrace:
    harness: str
    provider: str
    token_faithful: bool
    exit_code: int
    result_file: str | None
    answer: str | None
    records: list[TraceRecord]
    stats: MergeStats
    detail: str
    gateway_stats: dict[str, float] = field(default_factory=dict)

    @property
    def main_calls(self) -> list[TraceRecord]:
        return [r for r in self.records if r.call_kind == "main"]


def run_cli_session(
    name: str,
    *,
    token_faithful: bool,
    model_dir: str | Path,
    harness_prefix: str | Path | None = None,
    provider: str | None = None,
    timeout: float = 300.0,
    check: bool = False,
) -> CliTrace:
    """One CLI session (installed under harness_prefix) through a fresh gateway and engine double.
    check: compare every incremental token-faithful prompt with a full render (the gateway's
    `gateway/faithful/*` counters come back in `gateway_stats`)."""
    from polar_pl.harness import build_harness
    from polar_pl.harness.protocol import GatewaySession
    from polar_pl.harness.run import run_harness
    from polar_pl.sandbox.image import default_harness_prefix
    from polar_pl.sandbox.local import LocalSandbox

    found = default_harness_prefix(str(harness_prefix) if harness_prefix else None)
    if found is None:
        raise FileNotFoundError(f"{name} is not installed: polar-pl harness install {name}")
    prefix = Path(found)
    harness = build_harness(name, provider=provider) if provider else build_harness(name)
    if not harness.is_installed(prefix):
        raise FileNotFoundError(f"{name} is not installed: polar-pl harness install {name}")
    backend = PromptScriptedBackend.from_model_dir(model_dir, three_turn_script(name))
    server = ScriptedServer(backend).start()
    sandbox = LocalSandbox(owner="clitrace", harness_prefix=str(prefix))
    try:
        with (
            tempfile.TemporaryDirectory() as tmp,
            Gateway(
                [server.url],
                Path(tmp) / "traces.db",
                tokenizer_dir=model_dir,
                token_faithful=token_faithful,
                token_faithful_check=check and token_faithful,
            ) as gw,
        ):
            s = gw.create_session(task_id=f"cli-{name}", harness=name)
            sandbox.start()
            result = run_harness(
                harness,
                sandbox,
                GatewaySession(s.base_url, s.token, "polar-tiny"),
                PROMPT,
                timeout=timeout,
            )
            try:
                content = sandbox.get_file(RESULT_FILE).decode()
            except (FileNotFoundError, OSError):
                content = None
            records = gw.records(s.session_id)
            gateway_stats = gw.stats()
    finally:
        sandbox.stop()
        server.stop()
    stats = PrefixBuilder().build(records).stats
    detail = f"stdout:\n{result.stdout[-2000:]}\nstderr:\n{result.stderr[-2000:]}"
    return CliTrace(
        name,
        result.provider,
        token_faithful,
        result.exit_code,
        content,
        result.answer,
        records,
        stats,
        detail,
        gateway_stats,
    )
