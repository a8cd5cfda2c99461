"""The first request a real harness CLI sends, as the engine sees it: the warm start's context.

The pinned CLI runs once on a marker task through a real gateway in front of the embedded engine
(any weights: only the request matters, so responses are capped at one token). The main call's
normalized request (OpenAI Chat messages and tools, after the gateway's conversion) is what every
later session of that harness looks like up to the task text: system prompt, tool schemas,
environment blocks. Capturing it from the installed version keeps the warm start in step with
the CLI's wire format, which changes often.
"""

from __future__ import annotations

import copy
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

MARKER = "Reply with the single word PLACEHOLDER."


@dataclass(frozen=True, slots=True)
class HarnessPrompt:
    """A harness's main-call request with the task text findable by `MARKER`.

    messages / tools: OpenAI Chat, as the gateway sends them to the engine.
    workdir: the workspace path the CLI saw (it appears in environment blocks).
    """

    harness: str
    version: str
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]]
    workdir: str

    def with_task(self, task: str, workdir: str | None = None) -> list[dict[str, Any]]:
        """The messages with the marker replaced by `task` (and the workspace path by `workdir`)."""
        messages = copy.deepcopy(self.messages)
        found = False
        for m in messages:
            content = m.get("content")
            if isinstance(content, str):
                if MARKER in content:
                    found = True
                    content = content.replace(MARKER, task)
                if workdir is not None:
                    content = content.replace(self.workdir, workdir)
                m["content"] = content
        if not found:
            raise ValueError(f"{self.harness}: the captured request does not contain the task marker")
        return messages

    def to_dict(self) -> dict[str, Any]:
        return {
            "harness": self.harness,
            "version": self.version,
            "messages": self.messages,
            "tools": self.tools,
            "workdir": self.workdir,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> HarnessPrompt:
        return cls(d["harness"], d["version"], _flatten(d["messages"]), d["tools"], d["workdir"])


def capture_harness_prompt(
    name: str,
    model_dir: str | Path,
    harness_prefix: str | Path,
    timeout: float = 240.0,
    extra_args: Sequence[str] = (),
) -> HarnessPrompt:
    """Run harness `name` once on `MARKER` (with its command-line `extra_args`) and return its
    first main call's request."""
    from polar_pl.engine.embedded import EmbeddedEngine
    from polar_pl.gateway.handle import Gateway
    from polar_pl.harness import build_harness
    from polar_pl.harness.protocol import GatewaySession
    from polar_pl.harness.run import run_harness
    from polar_pl.sandbox.local import LocalSandbox

    harness = build_harness(name, extra_args=list(extra_args))
    if not harness.is_installed(Path(harness_prefix)):
        raise FileNotFoundError(
            f"harness {name} is not installed under {harness_prefix}: "
            f"polar-pl harness install {name} --prefix {harness_prefix}"
        )
    engine = EmbeddedEngine(model_dir, num_threads=1).start()
    try:
        with tempfile.TemporaryDirectory(prefix="polar-capture-") as tmp:
            gw = Gateway([engine.url], Path(tmp) / "traces.db", max_tokens_cap=1).start()
            sandbox = LocalSandbox(harness_prefix=str(harness_prefix))
            try:
                sandbox.start()
                session = gw.create_session(task_id="capture", harness=name)
                run_harness(
                    harness,
                    sandbox,
                    GatewaySession(session.base_url, session.token, "polar-tiny"),
                    MARKER,
                    timeout=timeout,
                )
                records = gw.records(session.session_id)
                workdir = sandbox.workdir
            finally:
                sandbox.stop()
                gw.stop()
    finally:
        engine.stop()
    for record in records:
        req = record.normalized_request or {}
        if record.call_kind == "main" and MARKER in str(req.get("messages")):
            return HarnessPrompt(
                name, harness.version, _flatten(req["messages"]), list(req.get("tools") or []), workdir
            )
    kinds = [(r.call_kind, r.status, r.error) for r in records]
    raise RuntimeError(f"harness {name} sent no main call with the task (calls: {kinds})")


def _flatten(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Text-part lists joined with newlines, as the engine's renderer joins them, so the task
    marker can be replaced in plain strings and the render is unchanged."""
    out = []
    for m in messages:
        m = dict(m)
        if isinstance(m.get("content"), list):
            m["content"] = "\n".join(p if isinstance(p, str) else p.get("text", "") for p in m["content"])
        out.append(m)
    return out
