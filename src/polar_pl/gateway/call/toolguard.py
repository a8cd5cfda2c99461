"""Tool calls reach the harness only if they are calls to one of the request's tools.

The engine's hermes parser (like vLLM's) streams a call's name as soon as `"name": "..."`
appears and its arguments verbatim, so a small model's broken output — a name holding newlines
and `<tool_call>`, arguments that are not JSON — went to the harness as real tool calls, and
nothing in the record said so. The guard holds each call's deltas back until the stream finishes,
then passes on the calls whose name is among the request's tools and whose arguments are a JSON
object, as one delta each (renumbered), and drops the others with a note for the record. A
response whose calls were all dropped ends as a plain stop. The record keeps what was sampled.
"""

from __future__ import annotations

import json
from typing import Any


class ToolCallGuard:
    """Per call (one choice). `filter` each engine chunk; `finish_reason` maps the final reason."""

    def __init__(self, tools: list[dict[str, Any]] | None) -> None:
        self.allowed = {(t.get("function") or {}).get("name") for t in tools or () if isinstance(t, dict)} - {
            None
        }
        self.calls: dict[int, dict[str, Any]] = {}  # engine index -> {id, name, arguments}
        self.notes: list[str] = []
        self.passed = 0

    def filter(self, chunk: dict[str, Any]) -> list[dict[str, Any]]:
        """The chunks to hand the harness's translator instead of `chunk`: itself without tool-call
        deltas, preceded at the finish by one chunk with the calls that passed."""
        choices = chunk.get("choices")
        if not choices or not any(
            c.get("finish_reason") or (c.get("delta") or {}).get("tool_calls") for c in choices
        ):
            return [chunk]  # nothing to hold back or map (most chunks): the chunk itself, no copy
        out_choices = []
        flush: list[dict[str, Any]] | None = None
        for choice in choices:
            delta = choice.get("delta") or {}
            if delta.get("tool_calls"):
                for d in delta["tool_calls"]:
                    self._hold(d)
                delta = {k: v for k, v in delta.items() if k != "tool_calls"}
                choice = {**choice, "delta": delta}
            if choice.get("finish_reason"):
                flush = self._release()
                choice = {**choice, "finish_reason": self.finish_reason(choice["finish_reason"])}
            out_choices.append(choice)
        out = []
        if flush:
            base = {k: v for k, v in chunk.items() if k not in ("choices", "usage")}
            out.append(
                {**base, "choices": [{"index": 0, "delta": {"tool_calls": flush}, "finish_reason": None}]}
            )
        out.append({**chunk, "choices": out_choices})
        return out

    def finish_reason(self, reason: str | None) -> str | None:
        """The reason the harness is told: no valid call left means a plain stop."""
        if reason == "tool_calls" and not self.passed:
            return "stop"
        return reason

    def filter_message(self, message: dict[str, Any]) -> dict[str, Any]:
        """A non-streaming assistant message with only the valid calls."""
        for i, call in enumerate(message.get("tool_calls") or ()):
            fn = call.get("function") or {}
            self.calls[i] = {
                "id": call.get("id"),
                "name": fn.get("name"),
                "arguments": fn.get("arguments") or "",
            }
        kept = self._release()
        message = {k: v for k, v in message.items() if k != "tool_calls"}
        if kept:
            message["tool_calls"] = [
                {"id": c["id"], "type": "function", "function": c["function"]} for c in kept
            ]
        return message

    def _hold(self, d: dict[str, Any]) -> None:
        call = self.calls.setdefault(d.get("index", 0), {"id": None, "name": "", "arguments": ""})
        fn = d.get("function") or {}
        call["id"] = call["id"] or d.get("id")
        call["name"] += fn.get("name") or ""
        call["arguments"] += fn.get("arguments") or ""

    def _release(self) -> list[dict[str, Any]]:
        kept: list[dict[str, Any]] = []
        for i in sorted(self.calls):
            call = self.calls[i]
            problem = self._problem(call)
            if problem:
                self.notes.append(f"malformed tool call dropped: {problem}")
                continue
            kept.append(
                {
                    "index": len(kept),
                    "id": call["id"],
                    "type": "function",
                    "function": {"name": call["name"], "arguments": call["arguments"]},
                }
            )
        self.calls = {}
        self.passed += len(kept)
        return kept

    def _problem(self, call: dict[str, Any]) -> str | None:
        name = call["name"]
        if name not in self.allowed:
            return f"name {name[:80]!r} is not among the request's tools"
        if not call["arguments"]:
            # the stream parser sends a name before its arguments: none means the call's JSON was
            # cut or broken before `"arguments"` (a well-formed call without arguments sends "{}")
            return f"arguments of {name} are missing"
        try:
            args = json.loads(call["arguments"])
        except ValueError:
            return f"arguments of {name} are not JSON: {call['arguments'][:80]!r}"
        if not isinstance(args, dict):
            return f"arguments of {name} are not a JSON object"
        return None
