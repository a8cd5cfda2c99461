"""A structural checker for OpenAI Responses event streams, validated on recorded accepted streams.

`check_stream` walks the events as a state machine: response.created and response.in_progress
first; then items strictly one after another (added -> part / delta / done events -> item done);
one terminal event carrying the full response whose output equals the items streamed. Sequence
numbers, ids, indices, required fields and text consistency (deltas concatenate to done text) are
all asserted. The other Responses test modules import it.
"""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from fixture_paths import CAPTURES

RECORDED = sorted(CAPTURES.glob("*/*responses*.response-from-recorder.sse.txt"))

TERMINAL = {
    "response.completed": "completed",
    "response.incomplete": "incomplete",
    "response.failed": "failed",
}
REQUIRED = {
    "response.output_item.added": ("output_index", "item"),
    "response.output_item.done": ("output_index", "item"),
    "response.content_part.added": ("output_index", "item_id", "content_index", "part"),
    "response.content_part.done": ("output_index", "item_id", "content_index", "part"),
    "response.output_text.delta": ("output_index", "item_id", "content_index", "delta"),
    "response.output_text.done": ("output_index", "item_id", "content_index", "text"),
    "response.reasoning_summary_part.added": ("output_index", "item_id", "summary_index", "part"),
    "response.reasoning_summary_part.done": ("output_index", "item_id", "summary_index", "part"),
    "response.reasoning_summary_text.delta": ("output_index", "item_id", "summary_index", "delta"),
    "response.reasoning_summary_text.done": ("output_index", "item_id", "summary_index", "text"),
    "response.reasoning_text.delta": ("output_index", "item_id", "content_index", "delta"),
    "response.reasoning_text.done": ("output_index", "item_id", "content_index", "text"),
    "response.function_call_arguments.delta": ("output_index", "item_id", "delta"),
    "response.function_call_arguments.done": ("output_index", "item_id", "arguments"),
}
# part-level events per item kind: (part added, delta, text done, part done, index key)
PART_EVENTS = {
    "message": (
        "response.content_part.added",
        "response.output_text.delta",
        "response.output_text.done",
        "response.content_part.done",
        "content_index",
    ),
    "reasoning": (
        "response.reasoning_summary_part.added",
        "response.reasoning_summary_text.delta",
        "response.reasoning_summary_text.done",
        "response.reasoning_summary_part.done",
        "summary_index",
    ),
}


def parse_sse(raw: bytes | str) -> list[tuple[str | None, dict[str, Any]]]:
    """SSE text -> [(event name or None, data object)], in order."""
    text = raw.decode() if isinstance(raw, bytes) else raw
    events = []
    for block in text.replace("\r\n", "\n").split("\n\n"):
        name, data = None, []
        for line in block.split("\n"):
            if line.startswith("event:"):
                name = line[6:].strip()
            elif line.startswith("data:"):
                data.append(line[5:].lstrip(" "))
        if data:
            events.append((name, json.loads("\n".join(data))))
    return events


@dataclass
class _Open:
    item: dict[str, Any]
    index: int
    parts: list[str] = field(default_factory=list)  # finished part texts
    part_open: bool = False
    deltas: list[str] = field(default_factory=list)
    text_done: str | None = None
    args_done: str | None = None


@dataclass
class StreamResult:
    response: dict[str, Any]
    items: list[dict[str, Any]]
    types: list[str]


def _fail(msg: str, event: dict[str, Any]) -> None:
    raise AssertionError(f"{msg}: {json.dumps(event)[:400]}")


def _check_envelope(resp: Any, event: dict[str, Any], status: str, resp_id: str | None) -> None:
    if not isinstance(resp, dict) or resp.get("object") != "response":
        _fail("event needs a response object", event)
    if not str(resp.get("id", "")).startswith("resp_") or (resp_id and resp["id"] != resp_id):
        _fail("response id missing or changed", event)
    if resp.get("status") != status or not isinstance(resp.get("output"), list):
        _fail(f"response status should be {status!r} with an output list", event)
    for key in ("created_at", "model"):
        if key not in resp:
            _fail(f"response lacks {key}", event)


def _check_usage(usage: Any, event: dict[str, Any]) -> None:
    keys = ("input_tokens", "output_tokens", "total_tokens")
    if not isinstance(usage, dict) or not all(isinstance(usage.get(k), int) for k in keys):
        _fail("usage needs integer input/output/total tokens", event)
    if usage["total_tokens"] != usage["input_tokens"] + usage["output_tokens"]:
        _fail("usage total != input + output", event)
    if "cached_tokens" not in usage.get("input_tokens_details", {}):
        _fail("usage lacks input_tokens_details.cached_tokens", event)
    if "reasoning_tokens" not in usage.get("output_tokens_details", {}):
        _fail("usage lacks output_tokens_details.reasoning_tokens", event)


