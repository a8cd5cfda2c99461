"""Hermes `<tool_call>` parsing, as vLLM's `hermes` tool parser does it.

The model writes tool calls as `<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>`
after optional free text. The engine parses them into OpenAI `tool_calls`; the gateway reuses the
same functions in token-in mode, so both sides agree on what a tool call is.

Behaviour copied from vLLM (`vllm/tool_parsers/hermes_tool_parser.py`):
- full parse: content is the text before the first `<tool_call>` (None if empty), whitespace kept
  (vLLM's parser-engine options `strip_content_whitespace_with_tools` / `drop_whitespace_only_
  content_before_tools` belong to engine-based tool parsers, not hermes; the serving layer only
  turns whitespace-only content into None); an unterminated
  last `<tool_call>` still counts if its JSON is complete; arguments are re-serialized with
  `json.dumps(ensure_ascii=False)`; any malformed call makes the whole output plain content;
- streaming: content is sent up to the first `<tool_call>` (holding back a partial tag), then per
  call one delta with id + name, then argument deltas taken verbatim from the generated JSON text.
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass, field
from typing import Any

TOOL_CALL_START = "<tool_call>"
TOOL_CALL_END = "</tool_call>"
_TOOL_CALL_RE = re.compile(r"<tool_call>(.*?)</tool_call>|<tool_call>(.*)", re.DOTALL)
_NAME_RE = re.compile(r'"name"\s*:\s*"([^"]+)"')
_ARGS_RE = re.compile(r'"arguments"\s*:\s*')


def make_tool_call_id() -> str:
    """vLLM's id shape: `chatcmpl-tool-` + 16 hex chars."""
    return f"chatcmpl-tool-{uuid.uuid4().int & ((1 << 64) - 1):016x}"


@dataclass(frozen=True, slots=True)
class ParsedToolCalls:
    """Result of a full parse. tool_calls are OpenAI dicts: {id, type, function{name, arguments}}."""

    tools_called: bool
    tool_calls: tuple[dict[str, Any], ...]
    content: str | None


def parse_tool_calls(text: str) -> ParsedToolCalls:
    """Parse a finished model output. Never raises: malformed calls leave the text as content."""
    if TOOL_CALL_START not in text:
        return ParsedToolCalls(False, (), text)
    try:
        raw_calls = [json.loads(a if a else b) for a, b in _TOOL_CALL_RE.findall(text)]
        calls = tuple(
            {
                "id": make_tool_call_id(),
                "type": "function",
                "function": {
                    "name": call["name"],
                    "arguments": json.dumps(call["arguments"], ensure_ascii=False),
                },
            }
            for call in raw_calls
        )
    except (ValueError, KeyError, TypeError):
        return ParsedToolCalls(False, (), text)
    content = text[: text.find(TOOL_CALL_START)]
    return ParsedToolCalls(True, calls, content or None)


def render_tool_call(name: str, arguments: dict[str, Any]) -> str:
    """The text Qwen3-style templates write for one call (used to script assistant turns)."""
    args = json.dumps(arguments, ensure_ascii=False)
    return f'{TOOL_CALL_START}\n{{"name": "{name}", "arguments": {args}}}\n{TOOL_CALL_END}'


def partial_tag_overlap(text: str, tag: str) -> int:
    """Length of the longest proper prefix of `tag` that is a suffix of `text`."""
    for k in range(min(len(tag) - 1, len(text)), 0, -1):
        if text.endswith(tag[:k]):
            return k
    return 0


def _is_complete_json(text: str) -> bool:
    try:
        json.loads(text)
    except ValueError:
        return False
    return True


@dataclass(slots=True)
class HermesStreamParser:
    """Per-choice streaming state. Feed the full text so far; get the delta to send, or None."""

    sent_content_idx: int = 0
    names: list[str | None] = field(default_factory=list)
    streamed_args: list[str] = field(default_factory=list)
    tools_streamed: bool = False

    def feed(self, current_text: str) -> dict[str, Any] | None:
        """Returns a chat `delta` dict ({"content": ...} and/or {"tool_calls": [...]}) or None."""
        content = self._new_content(current_text)
        deltas: list[dict[str, Any]] = []
        for i, (tc_json, complete) in enumerate(self._tool_call_jsons(current_text)):
            if i >= len(self.names):
                self.names.append(None)
                self.streamed_args.append("")
            if self.names[i] is None:
                match = _NAME_RE.search(tc_json)
                if not match:
                    break  # the name of call i must go out before anything of call i+1
                self.names[i] = match.group(1)
                deltas.append(
                    {
                        "index": i,
                        "id": make_tool_call_id(),
                        "type": "function",
                        "function": {"name": match.group(1)},
                    }
                )
            args = _tool_args(tc_json, complete)
            if args is not None and len(args) > len(self.streamed_args[i]):
                deltas.append({"index": i, "function": {"arguments": args[len(self.streamed_args[i]) :]}})
                self.streamed_args[i] = args
        if deltas:
            self.tools_streamed = True
        if not content and not deltas:
            return None
        if not deltas:
            return {"content": content}
        # vLLM's DeltaMessage(content=..., tool_calls=...) keeps an explicit "content": null
        return {"content": content or None, "tool_calls": deltas}

    def finish(self, delta: dict[str, Any] | None) -> None:
        """At the last delta: vLLM (`finalize_generation`) appends the last call's unstreamed
        arguments to the delta's last tool call; for hermes that is "{}" when the call's name went
        out but none of its arguments did (a cut-off call)."""
        if not delta or not delta.get("tool_calls") or not self.names or self.streamed_args[-1]:
            return
        function = delta["tool_calls"][-1]["function"]
        function["arguments"] = function.get("arguments", "") + "{}"

    def _new_content(self, text: str) -> str | None:
        if TOOL_CALL_START in text:
            sendable = text.index(TOOL_CALL_START)
        else:
            sendable = len(text) - partial_tag_overlap(text, TOOL_CALL_START)
        if sendable > self.sent_content_idx:
            out = text[self.sent_content_idx : sendable]
            self.sent_content_idx = sendable
            return out
        return None

    @staticmethod
    def _tool_call_jsons(text: str) -> list[tuple[str, bool]]:
        out: list[tuple[str, bool]] = []
        pos = 0
        while (start := text.find(TOOL_CALL_START, pos)) != -1:
            body_start = start + len(TOOL_CALL_START)
            end = text.find(TOOL_CALL_END, body_start)
            if end != -1:
                out.append((text[body_start:end].strip(), True))
                pos = end + len(TOOL_CALL_END)
                continue
            raw = text[body_start:]
            if overlap := partial_tag_overlap(raw, TOOL_CALL_END):
                raw = raw[:-overlap]
            raw = raw.strip()
            out.append((raw, _is_complete_json(raw) if raw else False))
            break
        return out


def _tool_args(tc_json: str, complete: bool) -> str | None:
    """The raw `arguments` text of a call's JSON; for a complete call, without the closing brace
    of the outer object."""
    match = _ARGS_RE.search(tc_json)
    if not match:
        return None
    raw = tc_json[match.end() :]
    if complete:
        raw = raw.rstrip()
        if raw.endswith("}"):
            raw = raw[:-1].rstrip()
    return raw
