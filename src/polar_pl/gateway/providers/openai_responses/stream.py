"""OpenAI Responses streams: engine chat chunks -> the item grammar of the real API.

Every item is opened with `response.output_item.added`, filled by its delta events, closed by its
done events and `response.output_item.done` before the next item opens (Pi and OpenCode track one
open item at a time), and the stream ends with `response.completed` (`response.incomplete` when
the token limit cut it, `response.failed` on an engine error) carrying the full response object.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import orjson

from polar_pl.gateway.providers.base import NormalizedRequest
from polar_pl.gateway.providers.openai_responses.response import (
    convert_usage,
    envelope,
    error_code,
    final_status,
    function_call_item,
    message_item,
    new_id,
    output_text_part,
    reasoning_item,
)


@dataclass(slots=True)
class _OpenItem:
    """The one output item currently being streamed."""

    kind: str  # reasoning | message | function_call
    item_id: str
    output_index: int
    parts: list[str] = field(default_factory=list)  # text / argument deltas sent so far
    call_id: str = ""
    name: str = ""
    engine_index: int = -1  # the chat tool_calls index this function call streams
    announced: bool = True  # output_item.added sent (a call waits until its name is known)
    held: list[str] = field(default_factory=list)  # argument pieces that came before the name


class ResponsesStreamTranslator:
    """Per-stream state: engine chat chunks -> Responses SSE events."""

    def __init__(self, req: NormalizedRequest) -> None:
        self._req = req
        self._id = new_id("resp")
        self._created = int(time.time())
        self._seq = 0
        self._items: list[dict[str, Any]] = []
        self._open: _OpenItem | None = None
        self._seen_calls: set[int] = set()
        self._finish_reason: str | None = None
        self._usage: dict[str, Any] | None = None
        self._started = False
        self._ended = False
        self._failed = False
        self.anomalies: list[str] = []  # engine chunks the grammar could not place

    # -- contract --

    def start(self) -> bytes:
        if self._started:
            return b""
        self._started = True
        # The opening snapshots leave out the echoed tools and instructions (tens of KB for Codex,
        # stored with every record); the terminal response carries them. Every recorded CLI
        # accepted streams whose snapshots had neither.
        resp = {**self._envelope("in_progress", [], None), "tools": [], "instructions": None}
        return self._event("response.created", response=resp) + self._event(
            "response.in_progress", response=resp
        )

    def feed(self, chunk: dict[str, Any]) -> bytes:
        if self._ended:
            return b""
        out = [self.start()]
        if chunk.get("usage"):
            self._usage = chunk["usage"]
        for choice in chunk.get("choices") or ():
            if choice.get("index", 0) != 0:
                continue
            delta = choice.get("delta") or {}
            reasoning = delta.get("reasoning_content") or delta.get("reasoning")
            if reasoning:
                self._delta("reasoning", reasoning, out)
            if delta.get("content"):
                self._delta("message", delta["content"], out)
            for piece in delta.get("tool_calls") or ():
                self._tool_piece(piece, out)
            if choice.get("finish_reason"):
                self._finish_reason = choice["finish_reason"]
        return b"".join(out)

    def finish(self, finish_reason: str | None, usage: dict[str, Any]) -> bytes:
        if self._ended:
            return b""
        out = [self.start()]
        status, incomplete = final_status(finish_reason or self._finish_reason)
        if not self._items and self._open is None:
            self._open_item("message", out)  # the API always answers with at least a message
        self._close(out, "incomplete" if incomplete else "completed")
        self._ended = True
        resp = self._envelope(status, self._items, convert_usage(usage or self._usage), incomplete)
        kind = "response.completed" if status == "completed" else "response.incomplete"
        out.append(self._event(kind, response=resp))
        return b"".join(out)

    def error(self, status: int, message: str) -> bytes:
        if self._failed:  # (after finish: it replaces the finish events, which were not sent)
            return b""
        out = [self.start()]
        self._close(out, "incomplete")
        self._ended = self._failed = True
        err = {"code": error_code(status, message) or "server_error", "message": message}
        resp = self._envelope("failed", self._items, None, error=err)
        out.append(self._event("response.failed", response=resp))
        return b"".join(out)

    # -- items --

    def _delta(self, kind: str, text: str, out: list[bytes]) -> None:
        item = self._open if self._open is not None and self._open.kind == kind else None
        if item is None:
            self._close(out, "completed")
            item = self._open_item(kind, out)
        item.parts.append(text)
        if kind == "reasoning":
            out.append(self._event("response.reasoning_summary_text.delta", **self._where(item), delta=text))
        else:
            out.append(
                self._event("response.output_text.delta", **self._where(item), delta=text, logprobs=[])
            )

    def _tool_piece(self, piece: dict[str, Any], out: list[bytes]) -> None:
        index = piece.get("index", 0)
        fn = piece.get("function") or {}
        item = self._open
        if item is None or item.kind != "function_call" or item.engine_index != index:
            if index in self._seen_calls:
                self.anomalies.append(f"tool call {index} resumed after a later item began; piece dropped")
                return
            self._close(out, "completed")
            item = self._open_item("function_call", out, engine_index=index)
        args = fn.get("arguments") or ""
        if not item.announced:
            item.call_id = piece.get("id") or item.call_id
            item.name = fn.get("name") or item.name
            if not item.name:
                item.held.append(args)
                return
            self._announce(item, out)
            args = "".join(item.held) + args
            item.held.clear()
        if args:
            item.parts.append(args)
            out.append(self._event("response.function_call_arguments.delta", **self._where(item), delta=args))

    def _open_item(self, kind: str, out: list[bytes], engine_index: int = -1) -> _OpenItem:
        prefix = {"reasoning": "rs", "message": "msg", "function_call": "fc"}[kind]
        item = _OpenItem(kind, new_id(prefix), len(self._items), engine_index=engine_index)
        self._open = item
        if kind == "function_call":
            item.announced = False
            self._seen_calls.add(engine_index)
            return item
        if kind == "reasoning":
            self._added(reasoning_item(item.item_id, None), item, out)
            part = {"type": "summary_text", "text": ""}
            out.append(self._event("response.reasoning_summary_part.added", **self._where(item), part=part))
        else:
            self._added(message_item(item.item_id, None, "in_progress"), item, out)
            part = output_text_part("")
            out.append(self._event("response.content_part.added", **self._where(item), part=part))
        return item

    def _announce(self, item: _OpenItem, out: list[bytes]) -> None:
        item.call_id = item.call_id or new_id("call")
        item.announced = True
        self._added(function_call_item(item.item_id, item.call_id, item.name, "", "in_progress"), item, out)

    def _added(self, body: dict[str, Any], item: _OpenItem, out: list[bytes]) -> None:
        out.append(self._event("response.output_item.added", output_index=item.output_index, item=body))

    def _close(self, out: list[bytes], status: str) -> None:
        """Send the open item's done events and output_item.done; record the finished item."""
        item, self._open = self._open, None
        if item is None:
            return
        text = "".join(item.parts)
        where = self._where(item)
        if item.kind == "reasoning":
            done = reasoning_item(item.item_id, text)
            out.append(self._event("response.reasoning_summary_text.done", **where, text=text))
            out.append(self._event("response.reasoning_summary_part.done", **where, part=done["summary"][0]))
        elif item.kind == "message":
            done = message_item(item.item_id, text, status)
            out.append(self._event("response.output_text.done", **where, text=text, logprobs=[]))
            out.append(self._event("response.content_part.done", **where, part=done["content"][0]))
        else:
            if not item.announced:
                self.anomalies.append(f"tool call {item.engine_index} ended without a name")
                self._announce(item, out)
                text = "".join(item.held)
                if text:
                    out.append(self._event("response.function_call_arguments.delta", **where, delta=text))
            done = function_call_item(item.item_id, item.call_id, item.name, text, status)
            out.append(self._event("response.function_call_arguments.done", **where, arguments=text))
        out.append(self._event("response.output_item.done", output_index=item.output_index, item=done))
        self._items.append(done)

    # -- wire --

    def _where(self, item: _OpenItem) -> dict[str, Any]:
        where: dict[str, Any] = {"item_id": item.item_id, "output_index": item.output_index}
        if item.kind == "message":
            where["content_index"] = 0
        elif item.kind == "reasoning":
            where["summary_index"] = 0
        return where

    def _envelope(
        self,
        status: str,
        output: list[dict[str, Any]],
        usage: dict[str, Any] | None,
        incomplete: dict[str, str] | None = None,
        error: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        return envelope(self._req, self._id, self._created, status, output, usage, incomplete, error)

    def _event(self, kind: str, **data: Any) -> bytes:
        data["type"] = kind
        data["sequence_number"] = self._seq
        self._seq += 1
        return b"event: " + kind.encode() + b"\ndata: " + orjson.dumps(data) + b"\n\n"