def _on_added(ev: dict[str, Any], done: list[dict[str, Any]], seen_ids: set[str]) -> _Open:
    item = ev["item"]
    if ev["output_index"] != len(done):
        _fail("output_index must count items in order", ev)
    if not isinstance(item.get("id"), str) or item["id"] in seen_ids:
        _fail("item id missing or reused", ev)
    seen_ids.add(item["id"])
    kind = item.get("type")
    if kind == "message":
        if (
            item.get("role") != "assistant"
            or item.get("content") != []
            or item.get("status") != "in_progress"
        ):
            _fail("added message must be an empty in_progress assistant message", ev)
    elif kind == "function_call":
        if not item.get("call_id") or not item.get("name") or item.get("arguments") != "":
            _fail("added function_call needs call_id, name and empty arguments", ev)
    elif kind == "reasoning":
        if item.get("summary") != []:
            _fail("added reasoning item must have an empty summary", ev)
    else:
        _fail(f"unexpected item type {kind!r}", ev)
    return _Open(item=item, index=ev["output_index"])


def _on_part_event(kind: str, op: _Open, ev: dict[str, Any]) -> None:
    added, delta, text_done, part_done, key = PART_EVENTS[op.item["type"]]
    if ev[key] != len(op.parts):
        _fail(f"{key} must count parts in order", ev)
    if kind == added:
        if op.part_open or ev["part"].get("text") != "":
            _fail("part added twice or not empty", ev)
        op.part_open, op.deltas, op.text_done = True, [], None
    elif kind == delta:
        if not op.part_open or op.text_done is not None or not isinstance(ev["delta"], str):
            _fail("delta outside an open part", ev)
        op.deltas.append(ev["delta"])
    elif kind == text_done:
        if not op.part_open or ev["text"] != "".join(op.deltas):
            _fail("done text differs from the deltas", ev)
        op.text_done = ev["text"]
    elif kind == part_done:
        if op.text_done is None or ev["part"].get("text") != op.text_done:
            _fail("part done before its text done, or with other text", ev)
        op.parts.append(op.text_done)
        op.part_open = False
    else:
        _fail(f"{kind} does not belong in a {op.item['type']} item", ev)


def _on_item_done(op: _Open, ev: dict[str, Any]) -> dict[str, Any]:
    item = ev["item"]
    if ev["output_index"] != op.index or item.get("id") != op.item["id"] or item["type"] != op.item["type"]:
        _fail("item done does not match the open item", ev)
    if op.part_open:
        _fail("item done with a part still open", ev)
    kind = item["type"]
    if kind == "message":
        if [c.get("text") for c in item.get("content", [])] != op.parts or not op.parts:
            _fail("message content differs from the streamed parts", ev)
        if any(c.get("type") != "output_text" or c.get("annotations") != [] for c in item["content"]):
            _fail("message parts must be output_text with annotations", ev)
    elif kind == "reasoning":
        if [s.get("text") for s in item.get("summary", [])] != op.parts:
            _fail("reasoning summary differs from the streamed parts", ev)
    else:
        if op.args_done is None or item.get("arguments") != op.args_done:
            _fail("function_call done without matching arguments.done", ev)
        if item.get("call_id") != op.item["call_id"] or item.get("name") != op.item["name"]:
            _fail("function_call changed call_id or name", ev)
    if kind != "reasoning" and item.get("status") not in ("completed", "incomplete"):
        _fail("item done needs status completed or incomplete", ev)
    return item


def check_stream(events: list[tuple[str | None, dict[str, Any]]]) -> StreamResult:
    """Assert the Responses event grammar; return the terminal response and the items."""
    assert len(events) >= 3, "a stream has at least created, in_progress and a terminal event"
    types = []
    for i, (name, ev) in enumerate(events):
        if not isinstance(ev.get("type"), str) or (name is not None and name != ev["type"]):
            _fail("event type missing or different from the SSE event name", ev)
        if ev.get("sequence_number") != i:
            _fail(f"sequence_number should be {i}", ev)
        for key in REQUIRED.get(ev["type"], ()):
            if key not in ev:
                _fail(f"{ev['type']} lacks {key}", ev)
        types.append(ev["type"])
    first, second, last = events[0][1], events[1][1], events[-1][1]
    if types[:2] != ["response.created", "response.in_progress"]:
        _fail("stream must open with response.created, response.in_progress", first)
    _check_envelope(first["response"], first, "in_progress", None)
    resp_id = first["response"]["id"]
    _check_envelope(second["response"], second, "in_progress", resp_id)
    if last["type"] not in TERMINAL or any(t in TERMINAL for t in types[:-1]):
        _fail("exactly one terminal event, at the end", last)
    done: list[dict[str, Any]] = []
    seen_ids: set[str] = set()
    op: _Open | None = None
    for _, ev in events[2:-1]:
        kind = ev["type"]
        if kind == "response.output_item.added":
            if op is not None:
                _fail("item added while another is open", ev)
            op = _on_added(ev, done, seen_ids)
            continue
        if op is None:
            _fail(f"{kind} outside an item", ev)
        if ev["output_index"] != op.index or ev.get("item_id", op.item["id"]) != op.item["id"]:
            _fail("event refers to another item", ev)
        if kind == "response.output_item.done":
            done.append(_on_item_done(op, ev))
            op = None
        elif kind == "response.function_call_arguments.delta" and op.item["type"] == "function_call":
            op.deltas.append(ev["delta"])
        elif kind == "response.function_call_arguments.done" and op.item["type"] == "function_call":
            if ev["arguments"] != "".join(op.deltas):
                _fail("arguments done differ from the deltas", ev)
            op.args_done = ev["arguments"]
        elif op.item["type"] in PART_EVENTS:
            _on_part_event(kind, op, ev)
        else:
            _fail(f"unexpected {kind} in a function_call item", ev)
    status = TERMINAL[last["type"]]
    resp = last["response"]
    _check_envelope(resp, last, status, resp_id)
    if status != "failed" and op is not None:
        _fail("stream ended with an item still open", last)
    if resp["output"] != done:
        _fail("final output differs from the streamed items", last)
    if status == "failed":
        if not resp.get("error", {}).get("message") or not resp["error"].get("code"):
            _fail("failed response needs error code and message", last)
    else:
        _check_usage(resp.get("usage"), last)
    if status == "incomplete" and not (resp.get("incomplete_details") or {}).get("reason"):
        _fail("incomplete response needs incomplete_details.reason", last)
    return StreamResult(response=resp, items=done, types=types)


# --- the checker on streams real CLIs accepted ---------------------------------------------------


def test_recorded_streams_exist():
    assert len(RECORDED) == 5, RECORDED


@pytest.mark.parametrize("path", RECORDED, ids=lambda p: f"{p.parent.name}/{p.name[:20]}")
def test_recorded_accepted_streams_pass(path: Path):
    result = check_stream(parse_sse(path.read_text()))
    assert result.response["status"] == "completed"
    assert [i["type"] for i in result.items] in (["message"], ["function_call"])


def _recorded(kind: str) -> list[tuple[str | None, dict[str, Any]]]:
    path = next(p for p in RECORDED if "codex" in str(p) and (kind in p.name))
    return parse_sse(path.read_text())


def _renumber(events):
    for i, (_, ev) in enumerate(events):
        ev["sequence_number"] = i
    return events


@pytest.mark.parametrize(
    ("name", "mutate"),
    [
        (
            "missing content_part.added",
            lambda ev: _renumber([e for e in ev if "content_part.added" not in e[0]]),
        ),
        ("sequence gap", lambda ev: ev[:3] + ev[4:]),
        (
            "delta text differs from done",
            lambda ev: [*ev[:4], (ev[4][0], {**ev[4][1], "delta": "x"}), *ev[5:]],
        ),
        ("no terminal event", lambda ev: ev[:-1]),
        ("item never closed", lambda ev: _renumber([e for e in ev if e[0] != "response.output_item.done"])),
        ("final output differs", lambda ev: [*ev[:-1], (ev[-1][0], _with_output(ev[-1][1], []))]),
        ("event name mismatch", lambda ev: [("response.foo", ev[0][1]), *ev[1:]]),
    ],
)
def test_checker_rejects_broken_text_stream(name, mutate):
    events = copy.deepcopy(_recorded("call2"))
    check_stream(events)
    with pytest.raises(AssertionError):
        check_stream(mutate(copy.deepcopy(events)))


def _with_output(resp_event: dict[str, Any], output: list) -> dict[str, Any]:
    ev = copy.deepcopy(resp_event)
    ev["response"]["output"] = output
    return ev


def test_checker_rejects_function_call_without_arguments_done():
    events = [e for e in _recorded("call1") if e[0] != "response.function_call_arguments.done"]
    with pytest.raises(AssertionError, match="arguments"):
        check_stream(_renumber(events))
